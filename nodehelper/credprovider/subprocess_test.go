package credprovider_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// keywardBinary is the keyward binary the subprocess tests run, as kubelet
// would: KEYWARD_BINARY, or ./cmd/keyward built once by TestMain.
var keywardBinary string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	keywardBinary = os.Getenv("KEYWARD_BINARY")
	if keywardBinary == "" {
		dir, err := os.MkdirTemp("", "credprovider-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		keywardBinary = filepath.Join(dir, "keyward")
		out, err := exec.Command(goTool, "build", "-o", keywardBinary, "github.com/keyward/keyward/cmd/keyward").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "building cmd/keyward: %v\n%s", err, out)
			return 1
		}
	}
	return m.Run()
}

const (
	testImage    = "registry.example:5000/team/app"
	testRegistry = "registry.example:5000"
)

// fakeJWT is a compact JWS whose payload carries exp; the plugin reads exp
// without verifying, the fake token service accepts it by value.
func fakeJWT(exp time.Time) string {
	enc := base64.RawURLEncoding
	payload := fmt.Sprintf(`{"aud":["keyward.dev/registry"],"exp":%d,"sub":"system:serviceaccount:team:app"}`, exp.Unix())
	return enc.EncodeToString([]byte(`{"alg":"RS256"}`)) + "." + enc.EncodeToString([]byte(payload)) + ".c2ln"
}

// tokenService is an httptest TLS server answering POST /v1/credential per
// the contract (TOKEN.md), with a behaviour the test picks.
type tokenService struct {
	*httptest.Server
	caFile string
	calls  atomic.Int32
	// answer writes the response for a well-formed request.
	answer func(w http.ResponseWriter, r *http.Request, image string)
}

func newTokenService(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, image string)) *tokenService {
	t.Helper()
	ts := &tokenService{answer: answer}
	ts.Server = httptest.NewTLSServer(http.HandlerFunc(ts.serve))
	t.Cleanup(ts.Close)
	ts.caFile = filepath.Join(t.TempDir(), "ca.pem")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})
	if err := os.WriteFile(ts.caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return ts
}

func (ts *tokenService) serve(w http.ResponseWriter, r *http.Request) {
	ts.calls.Add(1)
	if r.Method != http.MethodPost || r.URL.Path != "/v1/credential" {
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint "+r.Method+" "+r.URL.Path)
		return
	}
	if !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ey") {
		writeError(w, http.StatusUnauthorized, "unauthorized", "no bearer token")
		return
	}
	var body struct {
		Image string `json:"image"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Image == "" {
		writeError(w, http.StatusBadRequest, "bad_request", "body is not {\"image\":…}")
		return
	}
	ts.answer(w, r, body.Image)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "message": msg})
}

// grant answers 200 for the image's host, as the token service does.
func grant(expiresAt time.Time) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, _ *http.Request, image string) {
		host, _, _ := strings.Cut(image, "/")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{
			"registry": host, "service": "registry.example", "username": "keyward",
			"expiresAt": expiresAt.UTC().Format(time.RFC3339),
		})
	}
}

func refuse(status int, code, msg string) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, _ *http.Request, _ string) { writeError(w, status, code, msg) }
}

type pluginRun struct {
	exit           int
	stdout, stderr string
}

// runPlugin execs `keyward credential-provider args…` with stdin, as
// kubelet does (kubelet's own environment is inherited).
func runPlugin(t *testing.T, stdin []byte, args ...string) pluginRun {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), keywardBinary, append([]string{"credential-provider"}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	run := pluginRun{stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		run.exit = exitErr.ExitCode()
	default:
		t.Fatalf("running the plugin: %v", err)
	}
	return run
}

func TestPluginAnswersKubeletWithTheTokenForTheImagesRegistry(t *testing.T) {
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	ts := newTokenService(t, grant(exp))
	token := fakeJWT(exp)

	run := runPlugin(t, kubeletRequest(t, testImage, token, map[string]string{"keyward.dev/team": "a"}),
		"--token-service-url", ts.URL, "--ca-file", ts.caFile)

	if run.exit != 0 || run.stderr != "" {
		t.Fatalf("exit %d, stderr %q; want 0 and nothing", run.exit, run.stderr)
	}
	want := `{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1",` +
		`"cacheKeyType":"Image","cacheDuration":"5m0s",` +
		`"auth":{"registry.example:5000":{"username":"keyward","password":"` + token + `"}}}` + "\n"
	if run.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", run.stdout, want)
	}
	resp, err := kubeletDecode([]byte(run.stdout))
	if err != nil {
		t.Fatalf("kubelet would refuse the response: %v", err)
	}
	if got := resp.Auth[testRegistry]; got.Username != "keyward" || got.Password != token {
		t.Errorf("kubelet reads auth %+v", resp.Auth)
	}
}

func TestPluginHonoursCacheKeyTypeAndTokenLifetime(t *testing.T) {
	// A token with 5 minutes left and a 10-minute cap: the answer is cached
	// for less than the 4m30s the token still has after the margin.
	exp := time.Now().Add(5 * time.Minute)
	ts := newTokenService(t, grant(exp))

	run := runPlugin(t, kubeletRequest(t, testImage, fakeJWT(exp), nil),
		"--token-service-url", ts.URL+"/", "--ca-file", ts.caFile,
		"--cache-key-type", "Registry", "--max-cache-duration", "10m")

	if run.exit != 0 {
		t.Fatalf("exit %d, stderr %q", run.exit, run.stderr)
	}
	resp, err := kubeletDecode([]byte(run.stdout))
	if err != nil {
		t.Fatal(err)
	}
	if resp.CacheKeyType != "Registry" {
		t.Errorf("cacheKeyType %q, want Registry", resp.CacheKeyType)
	}
	if d := resp.CacheDuration.Duration; d <= 0 || d > 4*time.Minute+30*time.Second {
		t.Errorf("cacheDuration %s, want in (0, 4m30s]", d)
	}
}

func TestPluginFailsCleanly(t *testing.T) {
	valid := fakeJWT(time.Now().Add(time.Hour))
	hour := time.Now().Add(time.Hour)

	// A port nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "https://" + l.Addr().String()
	l.Close()

	cases := []struct {
		name    string
		stdin   []byte
		answer  func(http.ResponseWriter, *http.Request, string)
		url     string // default: the fake token service
		args    []string
		want    string // in the stderr line
		noCalls bool   // the token service must not be asked
		// emptyStdin sends nothing; otherwise a nil stdin is a valid request.
		emptyStdin bool
		// noCAFile leaves --ca-file out: the system roots do not know the
		// test server's certificate.
		noCAFile bool
	}{
		{name: "stdin that is not JSON is refused before any call", stdin: []byte("image: x\n"),
			want: "is not a JSON CredentialProviderRequest", noCalls: true},
		{name: "empty stdin is refused", emptyStdin: true, want: "stdin is empty", noCalls: true},
		{name: "an unknown apiVersion is refused naming the one accepted",
			stdin: []byte(`{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1beta1","image":"` + testImage + `","serviceAccountToken":"` + valid + `"}`),
			want:  `apiVersion "credentialprovider.kubelet.k8s.io/v1beta1" is not supported, only credentialprovider.kubelet.k8s.io/v1`, noCalls: true},
		{name: "a wrong kind is refused",
			stdin: []byte(`{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"` + testImage + `","serviceAccountToken":"` + valid + `"}`),
			want:  `kind "CredentialProviderResponse" is not supported, only CredentialProviderRequest`, noCalls: true},
		{name: "an empty image is refused", stdin: kubeletRequest(t, "", valid, nil), want: "image is empty", noCalls: true},
		{name: "a missing token points at tokenAttributes", stdin: kubeletRequest(t, testImage, "", nil),
			want: "serviceAccountToken is empty: set tokenAttributes", noCalls: true},
		{name: "a token that is not a JWT is refused", stdin: kubeletRequest(t, testImage, "opaque", nil),
			want: "serviceAccountToken is not a JWT", noCalls: true},
		{name: "a token expiring in 10s is refused before any call",
			stdin: kubeletRequest(t, testImage, fakeJWT(time.Now().Add(10*time.Second)), nil),
			want:  "service account token expires too soon", noCalls: true},
		{name: "the token service's 401 message is shown",
			answer: refuse(http.StatusUnauthorized, "unauthorized", "token audience is not keyward.dev/registry"),
			want:   "token service refused the credential request (401 Unauthorized, unauthorized): token audience is not keyward.dev/registry"},
		{name: "the token service's 403 message is shown",
			answer: refuse(http.StatusForbidden, "denied", "no rule grants team/app-sa pull of registry.example:5000/team/app"),
			want:   "(403 Forbidden, denied): no rule grants team/app-sa pull"},
		{name: "the token service's 404 message is shown",
			answer: refuse(http.StatusNotFound, "unknown_registry", "no registry has host registry.example:5000; configured: other.example"),
			want:   "(404 Not Found, unknown_registry): no registry has host registry.example:5000; configured: other.example"},
		{name: "the token service's 503 message is shown",
			answer: refuse(http.StatusServiceUnavailable, "unavailable", "no Active generation"),
			want:   "token service failed the credential request (503 Service Unavailable, unavailable): no Active generation"},
		{name: "a multi-line server message stays on one line",
			answer: refuse(http.StatusForbidden, "denied", "first\nsecond\r\nthird"),
			want:   "denied): first second third"},
		{name: "an unreachable token service is named", url: deadURL,
			want: "calling the token service at " + deadURL + "/v1/credential"},
		{name: "a token service slower than --timeout is given up on",
			answer: func(_ http.ResponseWriter, r *http.Request, _ string) { <-r.Context().Done() },
			args:   []string{"--timeout", "300ms"},
			want:   "no answer within 300ms"},
		{name: "a 200 that is not JSON is refused",
			answer: func(w http.ResponseWriter, _ *http.Request, _ string) { _, _ = w.Write([]byte("<html>hello</html>")) },
			want:   "unusable answer from the token service: decoding its 200 answer"},
		{name: "an error status with a body that is not JSON still says the status",
			answer: func(w http.ResponseWriter, _ *http.Request, _ string) {
				w.WriteHeader(http.StatusBadGateway)
				_, _ = w.Write([]byte("<html>proxy</html>"))
			},
			want: "token service failed the credential request (502 Bad Gateway)"},
		{name: "an answer for another registry host is refused",
			answer: func(w http.ResponseWriter, r *http.Request, _ string) { grant(hour)(w, r, "elsewhere.example/x") },
			want:   `answered for registry "elsewhere.example", but the image`},
		{name: "a CA file without certificates is refused", args: []string{"--ca-file", "/dev/null"},
			want: "no PEM CERTIFICATE", noCalls: true},
		{name: "a token service the roots do not vouch for is refused", noCAFile: true,
			want: "certificate signed by unknown authority"},
		{name: "a plain http URL is refused", url: "http://127.0.0.1:1",
			want: "must be https://", noCalls: true},
		{name: "an unknown flag is one line too", args: []string{"--frobnicate"},
			want: "parsing flags: unknown flag: --frobnicate", noCalls: true},
		{name: "the Global cache key type is refused", args: []string{"--cache-key-type", "Global"},
			want: `cache key type "Global": must be Image or Registry`, noCalls: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			answer := tc.answer
			if answer == nil {
				answer = grant(hour)
			}
			ts := newTokenService(t, answer)
			stdin := tc.stdin
			if stdin == nil && !tc.emptyStdin {
				stdin = kubeletRequest(t, testImage, valid, nil)
			}
			url := tc.url
			if url == "" {
				url = ts.URL
			}
			args := []string{"--token-service-url", url}
			if !tc.noCAFile {
				args = append(args, "--ca-file", ts.caFile)
			}
			args = append(args, tc.args...)

			run := runPlugin(t, stdin, args...)

			t.Logf("stderr: %s", run.stderr)
			if run.exit != 1 {
				t.Errorf("exit code %d, want 1", run.exit)
			}
			if run.stdout != "" {
				t.Errorf("stdout %q, want nothing", run.stdout)
			}
			lines := strings.Split(strings.TrimSuffix(run.stderr, "\n"), "\n")
			if len(lines) != 1 || !strings.HasSuffix(run.stderr, "\n") {
				t.Fatalf("stderr %q, want exactly one line", run.stderr)
			}
			if !strings.HasPrefix(lines[0], "keyward credential-provider: ") || !strings.Contains(lines[0], tc.want) {
				t.Errorf("stderr line %q\nwant it to start with %q and contain %q", lines[0], "keyward credential-provider: ", tc.want)
			}
			if strings.Contains(run.stderr, valid) {
				t.Errorf("stderr quotes the service-account token")
			}
			if tc.noCalls && ts.calls.Load() != 0 {
				t.Errorf("the token service was called %d times, want none", ts.calls.Load())
			}
		})
	}
}
