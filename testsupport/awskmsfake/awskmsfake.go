// Package awskmsfake is an in-process AWS KMS for tests: an httptest.Server
// speaking the KMS JSON 1.1 protocol (POST /, X-Amz-Target:
// TrentService.<Action>, Content-Type: application/x-amz-json-1.1, blobs in
// base64, errors as {"__type", "message"} with the service's HTTP status),
// with real keys, real signatures, and faults to inject — error codes,
// non-JSON 5xx answers, latency, wrong signatures, answers naming another key
// or algorithm.
//
// It serves DescribeKey, GetPublicKey, CreateKey, Sign and ScheduleKeyDeletion, written from the
// AWS KMS API reference, not from the backend under test: keys are regional
// (the region is the one in the request's SigV4 credential scope), are
// addressed by key id, key ARN, alias name or alias ARN, and Sign checks key
// state, key usage, the key's signing algorithms, MessageType (RAW, the
// service's default, is hashed before signing) and the digest length. A
// Server is safe for concurrent use.
package awskmsfake

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyward/keyward/testsupport/faults"
	"github.com/keyward/keyward/testsupport/testkeys"
	"golang.org/x/time/rate"
)

// The KMS actions the server serves, counts and injects faults into.
const (
	DescribeKey  = "DescribeKey"
	GetPublicKey = "GetPublicKey"
	CreateKey    = "CreateKey"
	Sign         = "Sign"
	// ScheduleKeyDeletion makes the key PendingDeletion (7 to 30 days,
	// default 30, as the service); it then neither signs nor shows its
	// public key.
	ScheduleKeyDeletion = "ScheduleKeyDeletion"
)

// Always, as Inject's times, injects the fault into every call until
// ClearFaults.
const Always = faults.Always

// Credentials the server accepts (in the SigV4 Authorization header).
const (
	AccessKeyID     = "AKIDKEYWARDFAKE"
	SecretAccessKey = "keyward-fake-secret"
)

// Account is the AWS account id in the server's ARNs.
const Account = "111122223333"

// maxRawMessage is the largest RAW message Sign takes.
const maxRawMessage = 4096

// Fault is what the server does to one call instead of answering it
// faithfully. Fields that do not apply to an action are ignored.
type Fault struct {
	// Code, if set, fails the call with this error type ("__type"), e.g.
	// "ThrottlingException", and Status (default: the service's status for
	// Code, see StatusOf).
	Code string
	// Status without Code fails the call with this HTTP status and a
	// non-JSON body, as a load balancer in front of the service would.
	Status int
	// WrongSignature makes Sign sign another digest (or message) with the
	// right key: only verifying the signature catches it.
	WrongSignature bool
	// WrongKeyID makes Sign and GetPublicKey answer for another key ARN.
	WrongKeyID bool
	// WrongAlgorithm makes Sign report another signing algorithm.
	WrongAlgorithm bool
}

// StatusOf is the HTTP status AWS KMS answers error code with.
func StatusOf(code string) int {
	switch code {
	case "KMSInternalException", "KeyUnavailableException", "InternalFailure":
		return http.StatusInternalServerError
	case "DependencyTimeoutException", "ServiceUnavailableException":
		return http.StatusServiceUnavailable
	default:
		return http.StatusBadRequest
	}
}

// Options configure a Server. The zero value is usable.
type Options struct {
	// ReuseKeyMaterial gives every key of one key spec the same private key,
	// generated once per Server, to spare tests RSA key generation.
	ReuseKeyMaterial bool
	// SignRate, if positive, is the account's Sign quota in calls per
	// second, shared by every key and region, as AWS KMS applies its
	// request quotas: a Sign call over it is answered ThrottlingException
	// ("Rate exceeded", HTTP 400) before it is read, and is neither
	// recorded by SignRequests nor signed. Calls still count in Calls.
	SignRate float64
	// SignBurst is the quota's bucket size (default: one second's worth
	// of SignRate, at least 1).
	SignBurst int
}

// NewKey describes a key for AddKey.
type NewKey struct {
	Region  string // required
	KeySpec string // required, e.g. "ECC_NIST_P256"
	// KeyUsage defaults to SIGN_VERIFY for asymmetric key specs,
	// ENCRYPT_DECRYPT for SYMMETRIC_DEFAULT and GENERATE_VERIFY_MAC for HMAC.
	KeyUsage string
	// KeyState defaults to "Enabled".
	KeyState string
	// Alias, if set ("alias/NAME"), names the key in its region.
	Alias string
	// SigningAlgorithms overrides the list AWS gives keys of KeySpec.
	SigningAlgorithms []string
}

// Key identifies a key the server holds.
type Key struct {
	ID  string
	ARN string
}

// SignRequest is what one Sign call asked for.
type SignRequest struct {
	Region           string
	KeyID            string
	SigningAlgorithm string
	MessageType      string // as sent; "" means RAW
	Message          []byte
}

// CreateKeyRequest is what one CreateKey call asked for.
type CreateKeyRequest struct {
	Region      string
	KeySpec     string // as sent; "" means SYMMETRIC_DEFAULT
	KeyUsage    string // as sent; "" means ENCRYPT_DECRYPT
	Description string
}

// Server is the fake AWS KMS.
type Server struct {
	// Injector gives the Server SetLatency, Inject, ClearFaults and Calls,
	// keyed by action name.
	faults.Injector[Fault]

	opts Options
	srv  *httptest.Server

	mu       sync.Mutex
	keys     map[string]*key   // by key id
	aliases  map[string]string // region + "/" + alias name → key id
	signs    []SignRequest
	creates  []CreateKeyRequest
	material *testkeys.Pool

	requests  atomic.Uint64
	throttled atomic.Uint64
	// quota is Options.SignRate's bucket; nil without one.
	quota *rate.Limiter
}

type key struct {
	meta metadata
	priv crypto.Signer // nil for specs the fake cannot make keys of
}

// Start serves a new, empty fake on a loopback port. Close stops it.
func Start(opts Options) *Server {
	s := &Server{
		opts:     opts,
		keys:     map[string]*key{},
		aliases:  map[string]string{},
		material: &testkeys.Pool{Reuse: opts.ReuseKeyMaterial},
	}
	if opts.SignRate > 0 {
		burst := opts.SignBurst
		if burst <= 0 {
			burst = max(1, int(opts.SignRate))
		}
		s.quota = rate.NewLimiter(rate.Limit(opts.SignRate), burst)
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// Throttled is how many Sign calls the SignRate quota refused.
func (s *Server) Throttled() uint64 { return s.throttled.Load() }

// URL is the endpoint to give the SDK client as its BaseEndpoint.
func (s *Server) URL() string { return s.srv.URL }

// Close stops the server, waiting for calls in flight.
func (s *Server) Close() { s.srv.Close() }

// AddKey adds a key, with real key material for the key specs Go can make:
// ECC_NIST_P256, ECC_NIST_P384, ECC_NIST_P521, ECC_NIST_EDWARDS25519 and
// RSA_2048/3072/4096.
func (s *Server) AddKey(nk NewKey) (Key, error) {
	if nk.Region == "" || nk.KeySpec == "" {
		return Key{}, errors.New("awskmsfake: AddKey needs a region and a key spec")
	}
	usage := nk.KeyUsage
	if usage == "" {
		usage = defaultUsage(nk.KeySpec)
	}
	k, err := s.newKey(nk.Region, nk.KeySpec, usage, "")
	if err != nil {
		return Key{}, err
	}
	if nk.KeyState != "" {
		k.meta.KeyState = nk.KeyState
		k.meta.Enabled = nk.KeyState == "Enabled"
	}
	if nk.SigningAlgorithms != nil {
		k.meta.SigningAlgorithms = slices.Clone(nk.SigningAlgorithms)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if nk.Alias != "" {
		if !strings.HasPrefix(nk.Alias, "alias/") {
			return Key{}, fmt.Errorf("awskmsfake: alias %q does not start with alias/", nk.Alias)
		}
		s.aliases[nk.Region+"/"+nk.Alias] = k.meta.KeyId
	}
	s.keys[k.meta.KeyId] = k
	return Key{ID: k.meta.KeyId, ARN: k.meta.Arn}, nil
}

// SetKeyState changes a key's state ("Enabled", "Disabled",
// "PendingDeletion", …).
func (s *Server) SetKeyState(keyID, state string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.keys[keyID]
	if !ok {
		return fmt.Errorf("awskmsfake: no key %q", keyID)
	}
	k.meta.KeyState = state
	k.meta.Enabled = state == "Enabled"
	return nil
}

// SignRequests are the Sign calls received that were not faulted before
// being read, oldest first.
func (s *Server) SignRequests() []SignRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.signs)
}

// CreateKeyRequests are the CreateKey calls received that were not faulted
// before being read, oldest first.
func (s *Server) CreateKeyRequests() []CreateKeyRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.creates)
}

// apiError is an error answer of the service.
type apiError struct {
	status  int
	code    string // "" for a non-JSON answer
	message string
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func fail(code, format string, args ...any) *apiError {
	return &apiError{status: StatusOf(code), code: code, message: fmt.Sprintf(format, args...)}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	action, region, body, aerr := s.readRequest(r)
	if aerr != nil {
		s.writeError(w, aerr)
		return
	}
	f, aerr := s.begin(r.Context(), action)
	if aerr != nil {
		s.writeError(w, aerr)
		return
	}
	if action == Sign && s.quota != nil && !s.quota.Allow() {
		s.throttled.Add(1)
		s.writeError(w, fail("ThrottlingException", "Rate exceeded"))
		return
	}
	var out any
	switch action {
	case DescribeKey:
		out, aerr = s.describeKey(region, body)
	case GetPublicKey:
		out, aerr = s.getPublicKey(region, body, f)
	case CreateKey:
		out, aerr = s.createKey(region, body)
	case Sign:
		out, aerr = s.sign(region, body, f)
	case ScheduleKeyDeletion:
		out, aerr = s.scheduleKeyDeletion(region, body)
	}
	if aerr != nil {
		s.writeError(w, aerr)
		return
	}
	b, err := json.Marshal(out)
	if err != nil {
		s.writeError(w, fail("InternalFailure", "encoding the answer: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-Requestid", s.requestID())
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// readRequest checks the protocol framing and SigV4 credential scope, and
// returns the action, the region the request was signed for, and the body.
func (s *Server) readRequest(r *http.Request) (action, region string, body []byte, _ *apiError) {
	if r.Method != http.MethodPost || r.URL.Path != "/" {
		return "", "", nil, &apiError{status: http.StatusNotFound, code: "UnknownOperationException", message: r.Method + " " + r.URL.Path}
	}
	target := r.Header.Get("X-Amz-Target")
	action, ok := strings.CutPrefix(target, "TrentService.")
	if !ok || !slices.Contains([]string{DescribeKey, GetPublicKey, CreateKey, Sign, ScheduleKeyDeletion}, action) {
		return "", "", nil, fail("UnknownOperationException", "X-Amz-Target %q", target)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-amz-json-1.1" {
		return "", "", nil, fail("SerializationException", "Content-Type %q, want application/x-amz-json-1.1", ct)
	}
	// Authorization: AWS4-HMAC-SHA256 Credential=AKID/20260101/REGION/kms/aws4_request, SignedHeaders=…, Signature=…
	auth := r.Header.Get("Authorization")
	rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 Credential=")
	if !ok {
		return "", "", nil, fail("MissingAuthenticationTokenException", "no SigV4 Authorization header")
	}
	cred, _, _ := strings.Cut(rest, ",")
	scope := strings.Split(cred, "/")
	if len(scope) != 5 || scope[3] != "kms" || scope[4] != "aws4_request" || !strings.Contains(auth, "Signature=") {
		return "", "", nil, fail("IncompleteSignatureException", "credential scope %q", cred)
	}
	if scope[0] != AccessKeyID {
		return "", "", nil, fail("UnrecognizedClientException", "the security token included in the request is invalid")
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return "", "", nil, fail("SerializationException", "reading the body: %v", err)
	}
	return action, scope[2], body, nil
}

// begin counts a call, takes its fault, waits the latency, and fails the
// call if the fault says so.
func (s *Server) begin(ctx context.Context, action string) (Fault, *apiError) {
	f, err := s.Injector.Begin(ctx, action)
	if err != nil { // the client gave up; nobody reads the answer
		return f, fail("RequestTimeoutException", "the client went away")
	}
	if f.Code != "" {
		status := f.Status
		if status == 0 {
			status = StatusOf(f.Code)
		}
		return f, &apiError{status: status, code: f.Code, message: "awskmsfake: injected " + f.Code}
	}
	if f.Status != 0 {
		return f, &apiError{status: f.Status, message: "awskmsfake: injected HTTP status"}
	}
	return f, nil
}

func (s *Server) writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("X-Amzn-Requestid", s.requestID())
	if e.code == "" {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(e.status)
		fmt.Fprintf(w, "<html><body>%d %s</body></html>", e.status, http.StatusText(e.status))
		return
	}
	b, _ := json.Marshal(map[string]string{"__type": e.code, "message": e.message})
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.WriteHeader(e.status)
	_, _ = w.Write(b)
}

// metadata is KeyMetadata as the service sends it.
type metadata struct {
	AWSAccountId          string
	KeyId                 string
	Arn                   string
	CreationDate          float64 // epoch seconds
	Enabled               bool
	Description           string
	KeyUsage              string
	KeyState              string
	Origin                string
	KeyManager            string
	CustomerMasterKeySpec string
	KeySpec               string
	SigningAlgorithms     []string `json:",omitempty"`
	EncryptionAlgorithms  []string `json:",omitempty"`
	MacAlgorithms         []string `json:",omitempty"`
	MultiRegion           bool
	DeletionDate          float64 `json:",omitempty"` // epoch seconds
}

func decode(body []byte, v any) *apiError {
	if err := json.Unmarshal(body, v); err != nil {
		return fail("SerializationException", "decoding the request: %v", err)
	}
	return nil
}

// lookup finds the key id names in region: a key id, key ARN, alias name or
// alias ARN. Call with s.mu held.
func (s *Server) lookup(region, id string) (*key, *apiError) {
	if id == "" {
		return nil, fail("ValidationException", "1 validation error detected: Value null at 'keyId' failed to satisfy constraint: Member must not be null")
	}
	name := id
	if strings.HasPrefix(id, "arn:") {
		parts := strings.SplitN(id, ":", 6)
		if len(parts) != 6 || parts[2] != "kms" {
			return nil, fail("InvalidArnException", "invalid arn %s", id)
		}
		if parts[3] != region || parts[4] != Account {
			return nil, fail("NotFoundException", "Key '%s' does not exist", id)
		}
		name = parts[5]
		if kid, ok := strings.CutPrefix(name, "key/"); ok {
			name = kid
		} else if !strings.HasPrefix(name, "alias/") {
			return nil, fail("InvalidArnException", "invalid arn %s", id)
		}
	}
	if strings.HasPrefix(name, "alias/") {
		kid, ok := s.aliases[region+"/"+name]
		if !ok {
			return nil, fail("NotFoundException", "Alias %s is not found.", id)
		}
		name = kid
	}
	k, ok := s.keys[name]
	if !ok || !strings.HasPrefix(k.meta.Arn, "arn:aws:kms:"+region+":") {
		return nil, fail("NotFoundException", "Key '%s' does not exist", id)
	}
	return k, nil
}

// usable is the service's check before a cryptographic operation.
func usable(m metadata) *apiError {
	switch m.KeyState {
	case "Enabled":
		return nil
	case "Disabled":
		return fail("DisabledException", "%s is disabled.", m.Arn)
	default:
		return fail("KMSInvalidStateException", "%s is %s.", m.Arn, m.KeyState)
	}
}

func (s *Server) describeKey(region string, body []byte) (any, *apiError) {
	var req struct{ KeyId string }
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k, err := s.lookup(region, req.KeyId)
	if err != nil {
		return nil, err
	}
	return map[string]any{"KeyMetadata": k.meta}, nil
}

func (s *Server) getPublicKey(region string, body []byte, f Fault) (any, *apiError) {
	var req struct{ KeyId string }
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	k, err := s.lookup(region, req.KeyId)
	var meta metadata
	if k != nil {
		meta = k.meta
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if meta.KeySpec == "SYMMETRIC_DEFAULT" || strings.HasPrefix(meta.KeySpec, "HMAC_") {
		return nil, fail("UnsupportedOperationException", "%s is not an asymmetric key", meta.Arn)
	}
	if meta.KeyState == "Disabled" {
		return nil, fail("DisabledException", "%s is disabled.", meta.Arn)
	}
	if meta.KeyState == "PendingDeletion" || meta.KeyState == "PendingImport" {
		return nil, fail("KMSInvalidStateException", "%s is %s.", meta.Arn, meta.KeyState)
	}
	if k.priv == nil {
		return nil, fail("KMSInternalException", "awskmsfake has no key material for %s", meta.KeySpec)
	}
	der, merr := x509.MarshalPKIXPublicKey(k.priv.Public())
	if merr != nil {
		return nil, fail("KMSInternalException", "encoding the public key: %v", merr)
	}
	arn := meta.Arn
	if f.WrongKeyID {
		arn = otherARN(arn)
	}
	out := map[string]any{
		"KeyId":                 arn,
		"PublicKey":             der,
		"CustomerMasterKeySpec": meta.CustomerMasterKeySpec,
		"KeySpec":               meta.KeySpec,
		"KeyUsage":              meta.KeyUsage,
	}
	if meta.SigningAlgorithms != nil {
		out["SigningAlgorithms"] = meta.SigningAlgorithms
	}
	return out, nil
}

func (s *Server) createKey(region string, body []byte) (any, *apiError) {
	var req struct {
		KeySpec     string
		KeyUsage    string
		Description string
		Origin      string
	}
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.creates = append(s.creates, CreateKeyRequest{Region: region, KeySpec: req.KeySpec, KeyUsage: req.KeyUsage, Description: req.Description})
	s.mu.Unlock()
	spec, usage := req.KeySpec, req.KeyUsage
	if spec == "" {
		spec = "SYMMETRIC_DEFAULT"
	}
	if usage == "" {
		usage = "ENCRYPT_DECRYPT"
	}
	if _, ok := specs()[spec]; !ok {
		return nil, fail("ValidationException", "1 validation error detected: Value '%s' at 'keySpec' failed to satisfy enum value set", spec)
	}
	if !slices.Contains(usages(spec), usage) {
		return nil, fail("ValidationException", "KeyUsage %s is not compatible with KeySpec %s", usage, spec)
	}
	if req.Origin != "" && req.Origin != "AWS_KMS" {
		return nil, fail("UnsupportedOperationException", "awskmsfake makes only AWS_KMS keys")
	}
	k, err := s.newKey(region, spec, usage, req.Description)
	if err != nil {
		return nil, fail("KMSInternalException", "%v", err)
	}
	s.mu.Lock()
	s.keys[k.meta.KeyId] = k
	s.mu.Unlock()
	return map[string]any{"KeyMetadata": k.meta}, nil
}

func (s *Server) scheduleKeyDeletion(region string, body []byte) (any, *apiError) {
	var req struct {
		KeyId               string
		PendingWindowInDays *int
	}
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	days := 30
	if req.PendingWindowInDays != nil {
		days = *req.PendingWindowInDays
	}
	if days < 7 || days > 30 {
		return nil, fail("ValidationException", "1 validation error detected: Value '%d' at 'pendingWindowInDays' failed to satisfy constraint: Member must have value between 7 and 30", days)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k, err := s.lookup(region, req.KeyId)
	if err != nil {
		return nil, err
	}
	if k.meta.KeyState == "PendingDeletion" {
		return nil, fail("KMSInvalidStateException", "%s is pending deletion.", k.meta.Arn)
	}
	when := time.Now().Add(time.Duration(days) * 24 * time.Hour)
	k.meta.KeyState, k.meta.Enabled = "PendingDeletion", false
	k.meta.DeletionDate = float64(when.Unix())
	return map[string]any{"KeyId": k.meta.Arn, "KeyState": k.meta.KeyState, "DeletionDate": k.meta.DeletionDate, "PendingWindowInDays": days}, nil
}

func (s *Server) sign(region string, body []byte, f Fault) (any, *apiError) {
	var req struct {
		KeyId            string
		Message          []byte
		MessageType      string
		SigningAlgorithm string
		GrantTokens      []string
		DryRun           bool
	}
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.signs = append(s.signs, SignRequest{Region: region, KeyID: req.KeyId, SigningAlgorithm: req.SigningAlgorithm, MessageType: req.MessageType, Message: slices.Clone(req.Message)})
	k, err := s.lookup(region, req.KeyId)
	var meta metadata
	if k != nil {
		meta = k.meta
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if len(req.Message) == 0 || req.SigningAlgorithm == "" {
		return nil, fail("ValidationException", "Message and SigningAlgorithm are required")
	}
	if err := usable(meta); err != nil {
		return nil, err
	}
	if meta.KeyUsage != "SIGN_VERIFY" {
		return nil, fail("InvalidKeyUsageException", "%s key usage is %s, not SIGN_VERIFY", meta.Arn, meta.KeyUsage)
	}
	if !slices.Contains(meta.SigningAlgorithms, req.SigningAlgorithm) {
		return nil, fail("InvalidKeyUsageException", "%s is not a supported signing algorithm for %s (%s)", req.SigningAlgorithm, meta.Arn, meta.KeySpec)
	}
	alg, ok := signingAlgorithms()[req.SigningAlgorithm]
	if !ok || k.priv == nil {
		return nil, fail("KMSInternalException", "awskmsfake cannot sign with %s on %s", req.SigningAlgorithm, meta.KeySpec)
	}
	msg := req.Message
	if f.WrongSignature {
		msg = slices.Clone(msg)
		msg[0] ^= 0xff
	}
	sig, err := alg.sign(k.priv, req.MessageType, msg)
	if err != nil {
		return nil, err
	}
	arn, used := meta.Arn, req.SigningAlgorithm
	if f.WrongKeyID {
		arn = otherARN(arn)
	}
	if f.WrongAlgorithm {
		used = otherAlgorithm(used, meta.SigningAlgorithms)
	}
	return signResponse{KeyId: arn, Signature: sig, SigningAlgorithm: used}, nil
}

type signResponse struct {
	KeyId            string
	Signature        []byte
	SigningAlgorithm string
}

// signingAlgorithm is how the service signs with one SigningAlgorithmSpec.
type signingAlgorithm struct {
	hash crypto.Hash // the digest a DIGEST message must be, and RAW is hashed with
	kind string      // "ecdsa", "pkcs1", "pss", "ed25519", "ed25519ph"
}

func signingAlgorithms() map[string]signingAlgorithm {
	return map[string]signingAlgorithm{
		"ECDSA_SHA_256":             {crypto.SHA256, "ecdsa"},
		"ECDSA_SHA_384":             {crypto.SHA384, "ecdsa"},
		"ECDSA_SHA_512":             {crypto.SHA512, "ecdsa"},
		"RSASSA_PKCS1_V1_5_SHA_256": {crypto.SHA256, "pkcs1"},
		"RSASSA_PKCS1_V1_5_SHA_384": {crypto.SHA384, "pkcs1"},
		"RSASSA_PKCS1_V1_5_SHA_512": {crypto.SHA512, "pkcs1"},
		"RSASSA_PSS_SHA_256":        {crypto.SHA256, "pss"},
		"RSASSA_PSS_SHA_384":        {crypto.SHA384, "pss"},
		"RSASSA_PSS_SHA_512":        {crypto.SHA512, "pss"},
		"ED25519_SHA_512":           {0, "ed25519"},
		"ED25519_PH_SHA_512":        {crypto.SHA512, "ed25519ph"},
	}
}

// sign signs msg as the service does for messageType: a DIGEST must be the
// algorithm's digest; a RAW message (the default) is hashed first, except
// by ED25519_SHA_512, which signs it as it is and takes nothing else.
func (a signingAlgorithm) sign(priv crypto.Signer, messageType string, msg []byte) ([]byte, *apiError) {
	var digest []byte
	switch messageType {
	case "", "RAW":
		if len(msg) > maxRawMessage {
			return nil, fail("ValidationException", "a RAW message must be at most %d bytes", maxRawMessage)
		}
		if a.kind == "ed25519" {
			return ed25519.Sign(priv.(ed25519.PrivateKey), msg), nil
		}
		h := a.hash.New()
		h.Write(msg)
		digest = h.Sum(nil)
	case "DIGEST":
		if a.kind == "ed25519" {
			return nil, fail("ValidationException", "ED25519_SHA_512 requires MessageType RAW")
		}
		if len(msg) != a.hash.Size() {
			return nil, fail("ValidationException", "Digest is invalid length for algorithm: %d bytes, want %d", len(msg), a.hash.Size())
		}
		digest = msg
	default:
		return nil, fail("ValidationException", "MessageType %s is not valid for this key", messageType)
	}
	var (
		sig []byte
		err error
	)
	switch k := priv.(type) {
	case *ecdsa.PrivateKey:
		if a.kind == "ecdsa" {
			sig, err = ecdsa.SignASN1(rand.Reader, k, digest)
		}
	case *rsa.PrivateKey:
		switch a.kind {
		case "pkcs1":
			sig, err = rsa.SignPKCS1v15(rand.Reader, k, a.hash, digest)
		case "pss":
			sig, err = rsa.SignPSS(rand.Reader, k, a.hash, digest, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
		}
	case ed25519.PrivateKey:
		if a.kind == "ed25519ph" {
			sig, err = k.Sign(nil, digest, &ed25519.Options{Hash: crypto.SHA512})
		}
	}
	if err != nil {
		return nil, fail("KMSInternalException", "signing: %v", err)
	}
	if sig == nil {
		return nil, fail("InvalidKeyUsageException", "the key cannot sign with this algorithm")
	}
	return sig, nil
}

// spec is what AWS KMS offers for one key spec.
type spec struct {
	usages  []string // the first is the default
	signing []string // for SIGN_VERIFY; PSS first for RSA, as the service lists them
}

func specs() map[string]spec {
	rsaSigning := []string{"RSASSA_PSS_SHA_256", "RSASSA_PSS_SHA_384", "RSASSA_PSS_SHA_512",
		"RSASSA_PKCS1_V1_5_SHA_256", "RSASSA_PKCS1_V1_5_SHA_384", "RSASSA_PKCS1_V1_5_SHA_512"}
	return map[string]spec{
		"SYMMETRIC_DEFAULT":     {usages: []string{"ENCRYPT_DECRYPT"}},
		"RSA_2048":              {usages: []string{"ENCRYPT_DECRYPT", "SIGN_VERIFY"}, signing: rsaSigning},
		"RSA_3072":              {usages: []string{"ENCRYPT_DECRYPT", "SIGN_VERIFY"}, signing: rsaSigning},
		"RSA_4096":              {usages: []string{"ENCRYPT_DECRYPT", "SIGN_VERIFY"}, signing: rsaSigning},
		"ECC_NIST_P256":         {usages: []string{"SIGN_VERIFY", "KEY_AGREEMENT"}, signing: []string{"ECDSA_SHA_256"}},
		"ECC_NIST_P384":         {usages: []string{"SIGN_VERIFY", "KEY_AGREEMENT"}, signing: []string{"ECDSA_SHA_384"}},
		"ECC_NIST_P521":         {usages: []string{"SIGN_VERIFY", "KEY_AGREEMENT"}, signing: []string{"ECDSA_SHA_512"}},
		"ECC_SECG_P256K1":       {usages: []string{"SIGN_VERIFY"}, signing: []string{"ECDSA_SHA_256"}},
		"ECC_NIST_EDWARDS25519": {usages: []string{"SIGN_VERIFY"}, signing: []string{"ED25519_SHA_512", "ED25519_PH_SHA_512"}},
		"HMAC_224":              {usages: []string{"GENERATE_VERIFY_MAC"}},
		"HMAC_256":              {usages: []string{"GENERATE_VERIFY_MAC"}},
		"HMAC_384":              {usages: []string{"GENERATE_VERIFY_MAC"}},
		"HMAC_512":              {usages: []string{"GENERATE_VERIFY_MAC"}},
		"SM2":                   {usages: []string{"ENCRYPT_DECRYPT", "SIGN_VERIFY", "KEY_AGREEMENT"}, signing: []string{"SM2DSA"}},
		"ML_DSA_44":             {usages: []string{"SIGN_VERIFY"}, signing: []string{"ML_DSA_SHAKE_256"}},
		"ML_DSA_65":             {usages: []string{"SIGN_VERIFY"}, signing: []string{"ML_DSA_SHAKE_256"}},
		"ML_DSA_87":             {usages: []string{"SIGN_VERIFY"}, signing: []string{"ML_DSA_SHAKE_256"}},
	}
}

func usages(keySpec string) []string { return specs()[keySpec].usages }

// defaultUsage is AddKey's usage for a key spec: SIGN_VERIFY where the spec
// allows it.
func defaultUsage(keySpec string) string {
	u := usages(keySpec)
	if slices.Contains(u, "SIGN_VERIFY") {
		return "SIGN_VERIFY"
	}
	if len(u) > 0 {
		return u[0]
	}
	return "SIGN_VERIFY"
}

// newKey makes an Enabled key of keySpec and usage in region, not yet
// stored.
func (s *Server) newKey(region, keySpec, usage, description string) (*key, error) {
	sp, ok := specs()[keySpec]
	if !ok {
		return nil, fmt.Errorf("awskmsfake: no key spec %q", keySpec)
	}
	priv, err := s.keyMaterial(keySpec)
	if err != nil {
		return nil, err
	}
	id := newKeyID()
	m := metadata{
		AWSAccountId:          Account,
		KeyId:                 id,
		Arn:                   fmt.Sprintf("arn:aws:kms:%s:%s:key/%s", region, Account, id),
		CreationDate:          float64(time.Now().Unix()),
		Enabled:               true,
		Description:           description,
		KeyUsage:              usage,
		KeyState:              "Enabled",
		Origin:                "AWS_KMS",
		KeyManager:            "CUSTOMER",
		CustomerMasterKeySpec: keySpec,
		KeySpec:               keySpec,
	}
	switch usage {
	case "SIGN_VERIFY":
		m.SigningAlgorithms = slices.Clone(sp.signing)
	case "ENCRYPT_DECRYPT":
		if keySpec == "SYMMETRIC_DEFAULT" {
			m.EncryptionAlgorithms = []string{"SYMMETRIC_DEFAULT"}
		} else {
			m.EncryptionAlgorithms = []string{"RSAES_OAEP_SHA_1", "RSAES_OAEP_SHA_256"}
		}
	case "GENERATE_VERIFY_MAC":
		m.MacAlgorithms = []string{strings.Replace(keySpec, "HMAC_", "HMAC_SHA_", 1)}
	}
	return &key{meta: m, priv: priv}, nil
}

// keyMaterial makes a private key of keySpec (nil for specs Go cannot
// make), or returns the shared one under ReuseKeyMaterial.
func (s *Server) keyMaterial(keySpec string) (crypto.Signer, error) {
	shape, ok := map[string]string{
		"ECC_NIST_P256": testkeys.P256, "ECC_NIST_P384": testkeys.P384, "ECC_NIST_P521": testkeys.P521,
		"ECC_NIST_EDWARDS25519": testkeys.Ed25519,
		"RSA_2048":              testkeys.RSA2048, "RSA_3072": testkeys.RSA3072, "RSA_4096": testkeys.RSA4096,
	}[keySpec]
	if !ok {
		return nil, nil // SYMMETRIC_DEFAULT, HMAC, SM2, secp256k1, ML-DSA: metadata only
	}
	return s.material.Get(shape)
}

func newKeyID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// requestID is a request id unique within the server; cheaper than
// newKeyID, as the server makes one per call.
func (s *Server) requestID() string {
	return fmt.Sprintf("00000000-0000-4000-8000-%012x", s.requests.Add(1))
}

// otherARN is an ARN of another key in arn's region and account.
func otherARN(arn string) string {
	i := strings.LastIndex(arn, "/")
	return arn[:i+1] + "00000000-0000-0000-0000-000000000000"
}

// otherAlgorithm is a signing algorithm other than alg, from list if it has
// one.
func otherAlgorithm(alg string, list []string) string {
	for _, a := range list {
		if a != alg {
			return a
		}
	}
	if alg == "ECDSA_SHA_384" {
		return "ECDSA_SHA_256"
	}
	return "ECDSA_SHA_384"
}
