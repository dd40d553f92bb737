package gcpkms

import (
	"context"
	"crypto"
	"fmt"
	"io"
	"time"

	"cloud.google.com/go/kms/apiv1/kmspb"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/internal/crc32c"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Signer is a Cloud KMS key version. Its public key was read once, at open;
// each signature costs one AsymmetricSign call (more when retried). It is
// safe for concurrent use.
type Signer struct {
	backends.KeyInfo
	p    *Provider
	name string // the key version's resource name
	// created: by CreateKey; only such a key may be destroyed.
	created bool
}

var _ backends.Signer = (*Signer)(nil)

// Sign implements crypto.Signer; it is SignContext without a caller's
// deadline (each call still gets CallTimeout, and retries are bounded).
func (s *Signer) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.SignContext(context.Background(), digest, opts)
}

// SignContext asks Cloud KMS to sign digest (for Ed25519, the message),
// sending its CRC32C, and returns the signature only once the service has
// confirmed the checksum it received, the answer names this key version,
// the signature's CRC32C matches, and the signature verifies against the
// public key.
func (s *Signer) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	const op, method = "sign", "AsymmetricSign"
	c := call{op: op, uri: s.URI(), part: partVersions}
	if err := ctx.Err(); err != nil {
		return nil, backends.Wrap(backends.ErrTransient, op, c.uri, "", err)
	}
	if err := s.Algorithm().CheckOpts(opts); err != nil {
		return nil, backends.Wrap(backends.ErrUnsupportedAlgorithm, op, c.uri, "", err)
	}
	req, err := s.request(digest)
	if err != nil {
		return nil, backends.Wrap(backends.ErrPermanent, op, c.uri, "", err)
	}
	client, err := s.p.kmsClient(ctx, c)
	if err != nil {
		return nil, err
	}
	var sig []byte
	refused := 0 // calls refused for a request checksum mismatch
	err = s.p.retry(ctx, c, s.p.opts.Retry.MaxAttempts, func(actx context.Context) (bool, error) {
		resp, err := client.AsymmetricSign(actx, req, noClientRetry())
		if isChecksumRefusal(err) {
			refused++
			return s.p.checksumRefusal(ctx, actx, c, method, err, req, refused)
		}
		if err != nil {
			return s.p.failed(ctx, actx, c, method, err)
		}
		if resp.GetName() != s.name {
			return invalid(c, method, "the signature is by %q", resp.GetName())
		}
		if req.DataCrc32C != nil && !resp.GetVerifiedDataCrc32C() {
			return invalid(c, method, "the service did not confirm the data's CRC32C")
		}
		if req.DigestCrc32C != nil && !resp.GetVerifiedDigestCrc32C() {
			return invalid(c, method, "the service did not confirm the digest's CRC32C")
		}
		if want := crc32c.Checksum(resp.GetSignature()); resp.GetSignatureCrc32C() == nil || resp.GetSignatureCrc32C().GetValue() != want {
			return invalid(c, method, "signature CRC32C %v does not match %d", resp.GetSignatureCrc32C().GetValue(), want)
		}
		if err := backends.VerifySignature(s.Public(), s.Algorithm(), digest, resp.GetSignature()); err != nil {
			// Retried, but permanent if it persists: a corrupted answer that
			// keeps coming back.
			return true, backends.Wrap(backends.ErrPermanent, op, c.uri, "", fmt.Errorf("checking the %s signature against the public key: %w", method, err))
		}
		sig = resp.GetSignature()
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	return sig, nil
}

// request builds the AsymmetricSign request: the digest in the field of its
// hash, or for Ed25519 the message as data, with its CRC32C.
func (s *Signer) request(digest []byte) (*kmspb.AsymmetricSignRequest, error) {
	req := &kmspb.AsymmetricSignRequest{Name: s.name}
	h := s.Algorithm().Hash()
	if h == 0 {
		req.Data = digest
		req.DataCrc32C = wrapperspb.Int64(crc32c.Checksum(digest))
		return req, nil
	}
	if len(digest) != h.Size() {
		return nil, fmt.Errorf("building the signing request: digest is %d bytes, %v digests are %d", len(digest), h, h.Size())
	}
	d := &kmspb.Digest{}
	switch h {
	case crypto.SHA256:
		d.Digest = &kmspb.Digest_Sha256{Sha256: digest}
	case crypto.SHA384:
		d.Digest = &kmspb.Digest_Sha384{Sha384: digest}
	case crypto.SHA512:
		d.Digest = &kmspb.Digest_Sha512{Sha512: digest}
	default:
		return nil, fmt.Errorf("building the signing request: %w: Cloud KMS takes no %v digests", backends.ErrUnsupportedAlgorithm, h)
	}
	req.Digest = d
	req.DigestCrc32C = wrapperspb.Int64(crc32c.Checksum(digest))
	return req, nil
}

// Close releases nothing: the Cloud KMS client belongs to the Provider.
func (s *Signer) Close() error { return nil }

var _ backends.Destroyer = (*Signer)(nil)

// Destroy schedules the key version's destruction (backends.Destroyer):
// DestroyCryptoKeyVersion. Cloud KMS keeps it DESTROY_SCHEDULED for the
// crypto key's destroy-scheduled duration (30 days unless set), during
// which RestoreCryptoKeyVersion brings it back; a version cannot be deleted
// outright.
func (s *Signer) Destroy(ctx context.Context) (string, error) {
	if !s.created {
		return "", backends.NotCreated(s.URI())
	}
	const op, method = "destroy-key", "DestroyCryptoKeyVersion"
	c := call{op: op, uri: s.URI(), part: partVersions}
	client, err := s.p.kmsClient(ctx, c)
	if err != nil {
		return "", err
	}
	var v *kmspb.CryptoKeyVersion
	err = s.p.retry(ctx, c, s.p.opts.Retry.MaxAttempts, func(actx context.Context) (bool, error) {
		resp, err := client.DestroyCryptoKeyVersion(actx, &kmspb.DestroyCryptoKeyVersionRequest{Name: s.name}, noClientRetry())
		if err != nil {
			return s.p.failed(ctx, actx, c, method, err)
		}
		v = resp
		return false, nil
	})
	if err != nil {
		return "", err
	}
	when := ""
	if t := v.GetDestroyTime(); t != nil {
		when = " at " + t.AsTime().UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("scheduled key version %s for destruction%s (state %s; gcloud kms keys versions restore undoes it until then)", s.name, when, v.GetState()), nil
}
