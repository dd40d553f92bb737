package softhsmtests

import (
	"testing"

	"cloud.google.com/go/kms/apiv1/kmspb"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/gcpkmsfake"
)

// kmsFakes are the wire-level Cloud KMS and AWS KMS fakes of one test.
type kmsFakes struct {
	gcp *gcpkmsfake.Server
	// cryptoKey is a P-256 signing key made in gcp.
	cryptoKey string
	aws       *awskmsfake.Server
	// opts reach both fakes from a backends registry.
	opts all.Options
}

// startKMSFakes starts both fakes for the test (closed when it ends).
func startKMSFakes(t testing.TB) *kmsFakes {
	t.Helper()
	gcp, err := gcpkmsfake.Start(gcpkmsfake.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gcp.Close() })
	f := &kmsFakes{gcp: gcp, cryptoKey: "projects/keyward/locations/global/keyRings/ca/cryptoKeys/" + uniqueName(t, "k")}
	if err := gcp.AddCryptoKey(f.cryptoKey, kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256); err != nil {
		t.Fatal(err)
	}
	f.aws = awskmsfake.Start(awskmsfake.Options{})
	t.Cleanup(func() { f.aws.Close() })
	f.opts.GCPKMS.ClientOptions = gcp.ClientOptions()
	f.opts.AWSKMS.Config = &aws.Config{Credentials: credentials.NewStaticCredentialsProvider(awskmsfake.AccessKeyID, awskmsfake.SecretAccessKey, "")}
	return f
}
