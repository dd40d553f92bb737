// Package gcpkmsfake is an in-process Cloud KMS for tests: a real gRPC server
// of google.cloud.kms.v1.KeyManagementService on a loopback port, with real
// keys, real signatures and real CRC32C checksums, and faults to inject —
// latency, error codes, corrupted checksums, wrong signatures, wrong names.
//
// It serves GetCryptoKey, GetCryptoKeyVersion, GetPublicKey,
// CreateCryptoKeyVersion and AsymmetricSign, checking requests the way the
// service does (digest type and length, request checksums, key state and
// purpose). Key versions made by CreateCryptoKeyVersion start
// PENDING_GENERATION and leave that state after SetGeneration's number of
// polls. A Server is safe for concurrent use.
package gcpkmsfake

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/kms/apiv1/kmspb"
	"github.com/keyward/keyward/internal/crc32c"
	"github.com/keyward/keyward/testsupport/faults"
	"github.com/keyward/keyward/testsupport/testkeys"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Methods the server counts calls of and injects faults into.
const (
	GetCryptoKey           = "GetCryptoKey"
	GetCryptoKeyVersion    = "GetCryptoKeyVersion"
	GetPublicKey           = "GetPublicKey"
	CreateCryptoKeyVersion = "CreateCryptoKeyVersion"
	AsymmetricSign         = "AsymmetricSign"
	// DestroyCryptoKeyVersion schedules a version's destruction 30 days
	// on (the service's default destroy-scheduled duration); it then signs
	// nothing.
	DestroyCryptoKeyVersion = "DestroyCryptoKeyVersion"
)

// ChecksumMismatchMessage is Cloud KMS's INVALID_ARGUMENT message for a
// request field that does not match its CRC32C, for field "digest" or
// "data". The API asks clients to retry such a request a limited number
// of times.
func ChecksumMismatchMessage(field string) string {
	return fmt.Sprintf("The checksum in field %s_crc32c did not match the data in field %s.", field, field)
}

// Always, as Inject's times, injects the fault into every call until
// ClearFaults.
const Always = faults.Always

// Algorithm is a Cloud KMS key version algorithm.
type Algorithm = kmspb.CryptoKeyVersion_CryptoKeyVersionAlgorithm

// State is a Cloud KMS key version state.
type State = kmspb.CryptoKeyVersion_CryptoKeyVersionState

// Fault is what the server does to one call instead of answering it
// faithfully. Fields that do not apply to a method are ignored.
type Fault struct {
	// Code, if not OK, fails the call with this status code.
	Code codes.Code
	// CorruptChecksum makes the answer's checksum (AsymmetricSign:
	// SignatureCrc32c; GetPublicKey: PemCrc32c) off by one.
	CorruptChecksum bool
	// WrongSignature makes AsymmetricSign sign another digest (or message),
	// with a correct SignatureCrc32c: only verifying the signature catches it.
	WrongSignature bool
	// UnverifiedChecksum makes AsymmetricSign answer as if it had not
	// checked the request's digest or data CRC32C.
	UnverifiedChecksum bool
	// RefuseChecksum makes AsymmetricSign refuse a request that carries a
	// digest or data CRC32C as Cloud KMS does when what it received does
	// not match that checksum (corrupted on the way): INVALID_ARGUMENT with
	// the service's message, ChecksumMismatchMessage.
	RefuseChecksum bool
	// WrongName makes the answer name another key version.
	WrongName bool
}

// Options configure a Server. The zero value is usable.
type Options struct {
	// ReuseKeys gives every key version of one key shape (curve, RSA size)
	// the same private key, generated once per Server, to spare tests RSA
	// key generation.
	ReuseKeys bool
}

// Server is the fake Cloud KMS.
type Server struct {
	kmspb.UnimplementedKeyManagementServiceServer
	// Injector gives the Server SetLatency, Inject, ClearFaults and Calls,
	// keyed by method name.
	faults.Injector[Fault]

	opts Options
	srv  *grpc.Server
	addr string

	mu           sync.Mutex
	keys         map[string]*kmspb.CryptoKey // by name
	next         map[string]int              // next version number, by key name
	versions     map[string]*version         // by name
	pendingPolls int
	generated    State
	shared       *testkeys.Pool
}

type version struct {
	pb    *kmspb.CryptoKeyVersion
	key   crypto.Signer // nil for keys without a public key
	polls int           // PENDING_GENERATION polls left
	final State         // the state after them
}

// Start serves a new, empty fake on 127.0.0.1. Close stops it.
func Start(opts Options) (*Server, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for the fake Cloud KMS: %w", err)
	}
	s := &Server{
		opts:      opts,
		srv:       grpc.NewServer(),
		addr:      lis.Addr().String(),
		keys:      map[string]*kmspb.CryptoKey{},
		next:      map[string]int{},
		versions:  map[string]*version{},
		generated: kmspb.CryptoKeyVersion_ENABLED,
		shared:    &testkeys.Pool{Reuse: opts.ReuseKeys},
	}
	kmspb.RegisterKeyManagementServiceServer(s.srv, s)
	go func() { _ = s.srv.Serve(lis) }() // returns when Close stops the server
	return s, nil
}

// Close stops the server, ending calls in flight.
func (s *Server) Close() { s.srv.Stop() }

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.addr }

// ClientOptions make the real Cloud KMS client talk to this server over
// plaintext gRPC, without credentials.
func (s *Server) ClientOptions() []option.ClientOption {
	return []option.ClientOption{
		option.WithEndpoint(s.addr),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
	}
}

// AddCryptoKey adds a crypto key, without versions, whose versions have alg.
// name is "projects/P/locations/L/keyRings/R/cryptoKeys/K".
func (s *Server) AddCryptoKey(name string, alg Algorithm) error {
	if !validName(name, 8) {
		return fmt.Errorf("gcpkmsfake: %q is not a crypto key name", name)
	}
	sp, ok := specs()[alg]
	if !ok {
		return fmt.Errorf("gcpkmsfake: algorithm %s is not modelled", alg)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.keys[name]; dup {
		return fmt.Errorf("gcpkmsfake: crypto key %s exists", name)
	}
	s.keys[name] = &kmspb.CryptoKey{
		Name:       name,
		Purpose:    sp.purpose,
		CreateTime: timestamppb.Now(),
		VersionTemplate: &kmspb.CryptoKeyVersionTemplate{
			Algorithm:       alg,
			ProtectionLevel: kmspb.ProtectionLevel_SOFTWARE,
		},
	}
	s.next[name] = 1
	return nil
}

// AddVersion adds an ENABLED version, with a new key, to a crypto key and
// returns its name.
func (s *Server) AddVersion(keyName string) (string, error) {
	v, err := s.newVersion(keyName, kmspb.CryptoKeyVersion_ENABLED)
	if err != nil {
		return "", err
	}
	return v.pb.GetName(), nil
}

// SetState sets a key version's state (DISABLED, DESTROYED, …).
func (s *Server) SetState(versionName string, st State) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.versions[versionName]
	if !ok {
		return fmt.Errorf("gcpkmsfake: no key version %s", versionName)
	}
	v.pb.State = st
	return nil
}

// SetGeneration says what becomes of versions CreateCryptoKeyVersion makes
// from now on: polls GetCryptoKeyVersion answers say PENDING_GENERATION, and
// the next says final. The default is 0 polls, then ENABLED.
func (s *Server) SetGeneration(polls int, final State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pendingPolls, s.generated = polls, final
}

// begin counts a call, takes its fault, waits the latency, and fails the
// call if the fault or the call's context says so.
func (s *Server) begin(ctx context.Context, method string) (Fault, error) {
	f, err := s.Injector.Begin(ctx, method)
	if err != nil {
		return f, status.FromContextError(err).Err()
	}
	if f.Code != codes.OK {
		return f, status.Errorf(f.Code, "gcpkmsfake: injected %s", f.Code)
	}
	return f, nil
}

// GetCryptoKey returns a crypto key's metadata.
func (s *Server) GetCryptoKey(ctx context.Context, req *kmspb.GetCryptoKeyRequest) (*kmspb.CryptoKey, error) {
	f, err := s.begin(ctx, GetCryptoKey)
	if err != nil {
		return nil, err
	}
	if !validName(req.GetName(), 8) {
		return nil, status.Errorf(codes.InvalidArgument, "gcpkmsfake: %q is not a crypto key name", req.GetName())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.keys[req.GetName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "CryptoKey %s not found.", req.GetName())
	}
	out := proto.CloneOf(k)
	if f.WrongName {
		out.Name += "x"
	}
	return out, nil
}

// GetCryptoKeyVersion returns a key version's metadata; each call on a
// version being generated counts as one poll.
func (s *Server) GetCryptoKeyVersion(ctx context.Context, req *kmspb.GetCryptoKeyVersionRequest) (*kmspb.CryptoKeyVersion, error) {
	f, err := s.begin(ctx, GetCryptoKeyVersion)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.version(req.GetName())
	if err != nil {
		return nil, err
	}
	if v.pb.GetState() == kmspb.CryptoKeyVersion_PENDING_GENERATION {
		if v.polls > 0 {
			v.polls--
		} else {
			v.pb.State = v.final
			if v.final == kmspb.CryptoKeyVersion_ENABLED {
				v.pb.GenerateTime = timestamppb.Now()
			}
		}
	}
	out := proto.CloneOf(v.pb)
	if f.WrongName {
		out.Name = otherVersion(out.Name)
	}
	return out, nil
}

// GetPublicKey returns an enabled asymmetric key version's public key, PEM
// encoded, with its CRC32C.
func (s *Server) GetPublicKey(ctx context.Context, req *kmspb.GetPublicKeyRequest) (*kmspb.PublicKey, error) {
	f, err := s.begin(ctx, GetPublicKey)
	if err != nil {
		return nil, err
	}
	v, err := s.usable(req.GetName())
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(v.key.Public())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "gcpkmsfake: encoding public key: %v", err)
	}
	p := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	sum := crc32c.Checksum([]byte(p))
	if f.CorruptChecksum {
		sum++
	}
	name := v.pb.GetName()
	if f.WrongName {
		name = otherVersion(name)
	}
	return &kmspb.PublicKey{
		Pem:             p,
		PemCrc32C:       wrapperspb.Int64(sum),
		Algorithm:       v.pb.GetAlgorithm(),
		Name:            name,
		ProtectionLevel: v.pb.GetProtectionLevel(),
	}, nil
}

// CreateCryptoKeyVersion adds a version to a crypto key. Asymmetric versions
// start PENDING_GENERATION (see SetGeneration).
func (s *Server) CreateCryptoKeyVersion(ctx context.Context, req *kmspb.CreateCryptoKeyVersionRequest) (*kmspb.CryptoKeyVersion, error) {
	f, err := s.begin(ctx, CreateCryptoKeyVersion)
	if err != nil {
		return nil, err
	}
	if !validName(req.GetParent(), 8) {
		return nil, status.Errorf(codes.InvalidArgument, "gcpkmsfake: %q is not a crypto key name", req.GetParent())
	}
	v, err := s.newVersion(req.GetParent(), kmspb.CryptoKeyVersion_PENDING_GENERATION)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := proto.CloneOf(v.pb)
	if f.WrongName {
		out.Name = otherVersion(out.Name)
	}
	return out, nil
}

// DestroyCryptoKeyVersion makes an ENABLED or DISABLED version
// DESTROY_SCHEDULED, 30 days on.
func (s *Server) DestroyCryptoKeyVersion(ctx context.Context, req *kmspb.DestroyCryptoKeyVersionRequest) (*kmspb.CryptoKeyVersion, error) {
	if _, err := s.begin(ctx, DestroyCryptoKeyVersion); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.version(req.GetName())
	if err != nil {
		return nil, err
	}
	switch st := v.pb.GetState(); st {
	case kmspb.CryptoKeyVersion_ENABLED, kmspb.CryptoKeyVersion_DISABLED:
	default:
		return nil, status.Errorf(codes.FailedPrecondition, "%s is not enabled or disabled, current state is: %s.", req.GetName(), st)
	}
	v.pb.State = kmspb.CryptoKeyVersion_DESTROY_SCHEDULED
	v.pb.DestroyTime = timestamppb.New(time.Now().Add(30 * 24 * time.Hour))
	return proto.CloneOf(v.pb), nil
}

// AsymmetricSign signs a digest (Ed25519 and raw PKCS#1: data) with an
// enabled signing key version, checking the request's CRC32C if it has one.
func (s *Server) AsymmetricSign(ctx context.Context, req *kmspb.AsymmetricSignRequest) (*kmspb.AsymmetricSignResponse, error) {
	f, err := s.begin(ctx, AsymmetricSign)
	if err != nil {
		return nil, err
	}
	v, err := s.usable(req.GetName())
	if err != nil {
		return nil, err
	}
	sp := specs()[v.pb.GetAlgorithm()]
	if sp.purpose != kmspb.CryptoKey_ASYMMETRIC_SIGN {
		return nil, status.Errorf(codes.FailedPrecondition, "gcpkmsfake: %s is a %s key, not ASYMMETRIC_SIGN", req.GetName(), sp.purpose)
	}
	resp := &kmspb.AsymmetricSignResponse{Name: v.pb.GetName(), ProtectionLevel: v.pb.GetProtectionLevel()}
	var msg []byte
	if sp.hash == 0 {
		if req.GetDigest() != nil {
			return nil, status.Errorf(codes.InvalidArgument, "gcpkmsfake: %s signs data, not a digest", v.pb.GetAlgorithm())
		}
		msg = req.GetData()
		if c := req.GetDataCrc32C(); c != nil {
			if f.RefuseChecksum || c.GetValue() != crc32c.Checksum(msg) {
				return nil, status.Error(codes.InvalidArgument, ChecksumMismatchMessage("data"))
			}
			resp.VerifiedDataCrc32C = true
		}
	} else {
		if len(req.GetData()) > 0 {
			return nil, status.Errorf(codes.InvalidArgument, "gcpkmsfake: %s signs a digest, not data", v.pb.GetAlgorithm())
		}
		switch sp.hash {
		case crypto.SHA256:
			msg = req.GetDigest().GetSha256()
		case crypto.SHA384:
			msg = req.GetDigest().GetSha384()
		case crypto.SHA512:
			msg = req.GetDigest().GetSha512()
		}
		if len(msg) != sp.hash.Size() {
			return nil, status.Errorf(codes.InvalidArgument, "gcpkmsfake: %s needs a %v digest of %d bytes", v.pb.GetAlgorithm(), sp.hash, sp.hash.Size())
		}
		if c := req.GetDigestCrc32C(); c != nil {
			if f.RefuseChecksum || c.GetValue() != crc32c.Checksum(msg) {
				return nil, status.Error(codes.InvalidArgument, ChecksumMismatchMessage("digest"))
			}
			resp.VerifiedDigestCrc32C = true
		}
	}
	if f.WrongSignature {
		msg = append([]byte(nil), msg...)
		if len(msg) == 0 {
			msg = append(msg, 0)
		}
		msg[0] ^= 0xff
	}
	sig, err := sign(v.key, sp, msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "gcpkmsfake: signing: %v", err)
	}
	resp.Signature = sig
	sum := crc32c.Checksum(sig)
	if f.CorruptChecksum {
		sum++
	}
	resp.SignatureCrc32C = wrapperspb.Int64(sum)
	if f.UnverifiedChecksum {
		resp.VerifiedDigestCrc32C, resp.VerifiedDataCrc32C = false, false
	}
	if f.WrongName {
		resp.Name = otherVersion(resp.Name)
	}
	return resp, nil
}

// newVersion makes a version of keyName in state st, generating its key
// outside the lock.
func (s *Server) newVersion(keyName string, st State) (*version, error) {
	s.mu.Lock()
	k, ok := s.keys[keyName]
	if !ok {
		s.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "CryptoKey %s not found.", keyName)
	}
	alg := k.GetVersionTemplate().GetAlgorithm()
	n := s.next[keyName]
	s.next[keyName]++
	polls, final := s.pendingPolls, s.generated
	s.mu.Unlock()

	sp := specs()[alg]
	key, err := s.generate(sp.shape)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "gcpkmsfake: generating %s key: %v", alg, err)
	}
	v := &version{
		pb: &kmspb.CryptoKeyVersion{
			Name:            keyName + "/cryptoKeyVersions/" + strconv.Itoa(n),
			State:           st,
			Algorithm:       alg,
			ProtectionLevel: kmspb.ProtectionLevel_SOFTWARE,
			CreateTime:      timestamppb.Now(),
		},
		key:   key,
		polls: polls,
		final: final,
	}
	if st == kmspb.CryptoKeyVersion_ENABLED {
		v.pb.GenerateTime = v.pb.GetCreateTime()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.versions[v.pb.GetName()] = v
	return v, nil
}

// version finds a key version; s.mu is held.
func (s *Server) version(name string) (*version, error) {
	if !validName(name, 10) {
		return nil, status.Errorf(codes.InvalidArgument, "gcpkmsfake: %q is not a crypto key version name", name)
	}
	v, ok := s.versions[name]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "CryptoKeyVersion %s not found.", name)
	}
	return v, nil
}

// usable finds an ENABLED key version that has a public key.
func (s *Server) usable(name string) (*version, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.version(name)
	if err != nil {
		return nil, err
	}
	if st := v.pb.GetState(); st != kmspb.CryptoKeyVersion_ENABLED {
		return nil, status.Errorf(codes.FailedPrecondition, "%s is not enabled, current state is: %s.", name, st)
	}
	if v.key == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%s has algorithm %s, which has no public key.", name, v.pb.GetAlgorithm())
	}
	return v, nil
}

// generate makes a private key of shape ("" for none), or returns the
// shared one under ReuseKeys.
func (s *Server) generate(shape string) (crypto.Signer, error) {
	if shape == "" {
		return nil, nil
	}
	return s.shared.Get(shape)
}

// spec is how the fake makes and uses keys of one Cloud KMS algorithm. It
// is written from Cloud KMS's documentation, independently of the
// provider's table, so that the tests cross-check the two.
type spec struct {
	purpose kmspb.CryptoKey_CryptoKeyPurpose
	shape   string      // key to generate; "" for none (symmetric, MAC)
	hash    crypto.Hash // digest AsymmetricSign takes; 0: data
	pss     bool
	raw     bool // RSA_SIGN_RAW_PKCS1_*: PKCS#1 v1.5 over data, no DigestInfo
}

func specs() map[Algorithm]spec {
	const sign, decrypt = kmspb.CryptoKey_ASYMMETRIC_SIGN, kmspb.CryptoKey_ASYMMETRIC_DECRYPT
	return map[Algorithm]spec{
		kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256:           {purpose: sign, shape: testkeys.P256, hash: crypto.SHA256},
		kmspb.CryptoKeyVersion_EC_SIGN_P384_SHA384:           {purpose: sign, shape: testkeys.P384, hash: crypto.SHA384},
		kmspb.CryptoKeyVersion_EC_SIGN_ED25519:               {purpose: sign, shape: testkeys.Ed25519},
		kmspb.CryptoKeyVersion_RSA_SIGN_PKCS1_2048_SHA256:    {purpose: sign, shape: testkeys.RSA2048, hash: crypto.SHA256},
		kmspb.CryptoKeyVersion_RSA_SIGN_PKCS1_3072_SHA256:    {purpose: sign, shape: testkeys.RSA3072, hash: crypto.SHA256},
		kmspb.CryptoKeyVersion_RSA_SIGN_PKCS1_4096_SHA256:    {purpose: sign, shape: testkeys.RSA4096, hash: crypto.SHA256},
		kmspb.CryptoKeyVersion_RSA_SIGN_PKCS1_4096_SHA512:    {purpose: sign, shape: testkeys.RSA4096, hash: crypto.SHA512},
		kmspb.CryptoKeyVersion_RSA_SIGN_PSS_2048_SHA256:      {purpose: sign, shape: testkeys.RSA2048, hash: crypto.SHA256, pss: true},
		kmspb.CryptoKeyVersion_RSA_SIGN_PSS_3072_SHA256:      {purpose: sign, shape: testkeys.RSA3072, hash: crypto.SHA256, pss: true},
		kmspb.CryptoKeyVersion_RSA_SIGN_PSS_4096_SHA256:      {purpose: sign, shape: testkeys.RSA4096, hash: crypto.SHA256, pss: true},
		kmspb.CryptoKeyVersion_RSA_SIGN_PSS_4096_SHA512:      {purpose: sign, shape: testkeys.RSA4096, hash: crypto.SHA512, pss: true},
		kmspb.CryptoKeyVersion_RSA_SIGN_RAW_PKCS1_2048:       {purpose: sign, shape: testkeys.RSA2048, raw: true},
		kmspb.CryptoKeyVersion_RSA_SIGN_RAW_PKCS1_3072:       {purpose: sign, shape: testkeys.RSA3072, raw: true},
		kmspb.CryptoKeyVersion_RSA_SIGN_RAW_PKCS1_4096:       {purpose: sign, shape: testkeys.RSA4096, raw: true},
		kmspb.CryptoKeyVersion_RSA_DECRYPT_OAEP_2048_SHA256:  {purpose: decrypt, shape: testkeys.RSA2048},
		kmspb.CryptoKeyVersion_RSA_DECRYPT_OAEP_3072_SHA256:  {purpose: decrypt, shape: testkeys.RSA3072},
		kmspb.CryptoKeyVersion_RSA_DECRYPT_OAEP_4096_SHA256:  {purpose: decrypt, shape: testkeys.RSA4096},
		kmspb.CryptoKeyVersion_HMAC_SHA256:                   {purpose: kmspb.CryptoKey_MAC},
		kmspb.CryptoKeyVersion_GOOGLE_SYMMETRIC_ENCRYPTION:   {purpose: kmspb.CryptoKey_ENCRYPT_DECRYPT},
		kmspb.CryptoKeyVersion_EXTERNAL_SYMMETRIC_ENCRYPTION: {purpose: kmspb.CryptoKey_ENCRYPT_DECRYPT},
	}
}

func sign(key crypto.Signer, sp spec, msg []byte) ([]byte, error) {
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		return ecdsa.SignASN1(rand.Reader, k, msg)
	case ed25519.PrivateKey:
		return ed25519.Sign(k, msg), nil
	case *rsa.PrivateKey:
		switch {
		case sp.raw:
			return rsa.SignPKCS1v15(rand.Reader, k, 0, msg)
		case sp.pss:
			return rsa.SignPSS(rand.Reader, k, sp.hash, msg, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
		default:
			return rsa.SignPKCS1v15(rand.Reader, k, sp.hash, msg)
		}
	}
	return nil, errors.New("no signing key")
}

// validName reports whether name is a resource name of n segments
// alternating the collections of a key version name and non-empty IDs.
func validName(name string, n int) bool {
	segs := strings.Split(name, "/")
	if len(segs) != n {
		return false
	}
	colls := []string{"projects", "locations", "keyRings", "cryptoKeys", "cryptoKeyVersions"}
	for i := 0; i < n; i += 2 {
		if segs[i] != colls[i/2] || segs[i+1] == "" {
			return false
		}
	}
	return true
}

// otherVersion is the name of a different version of the same key.
func otherVersion(name string) string { return name + "0" }
