package awskms

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/testsupport/awskmsfake"
)

func TestClientsAreMadeOncePerRegionAndEndpointAndShared(t *testing.T) {
	srv := awskmsfake.Start(awskmsfake.Options{ReuseKeyMaterial: true})
	defer srv.Close()
	p, err := New(Options{Config: &aws.Config{Credentials: credentials.NewStaticCredentialsProvider(awskmsfake.AccessKeyID, awskmsfake.SecretAccessKey, "")}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var uris []string
	for _, region := range []string{"eu-west-1", "eu-west-1", "us-east-1", "us-east-1", "us-east-1"} {
		k, err := srv.AddKey(awskmsfake.NewKey{Region: region, KeySpec: "ECC_NIST_P256"})
		if err != nil {
			t.Fatal(err)
		}
		uris = append(uris, "awskms:key-id="+k.ARN+"?endpoint="+srv.URL())
	}
	var wg sync.WaitGroup
	signers := make([]*Signer, len(uris))
	for i, u := range uris {
		wg.Go(func() {
			s, err := p.Open(context.Background(), backends.OpenRequest{URI: u})
			if err != nil {
				t.Error(err)
				return
			}
			signers[i] = s.(*Signer)
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if n := len(p.clients); n != 2 {
		t.Errorf("%d clients for 2 regions", n)
	}
	if signers[0].client != signers[1].client || signers[2].client != signers[4].client || signers[0].client == signers[2].client {
		t.Error("signers of one region do not share a client, or signers of two regions do")
	}
	for _, s := range signers {
		if _, err := s.SignContext(context.Background(), make([]byte, 32), s.Algorithm().SignerOpts()); err != nil {
			t.Error(err)
		}
	}
	regions := map[string]int{}
	for _, r := range srv.SignRequests() {
		regions[r.Region]++
	}
	if regions["eu-west-1"] != 2 || regions["us-east-1"] != 3 {
		t.Errorf("Sign requests per region: %v", regions)
	}
}

func TestTheDefaultHTTPClientKeepsEnoughIdleConnectionsForConcurrentSigners(t *testing.T) {
	for name, hc := range map[string]aws.HTTPClient{
		"no client":          nil,
		"the SDK's default":  awshttp.NewBuildableClient(),
		"a tuned SDK client": awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) { t.MaxIdleConnsPerHost = 1000 }),
	} {
		t.Run(name, func(t *testing.T) {
			p, err := New(Options{Config: &aws.Config{HTTPClient: hc}})
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := p.loadConfig(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			tr := cfg.HTTPClient.(*awshttp.BuildableClient).GetTransport()
			if tr.MaxIdleConnsPerHost < idleConnsPerHost || (tr.MaxIdleConns != 0 && tr.MaxIdleConns < idleConnsPerHost) {
				t.Errorf("MaxIdleConnsPerHost %d, MaxIdleConns %d: want at least %d", tr.MaxIdleConnsPerHost, tr.MaxIdleConns, idleConnsPerHost)
			}
			if tr.MaxConnsPerHost != 0 && tr.MaxConnsPerHost < idleConnsPerHost {
				t.Errorf("MaxConnsPerHost %d caps concurrency", tr.MaxConnsPerHost)
			}
		})
	}
	custom := &http.Client{}
	p, _ := New(Options{Config: &aws.Config{HTTPClient: custom}})
	if cfg, _ := p.loadConfig(context.Background()); cfg.HTTPClient != custom {
		t.Error("a caller's own *http.Client was replaced")
	}
}

func TestURIsRoundTrip(t *testing.T) {
	for _, loc := range []location{
		{keyID: "1234abcd-12ab-34cd-56ef-1234567890ab", region: "eu-west-1"},
		{keyID: "arn:aws:kms:us-east-1:111122223333:key/1234abcd", region: "us-east-1", signing: "RSASSA_PSS_SHA_256"},
		{keyID: "alias/ca;x=y?z", region: "eu-west-1", endpoint: "http://127.0.0.1:8080/kms"},
	} {
		got, err := parseKeyURI("open", loc.String())
		if err != nil {
			t.Errorf("parsing %s: %v", loc, err)
			continue
		}
		if got != loc {
			t.Errorf("%s parsed as %+v, want %+v", loc, got, loc)
		}
	}
	c := location{region: "eu-west-1", description: "keyward CA; 2026 & on", endpoint: "https://kms.example"}
	got, err := parseCreateURI("create-key", c.String())
	if err != nil || got != c {
		t.Errorf("%s parsed as %+v (%v), want %+v", c, got, err, c)
	}
}

func TestEveryDefaultSigningAlgorithmIsMapped(t *testing.T) {
	for _, spec := range supportedKeySpecs() {
		s, ok := defaultSigning(spec)
		if !ok {
			t.Errorf("no default signing algorithm for %s", spec)
			continue
		}
		if _, ok := lookup(spec, s); !ok {
			t.Errorf("the default %s of %s is not mapped", s, spec)
		}
	}
}
