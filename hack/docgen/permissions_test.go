package docgen

import (
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/json"
	"regexp"
	"slices"
	"sort"
	"testing"
	"time"

	"cloud.google.com/go/kms/apiv1/kmspb"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"sigs.k8s.io/yaml"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/awskms"
	"github.com/keyward/keyward/backends/gcpkms"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/gcpkmsfake"
)

// The permissions the production guides list must be exactly what the
// backends call: each test drives the backend against the in-process KMS
// fake its own tests use, reads which API methods were called, maps them to
// the cloud's permission names and compares with the guide's block.

// gcpPermissions maps each Cloud KMS RPC to the IAM permission it needs
// (cloud.google.com/kms/docs/reference/permissions-and-roles).
var gcpPermissions = map[string]string{
	gcpkmsfake.GetCryptoKey:            "cloudkms.cryptoKeys.get",
	gcpkmsfake.GetCryptoKeyVersion:     "cloudkms.cryptoKeyVersions.get",
	gcpkmsfake.GetPublicKey:            "cloudkms.cryptoKeyVersions.viewPublicKey",
	gcpkmsfake.CreateCryptoKeyVersion:  "cloudkms.cryptoKeyVersions.create",
	gcpkmsfake.AsymmetricSign:          "cloudkms.cryptoKeyVersions.useToSign",
	gcpkmsfake.DestroyCryptoKeyVersion: "cloudkms.cryptoKeyVersions.destroy",
}

// awsActions are the AWS KMS actions the fake serves; the IAM action is
// "kms:" + the API action.
var awsActions = []string{awskmsfake.DescribeKey, awskmsfake.GetPublicKey, awskmsfake.CreateKey, awskmsfake.Sign, awskmsfake.ScheduleKeyDeletion}

// destroyCreated is what keyward ca init does with the key it created
// when the cluster then refuses the generation (backends.Destroyer).
func destroyCreated(t *testing.T, s backends.Signer) {
	t.Helper()
	if _, err := s.(backends.Destroyer).Destroy(context.Background()); err != nil {
		t.Fatalf("destroying the created key: %v", err)
	}
}

const gcpRing = "projects/keyward-docs/locations/europe-west1/keyRings/ca"

func signOnce(t *testing.T, s backends.Signer) {
	t.Helper()
	d := sha256.Sum256([]byte("keyward"))
	if _, err := s.SignContext(context.Background(), d[:], crypto.SHA256); err != nil {
		t.Fatalf("signing: %v", err)
	}
}

// gcpCalled runs do against a fresh fake and returns the permissions of
// the RPCs it made.
func gcpCalled(t *testing.T, do func(p *gcpkms.Provider, srv *gcpkmsfake.Server)) []string {
	t.Helper()
	srv, err := gcpkmsfake.Start(gcpkmsfake.Options{ReuseKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	p, err := gcpkms.New(gcpkms.Options{ClientOptions: srv.ClientOptions(), PollInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := srv.AddCryptoKey(gcpRing+"/cryptoKeys/ca", kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256); err != nil {
		t.Fatal(err)
	}
	do(p, srv)
	var perms []string
	for rpc, perm := range gcpPermissions {
		if srv.Calls(rpc) > 0 {
			perms = append(perms, perm)
		}
	}
	sort.Strings(perms)
	return perms
}

func awsCalled(t *testing.T, do func(p *awskms.Provider, srv *awskmsfake.Server)) []string {
	t.Helper()
	srv := awskmsfake.Start(awskmsfake.Options{ReuseKeyMaterial: true})
	t.Cleanup(srv.Close)
	p, err := awskms.New(awskms.Options{Config: &aws.Config{
		Credentials: credentials.NewStaticCredentialsProvider(awskmsfake.AccessKeyID, awskmsfake.SecretAccessKey, ""),
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	do(p, srv)
	var perms []string
	for _, a := range awsActions {
		if srv.Calls(a) > 0 {
			perms = append(perms, "kms:"+a)
		}
	}
	sort.Strings(perms)
	return perms
}

// guideBlock returns the fenced code block that follows the line
// "<!-- permissions:NAME -->" in docs/production/FILE.
func guideBlock(t *testing.T, file, name string) string {
	t.Helper()
	doc := readDoc(t, "production/"+file)
	re := regexp.MustCompile("(?s)<!-- permissions:" + regexp.QuoteMeta(name) + " -->\\s*```[a-z]*\\n(.*?)\\n```")
	m := re.FindStringSubmatch(doc)
	if m == nil {
		t.Fatalf("docs/production/%s has no block <!-- permissions:%s --> followed by a code block", file, name)
	}
	return m[1]
}

// gcpRolePermissions reads a custom role definition (gcloud iam roles
// create --file) and returns its includedPermissions.
func gcpRolePermissions(t *testing.T, block string) []string {
	t.Helper()
	var role struct {
		Title               string   `json:"title"`
		Description         string   `json:"description"`
		Stage               string   `json:"stage"`
		IncludedPermissions []string `json:"includedPermissions"`
	}
	if err := yaml.UnmarshalStrict([]byte(block), &role); err != nil {
		t.Fatalf("the guide's role definition does not parse: %v", err)
	}
	sort.Strings(role.IncludedPermissions)
	return role.IncludedPermissions
}

// awsPolicyActions reads an IAM or key policy document and returns the
// actions of its statements.
func awsPolicyActions(t *testing.T, block string) []string {
	t.Helper()
	var pol struct {
		Statement []struct {
			Action any `json:"Action"`
		} `json:"Statement"`
	}
	if err := json.Unmarshal([]byte(block), &pol); err != nil {
		t.Fatalf("the guide's policy does not parse: %v", err)
	}
	var out []string
	for _, s := range pol.Statement {
		switch a := s.Action.(type) {
		case string:
			out = append(out, a)
		case []any:
			for _, x := range a {
				out = append(out, x.(string))
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func TestGCPKMSGuideListsExactlyThePermissionsTheBackendUses(t *testing.T) {
	cases := []struct {
		name string // the guide's block
		do   func(t *testing.T, p *gcpkms.Provider, srv *gcpkmsfake.Server)
	}{
		{
			name: "signer", // keyward signer and token service: open the key, sign
			do: func(t *testing.T, p *gcpkms.Provider, srv *gcpkmsfake.Server) {
				v, err := srv.AddVersion(gcpRing + "/cryptoKeys/ca")
				if err != nil {
					t.Fatal(err)
				}
				s, err := p.Open(context.Background(), backends.OpenRequest{URI: "gcpkms:" + v})
				if err != nil {
					t.Fatal(err)
				}
				signOnce(t, s)
			},
		},
		{
			// keyward ca init --create-key: a new version, then the root
			// signed with it; the version destroyed if the cluster refuses
			// the generation.
			name: "ca-init",
			do: func(t *testing.T, p *gcpkms.Provider, srv *gcpkmsfake.Server) {
				s, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: "gcpkms:" + gcpRing + "/cryptoKeys/ca", Algorithm: backends.ECDSAP256SHA256})
				if err != nil {
					t.Fatal(err)
				}
				signOnce(t, s)
				destroyCreated(t, s)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := gcpCalled(t, func(p *gcpkms.Provider, srv *gcpkmsfake.Server) { tc.do(t, p, srv) })
			listed := gcpRolePermissions(t, guideBlock(t, "gcp-kms.md", tc.name))
			if !slices.Equal(got, listed) {
				t.Errorf("docs/production/gcp-kms.md block %s lists %v; the backend calls need %v", tc.name, listed, got)
			}
		})
	}
}

func TestAWSKMSGuideListsExactlyTheActionsTheBackendCalls(t *testing.T) {
	const region = "eu-west-1"
	cases := []struct {
		name string
		do   func(t *testing.T, p *awskms.Provider, srv *awskmsfake.Server)
	}{
		{
			name: "signer",
			do: func(t *testing.T, p *awskms.Provider, srv *awskmsfake.Server) {
				k, err := srv.AddKey(awskmsfake.NewKey{Region: region, KeySpec: "ECC_NIST_P256"})
				if err != nil {
					t.Fatal(err)
				}
				s, err := p.Open(context.Background(), backends.OpenRequest{URI: "awskms:key-id=" + k.ID + ";region=" + region + "?endpoint=" + srv.URL()})
				if err != nil {
					t.Fatal(err)
				}
				signOnce(t, s)
			},
		},
		{
			name: "ca-init",
			do: func(t *testing.T, p *awskms.Provider, srv *awskmsfake.Server) {
				s, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{
					URI: "awskms:region=" + region + ";description=keyward%20CA?endpoint=" + srv.URL(), Algorithm: backends.ECDSAP256SHA256})
				if err != nil {
					t.Fatal(err)
				}
				signOnce(t, s)
				destroyCreated(t, s) // when the cluster refuses the generation
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := awsCalled(t, func(p *awskms.Provider, srv *awskmsfake.Server) { tc.do(t, p, srv) })
			listed := awsPolicyActions(t, guideBlock(t, "aws-kms.md", tc.name))
			if !slices.Equal(got, listed) {
				t.Errorf("docs/production/aws-kms.md block %s lists %v; the backend calls %v", tc.name, listed, got)
			}
		})
	}
}
