package tokenservice

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"
)

const testAudience = "keyward.dev/registry"

// jwt makes a token shaped like a service-account JWT (the signature is
// not checked here: the fake apiserver below decides).
func jwt(t *testing.T, aud any, exp time.Time) string {
	t.Helper()
	return jwtClaimsOf(t, map[string]any{"aud": aud, "sub": "system:serviceaccount:team-a:puller"}, exp)
}

// podJWT is a token whose claims bind it to pod team-a/app of uid.
func podJWT(t *testing.T, exp time.Time, uid string) string {
	t.Helper()
	return jwtClaimsOf(t, map[string]any{"aud": []string{testAudience}, "sub": "system:serviceaccount:team-a:puller",
		"kubernetes.io": map[string]any{"namespace": "team-a", "pod": map[string]any{"name": "app", "uid": uid}}}, exp)
}

func jwtClaimsOf(t *testing.T, claims map[string]any, exp time.Time) string {
	t.Helper()
	if !exp.IsZero() {
		claims["exp"] = exp.Unix()
	}
	b, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc(b) + ".c2ln"
}

// fakeAPI answers TokenReviews from a table of tokens.
type fakeAPI struct {
	client  *fake.Clientset
	answers map[string]authnv1.TokenReviewStatus
	reviews atomic.Int32
	// block, if set, holds every TokenReview until it is closed; entered
	// gets a value as each one starts.
	block   chan struct{}
	entered chan struct{}
	err     error
}

func newFakeAPI(objects ...kruntime.Object) *fakeAPI {
	f := &fakeAPI{answers: map[string]authnv1.TokenReviewStatus{}}
	f.client = fake.NewClientset(objects...)
	f.client.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		f.reviews.Add(1)
		if f.entered != nil {
			f.entered <- struct{}{}
		}
		if f.block != nil {
			<-f.block
		}
		if f.err != nil {
			return true, nil, f.err
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		tr.Status = f.answers[tr.Spec.Token]
		return true, tr, nil
	})
	return f
}

func boundStatus(ns, sa, pod, uid string) authnv1.TokenReviewStatus {
	return authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{testAudience},
		User: authnv1.UserInfo{Username: "system:serviceaccount:" + ns + ":" + sa, Extra: map[string]authnv1.ExtraValue{
			extraPodName: {pod}, extraPodUID: {uid}, extraNodeName: {"node-1"}}}}
}

func testPod(ns, name, uid string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "puller"}, Status: corev1.PodStatus{Phase: phase}}
}

func testSA(ns, name string, annotations map[string]string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations}}
}

func newTestReviewer(t *testing.T, api *fakeAPI, ttl time.Duration, clk *clocktesting.FakeClock) *KubeReviewer {
	t.Helper()
	r, err := NewReviewer(ReviewerOptions{Client: api.client, Audience: testAudience, CacheTTL: ttl, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestReviewerRefusals(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	exp := clk.Now().Add(time.Hour)
	ok := jwt(t, []string{testAudience}, exp)
	cases := []struct {
		name       string
		token      string
		status     authnv1.TokenReviewStatus
		objects    []kruntime.Object
		wantReason string
		wantInMsg  string
		wantAsked  bool // a TokenReview was made
	}{
		{name: "a token that is not a JWT is refused without asking the apiserver",
			token: "not-a-jwt", wantReason: ReasonMalformed},
		{name: "a token longer than any service-account token is refused without asking",
			token: strings.Repeat("a", MaxTokenBytes+1), wantReason: ReasonMalformed},
		{name: "a token for another audience is refused without asking, naming both audiences",
			token: jwt(t, "https://kubernetes.default.svc", exp), wantReason: ReasonWrongAudience, wantInMsg: "https://kubernetes.default.svc"},
		{name: "an expired token is refused without asking",
			token: jwt(t, testAudience, clk.Now().Add(-time.Minute)), wantReason: ReasonExpired},
		{name: "an expired token's refusal gives the token service's clock, for a skewed clock",
			token: jwt(t, testAudience, clk.Now().Add(-time.Minute)), wantReason: ReasonExpired,
			wantInMsg: "clock reads " + clk.Now().UTC().Format(time.RFC3339)},
		{name: "a token without exp (a legacy Secret token) is refused without asking",
			token: jwt(t, testAudience, time.Time{}), wantReason: ReasonMalformed},
		{name: "a token the apiserver does not authenticate is refused quoting its error",
			token: ok, status: authnv1.TokenReviewStatus{Error: "invalid bearer token, square/go-jose: error in cryptographic primitive"},
			wantReason: ReasonNotAuthenticated, wantInMsg: "cryptographic primitive", wantAsked: true},
		{name: "a token the apiserver invalidated because its pod is gone is refused as PodGone",
			token: podJWT(t, exp, "uid-1"), status: authnv1.TokenReviewStatus{Error: "service account token has been invalidated"},
			wantReason: ReasonPodGone, wantInMsg: "team-a/app", wantAsked: true},
		{name: "a token the apiserver refused whose pod exists stays NotAuthenticated",
			token: podJWT(t, exp, "uid-1"), status: authnv1.TokenReviewStatus{Error: "square/go-jose: error in cryptographic primitive"},
			objects:    []kruntime.Object{testPod("team-a", "app", "uid-1", corev1.PodRunning)},
			wantReason: ReasonNotAuthenticated, wantAsked: true},
		{name: "a token authenticated for other audiences is refused",
			token: ok, status: func() authnv1.TokenReviewStatus {
				s := boundStatus("team-a", "puller", "app", "uid-1")
				s.Audiences = []string{"other"}
				return s
			}(), wantReason: ReasonWrongAudience, wantAsked: true},
		{name: "a user that is not a service account is refused",
			token: ok, status: authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{testAudience}, User: authnv1.UserInfo{Username: "alice"}},
			wantReason: ReasonNotServiceAccount, wantInMsg: "alice", wantAsked: true},
		{name: "a service-account token bound to no pod is refused",
			token: ok, status: authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{testAudience}, User: authnv1.UserInfo{Username: "system:serviceaccount:team-a:puller"}},
			wantReason: ReasonNotPodBound, wantInMsg: "team-a/puller", wantAsked: true},
		{name: "a token of a deleted pod is refused",
			token: ok, status: boundStatus("team-a", "puller", "app", "uid-1"), objects: []kruntime.Object{testSA("team-a", "puller", nil)},
			wantReason: ReasonPodGone, wantInMsg: "team-a/app", wantAsked: true},
		{name: "a token of a pod deleted and made again under its name is refused",
			token: ok, status: boundStatus("team-a", "puller", "app", "uid-1"),
			objects:    []kruntime.Object{testPod("team-a", "app", "uid-2", corev1.PodRunning), testSA("team-a", "puller", nil)},
			wantReason: ReasonPodGone, wantInMsg: "uid-2", wantAsked: true},
		{name: "a token of a finished pod is refused",
			token: ok, status: boundStatus("team-a", "puller", "app", "uid-1"),
			objects:    []kruntime.Object{testPod("team-a", "app", "uid-1", corev1.PodSucceeded), testSA("team-a", "puller", nil)},
			wantReason: ReasonPodFinished, wantInMsg: "Succeeded", wantAsked: true},
		{name: "a token whose service account is gone is refused",
			token: ok, status: boundStatus("team-a", "puller", "app", "uid-1"),
			objects:    []kruntime.Object{testPod("team-a", "app", "uid-1", corev1.PodRunning)},
			wantReason: ReasonServiceAccountGone, wantAsked: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			api := newFakeAPI(c.objects...)
			api.answers[c.token] = c.status
			r := newTestReviewer(t, api, 10*time.Second, clk)
			for range 2 {
				_, err := r.Review(t.Context(), c.token, ReviewRequest{})
				var refused *RefusedError
				if !errors.As(err, &refused) {
					t.Fatalf("error %v, want a refusal", err)
				}
				if refused.Reason != c.wantReason || !strings.Contains(refused.Message, c.wantInMsg) {
					t.Errorf("refused %s %q, want %s containing %q", refused.Reason, refused.Message, c.wantReason, c.wantInMsg)
				}
			}
			want := int32(0)
			if c.wantAsked {
				want = 2 // refusals are never cached
			}
			if got := api.reviews.Load(); got != want {
				t.Errorf("%d TokenReviews for two reviews, want %d", got, want)
			}
		})
	}
}

func TestReviewerAcceptsAPodBoundToken(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	exp := clk.Now().Add(time.Hour)
	tok := jwt(t, testAudience, exp)
	api := newFakeAPI(testPod("team-a", "app", "uid-1", corev1.PodRunning),
		testSA("team-a", "puller", map[string]string{"keyward.dev/registry-team": "blue"}))
	api.answers[tok] = boundStatus("team-a", "puller", "app", "uid-1")
	r := newTestReviewer(t, api, 10*time.Second, clk)
	metrics, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	r.o.Metrics = metrics
	rv, err := r.Review(t.Context(), tok, ReviewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := rv.Identity
	if id.Namespace != "team-a" || id.ServiceAccount != "puller" || id.PodName != "app" || id.PodUID != "uid-1" || id.NodeName != "node-1" ||
		id.Annotations["keyward.dev/registry-team"] != "blue" || !rv.Expiry.Equal(exp) {
		t.Errorf("review %+v, expiry %s", id, rv.Expiry)
	}

	// Cached for the TTL, asked again after it.
	clk.Step(9 * time.Second)
	if _, err := r.Review(t.Context(), tok, ReviewRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := api.reviews.Load(); got != 1 {
		t.Errorf("%d TokenReviews within the cache TTL, want 1", got)
	}
	if got := value(t, metrics.ReviewHits); got != 1 {
		t.Errorf("review cache hits %v, want 1", got)
	}
	clk.Step(2 * time.Second)
	if _, err := r.Review(t.Context(), tok, ReviewRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := api.reviews.Load(); got != 2 {
		t.Errorf("%d TokenReviews after the cache TTL, want 2", got)
	}
	// The pod is deleted: within the TTL the cached review answers, after
	// it the token is refused.
	if err := api.client.CoreV1().Pods("team-a").Delete(t.Context(), "app", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clk.Step(11 * time.Second)
	_, err = r.Review(t.Context(), tok, ReviewRequest{})
	var refused *RefusedError
	if !errors.As(err, &refused) || refused.Reason != ReasonPodGone {
		t.Errorf("after the pod's deletion and the TTL: %v, want a PodGone refusal", err)
	}
}

func TestConcurrentReviewsOfOneTokenShareOneFlight(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	tok := jwt(t, testAudience, clk.Now().Add(time.Hour))
	api := newFakeAPI(testPod("team-a", "app", "uid-1", corev1.PodRunning), testSA("team-a", "puller", nil))
	api.answers[tok] = boundStatus("team-a", "puller", "app", "uid-1")
	api.block, api.entered = make(chan struct{}), make(chan struct{}, 10)
	// No cache: a review started after the first would ask again.
	r := newTestReviewer(t, api, 0, clk)
	const callers = 5
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() {
			_, err := r.Review(t.Context(), tok, ReviewRequest{})
			errs <- err
		})
	}
	<-api.entered
	// Release the apiserver once every caller waits for a review (one
	// shared flight, or, were sharing broken, one each).
	for {
		r.mu.Lock()
		n := r.waiting
		r.mu.Unlock()
		if n == callers {
			break
		}
		if t.Context().Err() != nil {
			t.Fatal("the callers never all waited")
		}
		runtime.Gosched()
	}
	close(api.block)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := api.reviews.Load(); got != 1 {
		t.Errorf("%d TokenReviews for %d concurrent reviews of one token, want 1", got, callers)
	}
}

func TestAMissingTokenReviewGrantIsNamedAndLoggedOnce(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	tok := jwt(t, testAudience, clk.Now().Add(time.Hour))
	api := newFakeAPI()
	api.err = apierrors.NewForbidden(schema.GroupResource{Group: "authentication.k8s.io", Resource: "tokenreviews"}, "",
		errors.New(`User "system:serviceaccount:keyward:keyward-token-service" cannot create resource "tokenreviews"`))
	r := newTestReviewer(t, api, 10*time.Second, clk)
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{})
	ctx := klog.NewContext(t.Context(), logger)
	for range 3 {
		_, err := r.Review(ctx, tok, ReviewRequest{})
		var missing *MissingGrantError
		if !errors.Is(err, ErrUnavailable) || !errors.As(err, &missing) || !strings.Contains(missing.Grant, "tokenreviews") {
			t.Fatalf("error %v, want ErrUnavailable and a MissingGrantError naming tokenreviews", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 1 || !strings.Contains(lines[0], "tokenreviews") {
		t.Errorf("logged %q, want one line naming the grant", lines)
	}
}

// TestAForgedTokenLearnsNothingAboutPods: the claims of a token the
// apiserver did not authenticate are the caller's own words. The pod they
// name is looked up only when the apiserver says the token was
// invalidated (a genuine token whose pod is gone); a forged token naming
// another namespace's pod must not tell an unauthenticated caller whether
// that pod exists, nor its UID.
func TestAForgedTokenLearnsNothingAboutPods(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	forged := jwtClaimsOf(t, map[string]any{"aud": []string{testAudience}, "sub": "system:serviceaccount:team-b:default",
		"kubernetes.io": map[string]any{"namespace": "team-b", "pod": map[string]any{"name": "db", "uid": "guess"}}}, clk.Now().Add(time.Hour))
	for _, c := range []struct {
		name    string
		objects []kruntime.Object
	}{
		{name: "a forged token naming a pod that does not exist"},
		{name: "a forged token naming a pod that exists under another uid", objects: []kruntime.Object{testPod("team-b", "db", "secret-uid-7", corev1.PodRunning)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			api := newFakeAPI(c.objects...)
			api.answers[forged] = authnv1.TokenReviewStatus{Error: "invalid bearer token, square/go-jose: error in cryptographic primitive"}
			r := newTestReviewer(t, api, 10*time.Second, clk)
			_, err := r.Review(t.Context(), forged, ReviewRequest{})
			var refused *RefusedError
			if !errors.As(err, &refused) {
				t.Fatalf("error %v, want a refusal", err)
			}
			if refused.Reason != ReasonNotAuthenticated || strings.Contains(refused.Message, "secret-uid-7") || strings.Contains(refused.Message, "team-b/db") {
				t.Errorf("refused %s %q, want NotAuthenticated saying nothing of pod team-b/db", refused.Reason, refused.Message)
			}
			for _, a := range api.client.Actions() {
				if a.GetResource().Resource == "pods" {
					t.Errorf("the token service read pods (%s %s) for a token the apiserver did not authenticate", a.GetVerb(), a.GetNamespace())
				}
			}
		})
	}
}

// TestReviewsInFlightAreBounded: every distinct token that parses costs a
// TokenReview, and a caller needs no credential to send many. Past
// MaxConcurrentReviews reviews under way, a new token is answered
// unavailable at once instead of queueing behind the client's rate limiter
// (which the Lease renewals share) with a goroutine each.
func TestReviewsInFlightAreBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	api := newFakeAPI()
	api.block, api.entered = make(chan struct{}), make(chan struct{}, 10)
	r, err := NewReviewer(ReviewerOptions{Client: api.client, Audience: testAudience, Clock: clk, MaxConcurrentReviews: 1})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	first := jwtClaimsOf(t, map[string]any{"aud": testAudience, "n": 1}, clk.Now().Add(time.Hour))
	wg.Go(func() { _, _ = r.Review(t.Context(), first, ReviewRequest{}) })
	<-api.entered
	// A caller that has already gone: without the bound it would start a
	// flight and get its context's error; with it, it is refused before.
	gone, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = r.Review(gone, jwtClaimsOf(t, map[string]any{"aud": testAudience, "n": 2}, clk.Now().Add(time.Hour)), ReviewRequest{})
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, context.Canceled) {
		t.Errorf("a second token while one review is under way: %v, want ErrUnavailable before any review starts", err)
	}
	close(api.block)
	wg.Wait()
	for r.inFlight() > 0 {
		runtime.Gosched()
	}
	if got := api.reviews.Load(); got != 1 {
		t.Errorf("%d TokenReviews, want 1", got)
	}
}
