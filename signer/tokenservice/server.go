package tokenservice

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/signer/tokenservice/policy"
)

// Limits on what a client sends.
const (
	// MaxBodyBytes bounds a request body (a token form or a credential
	// request is well under 1 KiB).
	MaxBodyBytes = 64 << 10
	// MaxHeaderBytes bounds a request's headers; the HTTP server answers
	// 431 beyond it before any handler runs.
	MaxHeaderBytes = 64 << 10
	// maxAuthorizationBytes bounds the Authorization header: a Basic
	// header holding a token of MaxTokenBytes, with room for a user name.
	maxAuthorizationBytes = MaxTokenBytes*4/3 + 1024
	// maxQuoted bounds how much of a client's input a message quotes.
	maxQuoted = 256
	// signTimeout bounds one signature of the key backend: a hung HSM
	// call is left to the key's guard (signer.GuardKey) and the request
	// answered 503, instead of holding it until the client goes away.
	signTimeout = 10 * time.Second
)

// Username is the user name the credential endpoint hands out (the
// password is the service-account token itself).
const Username = "keyward"

// Endpoints (the endpoint label of keyward_token_requests_total).
const (
	endpointToken      = "token"
	endpointCredential = "credential"
)

// ServerOptions configure NewServer.
type ServerOptions struct {
	// Config supplies Issuer, TokenLifetime and KeyIdentifier. Required.
	Config *config.TokenServiceConfiguration
	// Policy decides registries, hosts and grants. Required.
	Policy *policy.Policy
	// Reviewer validates service-account tokens. Required.
	Reviewer Reviewer
	// Issuer is the signing generation of Config.SignerName. Required.
	Issuer  issuer.Issuer
	Metrics *Metrics
	Clock   clock.PassiveClock
}

// Server answers the token endpoint (/token, CNCF Distribution's token
// protocol and its OAuth2 password form) and the credential provider's
// endpoint (/v1/credential). It is safe for concurrent use.
type Server struct {
	o        ServerOptions
	lifetime time.Duration
	keyID    string
	// signFailing: the last signature failed (its start was logged at
	// default verbosity; the next ones at V(2) until one succeeds).
	signFailing atomic.Bool
	// reviewFailing: the last review could not be made (the apiserver
	// unreachable, too many under way); logged like signFailing.
	reviewFailing atomic.Bool
	// refusals audits refusals of unauthenticated tokens, rate-limited.
	refusals *refusalLog
}

// NewServer validates o. It starts nothing.
func NewServer(o ServerOptions) (*Server, error) {
	if o.Config == nil || o.Policy == nil || o.Reviewer == nil || o.Issuer == nil {
		return nil, errors.New("the token server needs a configuration, a policy, a reviewer and an issuer")
	}
	if o.Config.Issuer == "" {
		return nil, errors.New("the token server needs an issuer (the tokens' iss)")
	}
	s := &Server{o: o, lifetime: o.Config.TokenLifetime.Duration, keyID: o.Config.KeyIdentifier}
	if s.lifetime == 0 {
		s.lifetime = config.DefaultTokenLifetime
	}
	if s.lifetime < 0 {
		return nil, fmt.Errorf("token lifetime %s is negative", s.lifetime)
	}
	switch s.keyID {
	case "":
		s.keyID = config.KeyIdentifierX5C
	case config.KeyIdentifierX5C, config.KeyIdentifierKID:
	default:
		return nil, fmt.Errorf("key identifier %q: want %s or %s", s.keyID, config.KeyIdentifierX5C, config.KeyIdentifierKID)
	}
	if s.o.Clock == nil {
		s.o.Clock = clock.RealClock{}
	}
	s.refusals = newRefusalLog(s.o.Clock)
	return s, nil
}

// FlushRefusals logs the summary of refusals of the last window if it is
// over (Run calls it every RefusalLogWindow; a refusal does too).
func (s *Server) FlushRefusals(ctx context.Context) {
	s.refusals.flush(klog.FromContext(ctx))
}

// audiences are the service-account token audiences accepted for a token
// for reg: its own, else the configuration's.
func (s *Server) audiences(reg config.Registry) []string {
	if reg.Audience != "" {
		return []string{reg.Audience}
	}
	return []string{s.o.Config.Audience}
}

// allAudiences are every audience some registry accepts.
func (s *Server) allAudiences() []string {
	var out []string
	for _, r := range s.o.Config.Registries {
		for _, a := range s.audiences(r) {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// Handler serves /token and /v1/credential.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/token", s.counted(endpointToken, s.token))
	mux.Handle("/v1/credential", s.counted(endpointCredential, s.credential))
	return mux
}

// statusWriter remembers the status code written.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (s *Server) counted(endpoint string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := s.o.Clock.Now()
		sw := &statusWriter{ResponseWriter: w}
		h(sw, r)
		if sw.code == 0 {
			sw.code = http.StatusOK
		}
		s.o.Metrics.request(endpoint, sw.code)
		if sw.code == http.StatusOK {
			s.o.Metrics.issued(s.o.Clock.Since(start).Seconds())
		}
	})
}

// tokenError is an error answer of /token: an HTTP status, the
// Distribution error code and, for the OAuth2 form, the OAuth error.
type tokenError struct {
	status  int
	code    string // UNAUTHORIZED, DENIED, UNSUPPORTED, UNAVAILABLE
	oauth   string // invalid_request, invalid_grant, unsupported_grant_type, …
	message string
}

func (s *Server) writeTokenError(w http.ResponseWriter, oauthForm bool, e tokenError) {
	if e.status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Basic realm="keyward"`)
	}
	if oauthForm {
		writeJSON(w, e.status, map[string]string{"error": e.oauth, "error_description": e.message})
		return
	}
	writeJSON(w, e.status, map[string]any{"errors": []map[string]string{{"code": e.code, "message": e.message}}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // maps of strings: cannot happen
		http.Error(w, "encoding the answer", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// tokenRequest is a /token request, from the query (GET) or the form
// (POST).
type tokenRequest struct {
	oauthForm  bool
	credential string
	service    string
	scopes     []string
}

// parseTokenRequest reads r; a non-nil *tokenError is the answer.
func (s *Server) parseTokenRequest(w http.ResponseWriter, r *http.Request) (*tokenRequest, *tokenError) {
	switch r.Method {
	case http.MethodGet:
		q := r.URL.Query()
		tr := &tokenRequest{service: q.Get("service"), scopes: q["scope"]}
		cred, e := credentialFromHeader(r)
		if e != nil {
			return nil, e
		}
		tr.credential = cred
		return tr, nil
	case http.MethodPost:
		mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if mt != "application/x-www-form-urlencoded" {
			return nil, &tokenError{status: http.StatusBadRequest, code: "UNSUPPORTED", oauth: "invalid_request",
				message: fmt.Sprintf("POST /token takes an application/x-www-form-urlencoded body, not %q", quote(r.Header.Get("Content-Type")))}
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		if err := r.ParseForm(); err != nil {
			if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
				return nil, &tokenError{status: http.StatusRequestEntityTooLarge, code: "UNSUPPORTED", oauth: "invalid_request",
					message: fmt.Sprintf("the request body is over %d bytes", MaxBodyBytes)}
			}
			return nil, &tokenError{status: http.StatusBadRequest, code: "UNSUPPORTED", oauth: "invalid_request", message: "reading the form: " + err.Error()}
		}
		f := r.PostForm
		tr := &tokenRequest{oauthForm: true, service: f.Get("service"), scopes: f["scope"], credential: f.Get("password")}
		if g := f.Get("grant_type"); g != "password" {
			return tr, &tokenError{status: http.StatusBadRequest, code: "UNSUPPORTED", oauth: "unsupported_grant_type",
				message: fmt.Sprintf("grant_type %q is not supported; use password (the service-account token as password) or GET with Basic auth", quote(g))}
		}
		if tr.credential == "" {
			cred, e := credentialFromHeader(r)
			if e != nil {
				return tr, e
			}
			tr.credential = cred
		}
		return tr, nil
	}
	w.Header().Set("Allow", "GET, POST")
	return nil, &tokenError{status: http.StatusMethodNotAllowed, code: "UNSUPPORTED", oauth: "invalid_request",
		message: fmt.Sprintf("method %s is not allowed; use GET or POST", quote(r.Method))}
}

// credentialFromHeader reads the service-account token from Authorization:
// Basic (the password) or Bearer. No header, or another scheme, is "".
func credentialFromHeader(r *http.Request) (string, *tokenError) {
	h := r.Header.Get("Authorization")
	if len(h) > maxAuthorizationBytes {
		return "", &tokenError{status: http.StatusBadRequest, code: "UNAUTHORIZED", oauth: "invalid_request",
			message: fmt.Sprintf("the Authorization header is %d bytes; at most %d are accepted (a service-account token is about 1–2 KiB)", len(h), maxAuthorizationBytes)}
	}
	scheme, value, ok := strings.Cut(h, " ")
	if !ok {
		return "", nil
	}
	value = strings.TrimSpace(value)
	switch {
	case strings.EqualFold(scheme, "Bearer"):
		return value, nil
	case strings.EqualFold(scheme, "Basic"):
		b, err := base64.StdEncoding.DecodeString(value)
		if err != nil {
			return "", nil
		}
		_, pass, _ := strings.Cut(string(b), ":")
		return pass, nil
	}
	return "", nil
}

// quote cuts s for quoting in a message.
func quote(s string) string {
	if len(s) > maxQuoted {
		return s[:maxQuoted] + "…"
	}
	return s
}

func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	logger := klog.FromContext(ctx)
	tr, terr := s.parseTokenRequest(w, r)
	oauthForm := r.Method == http.MethodPost
	if terr != nil {
		logger.V(2).Info("Refused a registry token request", "status", terr.status, "message", terr.message, "remote", r.RemoteAddr)
		s.writeTokenError(w, oauthForm, *terr)
		return
	}
	if tr.service == "" {
		s.writeTokenError(w, oauthForm, tokenError{status: http.StatusBadRequest, code: "UNSUPPORTED", oauth: "invalid_request",
			message: "the service parameter is required (the registry's auth.token.service); this token service serves " + s.services()})
		return
	}
	reg, ok := s.o.Policy.Service(tr.service)
	if !ok {
		s.writeTokenError(w, oauthForm, tokenError{status: http.StatusBadRequest, code: "UNSUPPORTED", oauth: "invalid_request",
			message: fmt.Sprintf("unknown service %q; this token service serves %s", quote(tr.service), s.services())})
		return
	}
	if tr.credential == "" {
		logger.V(2).Info("Registry token request without credential", "service", tr.service, "remote", r.RemoteAddr)
		s.writeTokenError(w, oauthForm, tokenError{status: http.StatusUnauthorized, code: "UNAUTHORIZED", oauth: "invalid_grant",
			message: "a service-account token is required: as the password of Basic auth, a Bearer token, or the password of the form"})
		return
	}
	rv, err := s.o.Reviewer.Review(ctx, tr.credential, ReviewRequest{Audiences: s.audiences(reg), Client: r.RemoteAddr})
	s.reviewed(ctx, err)
	if err != nil {
		e := s.reviewError(ctx, r, err, tr.service)
		s.writeTokenError(w, oauthForm, tokenError{status: e.status, code: e.code, oauth: e.oauth, message: e.message})
		return
	}
	id := rv.Identity

	scopes, bad := policy.ParseScopes(tr.scopes)
	for _, err := range bad {
		logger.V(2).Info("Dropped a scope that does not parse", "err", err, "namespace", id.Namespace, "sa", id.ServiceAccount)
	}
	granted, dropped := s.o.Policy.Grant(id, tr.service, scopes)
	s.o.Metrics.scopes(len(granted), len(dropped)+len(bad))

	auth, gen, err := s.o.Issuer.Current()
	if err != nil {
		s.cannotSign(ctx, err, "no generation's key can sign", "")
		s.writeTokenError(w, oauthForm, tokenError{status: http.StatusServiceUnavailable, code: "UNAVAILABLE", oauth: "temporarily_unavailable",
			message: "no token-signing key can sign now: " + err.Error()})
		return
	}
	now := s.o.Clock.Now()
	exp := now.Add(s.lifetime)
	if rv.Expiry.Before(exp) {
		exp = rv.Expiry
	}
	if !exp.After(now) {
		s.writeTokenError(w, oauthForm, tokenError{status: http.StatusUnauthorized, code: "UNAUTHORIZED", oauth: "invalid_grant",
			message: "the service-account token has expired"})
		return
	}
	// Recorded before the signature: a token may not outlive what the
	// cluster knows this generation may have signed.
	if err := s.o.Issuer.Reserve(ctx, gen, exp); err != nil {
		s.cannotSign(ctx, err, "the token's lifetime cannot be reserved", gen)
		s.writeTokenError(w, oauthForm, tokenError{status: http.StatusServiceUnavailable, code: "UNAVAILABLE", oauth: "temporarily_unavailable",
			message: "cannot sign now: " + err.Error()})
		return
	}
	jti, err := randomID()
	if err != nil {
		s.writeTokenError(w, oauthForm, tokenError{status: http.StatusServiceUnavailable, code: "UNAVAILABLE", oauth: "temporarily_unavailable", message: err.Error()})
		return
	}
	tok := registrytoken.Token{
		Issuer: s.o.Config.Issuer, Audience: tr.service,
		Subject: "system:serviceaccount:" + id.Namespace + ":" + id.ServiceAccount,
		Access:  granted, NotBefore: now, Expiry: exp, ID: jti,
	}
	if s.keyID == config.KeyIdentifierX5C {
		tok.Chain = auth.Chain()
	} // else Mint sets kid to the signing key's thumbprint
	sctx, cancel := context.WithTimeout(ctx, signTimeout)
	raw, err := registrytoken.Mint(sctx, auth.Signer(), tok)
	cancel()
	if err != nil {
		s.o.Metrics.signingError()
		s.cannotSign(ctx, err, "the signature failed", gen)
		s.writeTokenError(w, oauthForm, tokenError{status: http.StatusServiceUnavailable, code: "UNAVAILABLE", oauth: "temporarily_unavailable",
			message: "signing the token failed; try again"})
		return
	}
	if s.signFailing.CompareAndSwap(true, false) {
		logger.Info("Signing registry tokens works again", "generation", gen)
	}
	logger.WithName("audit").Info("Registry token granted",
		"namespace", id.Namespace, "sa", id.ServiceAccount, "pod", id.PodName, "podUID", id.PodUID, "node", id.NodeName,
		"service", tr.service, "granted", accessStrings(granted), "dropped", scopeStrings(dropped), "unparsed", len(bad),
		"jti", jti, "expiry", exp.UTC().Format(time.RFC3339), "generation", gen, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, map[string]any{
		"token": raw, "access_token": raw,
		"expires_in": int64(exp.Sub(now) / time.Second),
		"issued_at":  now.UTC().Format(time.RFC3339),
	})
}

// reviewAnswer is how a Review error is answered.
type reviewAnswer struct {
	status      int
	code, oauth string // /token
	credCode    string // /v1/credential
	message     string
}

// cannotSign logs, at default verbosity, the first of a run of requests
// answered 503 because no token could be signed (no Active generation, the
// reservation not recorded, the signature failed), and the rest at V(2);
// the first token signed after it logs the recovery.
func (s *Server) cannotSign(ctx context.Context, err error, why, gen string) {
	logger := klog.FromContext(ctx)
	if s.signFailing.CompareAndSwap(false, true) {
		logger.Error(err, "Registry tokens cannot be signed; every token request is answered 503 until one is (logged once)", "why", why, "generation", gen)
		return
	}
	logger.V(2).Info("Cannot sign a registry token", "why", why, "err", err, "generation", gen)
}

// reviewed logs, at default verbosity, when reviews start failing for a
// reason that is not the token's (the apiserver unreachable, too many
// reviews under way) and when they work again: once each, not once per
// request. A missing RBAC grant is logged once by the reviewer itself.
func (s *Server) reviewed(ctx context.Context, err error) {
	var refused *RefusedError
	var grant *MissingGrantError
	switch {
	case err == nil || errors.As(err, &refused):
		if s.reviewFailing.CompareAndSwap(true, false) {
			klog.FromContext(ctx).Info("Service-account token reviews work again")
		}
	case errors.As(err, &grant):
	default:
		if s.reviewFailing.CompareAndSwap(false, true) {
			klog.FromContext(ctx).Error(err, "Cannot validate service-account tokens; every token request is answered 503 until a review succeeds (logged once)")
		}
	}
}

// reviewError turns a Review error into an answer and logs it: a refusal
// of an authenticated caller at default verbosity (audit), one line each;
// any other refusal at default verbosity too, rate-limited (refusalLog);
// anything else at V(2).
func (s *Server) reviewError(ctx context.Context, r *http.Request, err error, service string) reviewAnswer {
	logger := klog.FromContext(ctx)
	var refused *RefusedError
	if errors.As(err, &refused) {
		s.o.Metrics.refused(refused.Reason)
		if refused.Authenticated {
			id := refused.Identity
			logger.WithName("audit").Info("Registry token refused", "reason", refused.Reason, "message", refused.Message,
				"namespace", id.Namespace, "sa", id.ServiceAccount, "pod", id.PodName, "podUID", id.PodUID, "node", id.NodeName,
				"service", service, "endpoint", r.URL.Path, "remote", r.RemoteAddr)
		} else {
			s.refusals.note(logger, refused, r.RemoteAddr, r.URL.Path, service)
			logger.V(2).Info("Service-account token refused", "reason", refused.Reason, "message", refused.Message, "endpoint", r.URL.Path, "remote", r.RemoteAddr)
		}
		return reviewAnswer{status: http.StatusUnauthorized, code: "UNAUTHORIZED", oauth: "invalid_grant", credCode: "unauthorized",
			message: "service-account token refused (" + refused.Reason + "): " + refused.Message}
	}
	logger.V(2).Info("Cannot validate a service-account token now", "err", err, "endpoint", r.URL.Path, "remote", r.RemoteAddr)
	msg := err.Error() // ErrUnavailable's text says it already
	if !errors.Is(err, ErrUnavailable) {
		msg = "cannot validate the service-account token now: " + msg
	}
	return reviewAnswer{status: http.StatusServiceUnavailable, code: "UNAVAILABLE", oauth: "temporarily_unavailable", credCode: "unavailable",
		message: msg}
}

func (s *Server) services() string {
	var out []string
	for _, r := range s.o.Config.Registries {
		out = append(out, fmt.Sprintf("%q", r.Service))
	}
	return strings.Join(out, ", ")
}

func (s *Server) hosts() string {
	var out []string
	for _, r := range s.o.Config.Registries {
		hosts := r.Hosts
		if len(hosts) == 0 {
			hosts = []string{r.Service}
		}
		for _, h := range hosts {
			out = append(out, fmt.Sprintf("%q", h))
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

func accessStrings(a []registrytoken.Access) []string {
	out := make([]string, 0, len(a))
	for _, x := range a {
		out = append(out, x.Type+":"+x.Name+":"+strings.Join(x.Actions, ","))
	}
	return out
}

func scopeStrings(sc []policy.Scope) []string {
	out := make([]string, 0, len(sc))
	for _, x := range sc {
		out = append(out, quote(x.Type+":"+x.Name+":"+strings.Join(x.Actions, ",")))
	}
	return out
}

func randomID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("making a token id: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// credentialError answers /v1/credential.
func writeCredentialError(w http.ResponseWriter, status int, code, message string) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="keyward"`)
	}
	writeJSON(w, status, map[string]string{"error": code, "message": message})
}

func (s *Server) credential(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeCredentialError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("method %s is not allowed; use POST", quote(r.Method)))
		return
	}
	cred, terr := credentialFromHeader(r)
	if terr != nil {
		writeCredentialError(w, terr.status, "bad_request", terr.message)
		return
	}
	if cred == "" {
		writeCredentialError(w, http.StatusUnauthorized, "unauthorized", "an Authorization: Bearer <service-account token> header is required")
		return
	}
	var req struct {
		Image string `json:"image"`
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			writeCredentialError(w, http.StatusRequestEntityTooLarge, "bad_request", fmt.Sprintf("the request body is over %d bytes", MaxBodyBytes))
			return
		}
		writeCredentialError(w, http.StatusBadRequest, "bad_request", "reading the request: "+err.Error())
		return
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeCredentialError(w, http.StatusBadRequest, "bad_request", `the body must be JSON {"image": "host/repository[:tag|@digest]"}: `+err.Error())
		return
	}
	if req.Image == "" {
		writeCredentialError(w, http.StatusBadRequest, "bad_request", `the body must name an image: {"image": "host/repository[:tag|@digest]"}`)
		return
	}
	host, repo, err := policy.ParseImage(req.Image)
	if err != nil {
		writeCredentialError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("bad image reference %q: %v", quote(req.Image), err))
		return
	}
	// A registry with its own audience accepts only tokens for it; a host
	// no registry has is answered 404 to a token any registry accepts.
	reg, ok := s.o.Policy.RegistryForHost(host)
	audiences := s.allAudiences()
	if ok {
		audiences = s.audiences(reg)
	}
	rv, err := s.o.Reviewer.Review(ctx, cred, ReviewRequest{Audiences: audiences, Client: r.RemoteAddr})
	s.reviewed(ctx, err)
	if err != nil {
		e := s.reviewError(ctx, r, err, reg.Service)
		writeCredentialError(w, e.status, e.credCode, e.message)
		return
	}
	id := rv.Identity
	if !ok {
		writeCredentialError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no configured registry has host %q; configured hosts: %s", quote(host), s.hosts()))
		return
	}
	if !s.o.Policy.Allows(id, reg.Service, repo, config.ActionPull) {
		klog.FromContext(ctx).WithName("audit").Info("Registry credential refused", "reason", "NotGranted",
			"namespace", id.Namespace, "sa", id.ServiceAccount, "pod", id.PodName, "podUID", id.PodUID, "node", id.NodeName,
			"service", reg.Service, "repository", repo, "remote", r.RemoteAddr)
		writeCredentialError(w, http.StatusForbidden, "forbidden", fmt.Sprintf("the policy grants service account %s/%s no pull of repository %q on registry %q (host %s)",
			id.Namespace, id.ServiceAccount, repo, reg.Service, host))
		return
	}
	klog.FromContext(ctx).V(2).Info("Registry credential answered", "namespace", id.Namespace, "sa", id.ServiceAccount, "pod", id.PodName,
		"service", reg.Service, "repository", repo, "expiresAt", rv.Expiry.UTC().Format(time.RFC3339))
	writeJSON(w, http.StatusOK, map[string]string{
		"registry": host, "service": reg.Service, "username": Username,
		"expiresAt": rv.Expiry.UTC().Format(time.RFC3339),
	})
}
