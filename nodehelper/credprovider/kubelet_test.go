package credprovider_test

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
	"k8s.io/kubelet/pkg/apis/credentialprovider/install"
	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"
)

// kubeletCodecs is built the way kubelet builds its own
// (pkg/credentialprovider/plugin/plugin.go in k8s.io/kubernetes v1.37): the
// credential provider API group installed into a scheme, strict decoding.
var kubeletCodecs = func() serializer.CodecFactory {
	scheme := runtime.NewScheme()
	install.Install(scheme)
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict)
}()

// kubeletRequest encodes a request exactly as kubelet's exec plugin does: the
// internal type through the JSON serializer's encoder for v1, which sets
// kind and apiVersion and ends with a newline.
func kubeletRequest(t testing.TB, image, token string, annotations map[string]string) []byte {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(kubeletCodecs.SupportedMediaTypes(), "application/json")
	if !ok {
		t.Fatal("no JSON serializer")
	}
	enc := kubeletCodecs.EncoderForVersion(info.Serializer, credentialproviderv1.SchemeGroupVersion)
	data, err := runtime.Encode(enc, &credentialproviderapi.CredentialProviderRequest{
		Image: image, ServiceAccountToken: token, ServiceAccountAnnotations: annotations,
	})
	if err != nil {
		t.Fatalf("encoding the request as kubelet does: %v", err)
	}
	return data
}

// kubeletDecode reads a plugin's stdout as kubelet does: the apiVersion must
// equal the configured one, the body decodes strictly into the internal
// type, kind and group are checked, and the cacheKeyType must be one kubelet
// knows (otherwise it drops the response).
func kubeletDecode(data []byte) (*credentialproviderapi.CredentialProviderResponse, error) {
	gvk, err := kjson.DefaultMetaFactory.Interpret(data)
	if err != nil {
		return nil, fmt.Errorf("reading GVK: %w", err)
	}
	if got := gvk.GroupVersion().String(); got != credentialproviderv1.SchemeGroupVersion.String() {
		return nil, fmt.Errorf("apiVersion %q, kubelet expects %q", got, credentialproviderv1.SchemeGroupVersion)
	}
	obj, gvk, err := kubeletCodecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("strict decoding: %w", err)
	}
	if gvk.Kind != "CredentialProviderResponse" || gvk.Group != credentialproviderapi.GroupName {
		return nil, fmt.Errorf("unexpected %s", gvk)
	}
	resp, ok := obj.(*credentialproviderapi.CredentialProviderResponse)
	if !ok {
		return nil, fmt.Errorf("decoded %T", obj)
	}
	switch resp.CacheKeyType {
	case credentialproviderapi.ImagePluginCacheKeyType, credentialproviderapi.RegistryPluginCacheKeyType, credentialproviderapi.GlobalPluginCacheKeyType:
	default:
		return nil, fmt.Errorf("cacheKeyType %q is not valid", resp.CacheKeyType)
	}
	return resp, nil
}
