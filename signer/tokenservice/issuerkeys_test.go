package tokenservice

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeIssuer is the apiserver's OIDC discovery: a key set it serves, and
// how often it was asked.
type fakeIssuer struct {
	mu      sync.Mutex
	keys    []jose.JSONWebKey
	fail    error
	fetches atomic.Int32
}

func (f *fakeIssuer) get(_ context.Context, path string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	switch path {
	case openIDConfigPath:
		return []byte(`{"issuer":"https://kubernetes.default.svc","jwks_uri":"https://10.0.0.1/openid/v1/jwks"}`), nil
	case jwksPath:
		f.fetches.Add(1)
		return json.Marshal(jose.JSONWebKeySet{Keys: f.keys})
	}
	return nil, errors.New("not found")
}

func (f *fakeIssuer) publish(k *ecdsa.PrivateKey, kid string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, jose.JSONWebKey{Key: k.Public(), KeyID: kid, Algorithm: string(jose.ES256), Use: "sig"})
}

func newIssuerKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// signedJWT signs claims (plus exp) with key under kid, as kube-apiserver
// signs a service-account token.
func signedJWT(t *testing.T, key *ecdsa.PrivateKey, kid string, claims map[string]any, exp time.Time) string {
	t.Helper()
	claims["exp"] = exp.Unix()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: key, KeyID: kid}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := s.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := obj.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func nodeClaims(node string, n int) map[string]any {
	return map[string]any{"aud": []string{testAudience}, "sub": "system:serviceaccount:team-a:puller", "n": n,
		"kubernetes.io": map[string]any{"namespace": "team-a", "node": map[string]any{"name": node},
			"pod": map[string]any{"name": "app", "uid": "uid-1"}, "serviceaccount": map[string]any{"name": "puller"}}}
}

func newVerifyingReviewer(t *testing.T, api *fakeAPI, iss *fakeIssuer, clk *clocktesting.FakeClock, maxReviews, perClient int) *KubeReviewer {
	t.Helper()
	r, err := NewReviewer(ReviewerOptions{Client: api.client, Audience: testAudience, Clock: clk,
		Keys: &IssuerKeys{get: iss.get, clock: clk}, MaxConcurrentReviews: maxReviews, MaxReviewsPerClient: perClient})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func refusedFor(t *testing.T, err error, reason string) *RefusedError {
	t.Helper()
	var r *RefusedError
	if !errors.As(err, &r) || r.Reason != reason {
		t.Fatalf("error %v, want a %s refusal", err, reason)
	}
	return r
}

// TestForgedTokensAreRefusedBeforeAnyTokenReview: a token whose claims are
// right (audience, exp) but whose signature is not the issuer's — junk,
// another key under the issuer's kid, an unknown kid — is refused
// BadSignature without a TokenReview; a token the issuer's key signed is
// reviewed.
func TestForgedTokensAreRefusedBeforeAnyTokenReview(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	key, other := newIssuerKey(t), newIssuerKey(t)
	iss := &fakeIssuer{}
	iss.publish(key, "k1")
	api := newFakeAPI(testPod("team-a", "app", "uid-1", "Running"), testSA("team-a", "puller", nil))
	r := newVerifyingReviewer(t, api, iss, clk, 0, 0)
	exp := clk.Now().Add(time.Hour)

	good := signedJWT(t, key, "k1", nodeClaims("node-1", 0), exp)
	api.answers[good] = boundStatus("team-a", "puller", "app", "uid-1")
	if _, err := r.Review(t.Context(), good, ReviewRequest{}); err != nil {
		t.Fatalf("a token the issuer signed: %v", err)
	}
	if n := api.reviews.Load(); n != 1 {
		t.Fatalf("%d TokenReviews for the issuer's token, want 1 (a verified signature does not replace the review)", n)
	}
	parts := strings.Split(good, ".")
	for name, tok := range map[string]string{
		"a junk signature":                   parts[0] + "." + parts[1] + ".c2lnbmF0dXJlLW9mLTY0LWJ5dGVzLXh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4",
		"another key under the issuer's kid": signedJWT(t, other, "k1", nodeClaims("node-1", 1), exp),
		"an unknown kid":                     signedJWT(t, other, "k9", nodeClaims("node-1", 2), exp),
		"no kid, another key":                signedJWT(t, other, "", nodeClaims("node-1", 3), exp),
		"an HMAC token":                      jwt(t, []string{testAudience}, exp),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := r.Review(t.Context(), tok, ReviewRequest{})
			refusedFor(t, err, ReasonBadSignature)
		})
	}
	if n := api.reviews.Load(); n != 1 {
		t.Errorf("%d TokenReviews, want only the issuer's token's", n)
	}
}

// TestAnUnknownKidRefreshesTheKeysAtMostOncePerInterval: a token naming a
// kid the key set lacks fetches the keys again (the apiserver may have a
// new key), but a flood of random kids costs one fetch per MinKeyRefresh.
func TestAnUnknownKidRefreshesTheKeysAtMostOncePerInterval(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	key, rotated := newIssuerKey(t), newIssuerKey(t)
	iss := &fakeIssuer{}
	iss.publish(key, "k1")
	api := newFakeAPI(testPod("team-a", "app", "uid-1", "Running"), testSA("team-a", "puller", nil))
	r := newVerifyingReviewer(t, api, iss, clk, 0, 0)
	exp := clk.Now().Add(time.Hour)
	if _, err := r.Review(t.Context(), signedJWT(t, key, "k1", nodeClaims("node-1", 0), exp), ReviewRequest{}); err == nil || iss.fetches.Load() != 1 {
		t.Fatalf("first token: %v after %d fetches, want a refusal by the fake apiserver after one", err, iss.fetches.Load())
	}
	for i := range 50 {
		_, err := r.Review(t.Context(), signedJWT(t, rotated, "random-"+string(rune('a'+i%26)), nodeClaims("node-1", i), exp), ReviewRequest{})
		refusedFor(t, err, ReasonBadSignature)
	}
	if n := iss.fetches.Load(); n != 1 {
		t.Errorf("%d key fetches after 50 unknown kids within %s of the first, want 1", n, MinKeyRefresh)
	}
	// The apiserver's new key, seen after the interval.
	iss.publish(rotated, "k2")
	tok := signedJWT(t, rotated, "k2", nodeClaims("node-1", 99), exp)
	api.answers[tok] = boundStatus("team-a", "puller", "app", "uid-1")
	_, err := r.Review(t.Context(), tok, ReviewRequest{})
	refusedFor(t, err, ReasonBadSignature)
	clk.Step(MinKeyRefresh)
	if _, err := r.Review(t.Context(), tok, ReviewRequest{}); err != nil {
		t.Errorf("a token of the apiserver's new key, %s later: %v", MinKeyRefresh, err)
	}
	if n := iss.fetches.Load(); n != 2 {
		t.Errorf("%d key fetches, want 2 (the first, and one refresh once the interval passed)", n)
	}
}

// TestWithoutTheIssuersKeysTokensAreStillReviewed: when discovery cannot be
// read (not served, no RBAC), the apiserver's TokenReview decides alone.
func TestWithoutTheIssuersKeysTokensAreStillReviewed(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	iss := &fakeIssuer{fail: errors.New(`forbidden: User "x" cannot get path "/.well-known/openid-configuration"`)}
	api := newFakeAPI(testPod("team-a", "app", "uid-1", "Running"), testSA("team-a", "puller", nil))
	r := newVerifyingReviewer(t, api, iss, clk, 0, 0)
	tok := signedJWT(t, newIssuerKey(t), "k1", nodeClaims("node-1", 0), clk.Now().Add(time.Hour))
	api.answers[tok] = boundStatus("team-a", "puller", "app", "uid-1")
	if _, err := r.Review(t.Context(), tok, ReviewRequest{}); err != nil {
		t.Fatalf("without keys: %v, want the TokenReview's acceptance", err)
	}
}

// TestOneNodeCannotTakeEveryReviewSlot: validly signed tokens from one
// node (a compromised node can mint many) hold at most its share of the
// review slots; another node's token is still reviewed.
func TestOneNodeCannotTakeEveryReviewSlot(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	key := newIssuerKey(t)
	iss := &fakeIssuer{}
	iss.publish(key, "k1")
	api := newFakeAPI(testPod("team-a", "app", "uid-1", "Running"), testSA("team-a", "puller", nil))
	// Held outside the fake clientset, whose lock would serialize them.
	block, entered := make(chan struct{}), make(chan struct{}, 10)
	r, err := NewReviewer(ReviewerOptions{Client: &blockingReviews{Clientset: api.client, block: block, entered: entered},
		Audience: testAudience, Clock: clk, Keys: &IssuerKeys{get: iss.get, clock: clk}, MaxConcurrentReviews: 4, MaxReviewsPerClient: 2})
	if err != nil {
		t.Fatal(err)
	}
	exp := clk.Now().Add(time.Hour)
	var wg sync.WaitGroup
	for i := range 2 {
		tok := signedJWT(t, key, "k1", nodeClaims("flooder", i), exp)
		wg.Go(func() { _, _ = r.Review(t.Context(), tok, ReviewRequest{Client: "10.0.0.9:1234"}) })
		<-entered
	}
	_, err = r.Review(t.Context(), signedJWT(t, key, "k1", nodeClaims("flooder", 3), exp), ReviewRequest{Client: "10.0.0.9:1"})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "node flooder") {
		t.Errorf("the flooding node's third token: %v, want ErrUnavailable naming its share", err)
	}
	// Another node, from the same address (behind one load balancer).
	other := signedJWT(t, key, "k1", nodeClaims("node-1", 0), exp)
	api.answers[other] = boundStatus("team-a", "puller", "app", "uid-1")
	done := make(chan error, 1)
	go func() { _, err := r.Review(t.Context(), other, ReviewRequest{Client: "10.0.0.9:1"}); done <- err }()
	<-entered
	close(block)
	if err := <-done; err != nil {
		t.Errorf("another node's token while the flooder holds its share: %v", err)
	}
	wg.Wait()
	for r.inFlight() > 0 {
		runtime.Gosched()
	}
}

// TestARegistrysAudienceIsTheOnlyOneAcceptedForIt: a token for the
// default audience is refused for a registry with its own audience, and
// the other way round; the refusal of a signed token names its identity.
func TestARegistrysAudienceIsTheOnlyOneAcceptedForIt(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	key := newIssuerKey(t)
	iss := &fakeIssuer{}
	iss.publish(key, "k1")
	api := newFakeAPI(testPod("team-a", "app", "uid-1", "Running"), testSA("team-a", "puller", nil))
	r := newVerifyingReviewer(t, api, iss, clk, 0, 0)
	tok := signedJWT(t, key, "k1", nodeClaims("node-1", 0), clk.Now().Add(time.Hour))
	api.answers[tok] = boundStatus("team-a", "puller", "app", "uid-1")
	_, err := r.Review(t.Context(), tok, ReviewRequest{Audiences: []string{"keyward.dev/registry-b"}})
	e := refusedFor(t, err, ReasonWrongAudience)
	if !e.Signed || e.Identity.Namespace != "team-a" || e.Identity.ServiceAccount != "puller" || e.Identity.NodeName != "node-1" {
		t.Errorf("refusal %+v, want it signed and naming team-a/puller on node-1", e)
	}
	if _, err := r.Review(t.Context(), tok, ReviewRequest{}); err != nil {
		t.Errorf("the same token for the default audience: %v", err)
	}
	if n := api.reviews.Load(); n != 1 {
		t.Errorf("%d TokenReviews, want 1 (the wrong audience refused locally)", n)
	}
}

// blockingReviews holds every TokenReview until block is closed, telling
// entered as each starts.
type blockingReviews struct {
	*fake.Clientset
	block, entered chan struct{}
}

func (b *blockingReviews) AuthenticationV1() authenticationv1client.AuthenticationV1Interface {
	return blockingAuthn{b.Clientset.AuthenticationV1(), b}
}

type blockingAuthn struct {
	authenticationv1client.AuthenticationV1Interface
	b *blockingReviews
}

func (a blockingAuthn) TokenReviews() authenticationv1client.TokenReviewInterface {
	return blockingTokenReviews{a.AuthenticationV1Interface.TokenReviews(), a.b}
}

type blockingTokenReviews struct {
	authenticationv1client.TokenReviewInterface
	b *blockingReviews
}

func (r blockingTokenReviews) Create(ctx context.Context, tr *authnv1.TokenReview, o metav1.CreateOptions) (*authnv1.TokenReview, error) {
	r.b.entered <- struct{}{}
	<-r.b.block
	return r.TokenReviewInterface.Create(ctx, tr, o)
}
