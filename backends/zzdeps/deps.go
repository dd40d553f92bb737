// Package zzdeps is temporary: it holds KMS SDK requirements in go.mod while the KMS backends are written.
package zzdeps

import (
	_ "cloud.google.com/go/kms/apiv1"
	_ "cloud.google.com/go/kms/apiv1/kmspb"
	_ "github.com/aws/aws-sdk-go-v2/aws"
	_ "github.com/aws/aws-sdk-go-v2/config"
	_ "github.com/aws/aws-sdk-go-v2/credentials"
	_ "github.com/aws/aws-sdk-go-v2/service/kms"
	_ "github.com/aws/smithy-go"
	_ "github.com/googleapis/gax-go/v2"
	_ "google.golang.org/api/option"
	_ "google.golang.org/grpc"
	_ "google.golang.org/grpc/codes"
	_ "google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/status"
	_ "google.golang.org/grpc/test/bufconn"
	_ "google.golang.org/protobuf/types/known/wrapperspb"
)
