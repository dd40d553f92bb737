package awskms

import (
	"context"
	"crypto"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/keyward/keyward/backends"
)

// maxRawMessage is the largest message KMS signs with MessageType RAW (the
// Ed25519 case: it takes the message, not a digest).
const maxRawMessage = 4096

// Signer is an AWS KMS key. Its public key was read once, at open; each
// signature costs one KMS Sign call (more when retried). It is safe for
// concurrent use.
type Signer struct {
	backends.KeyInfo
	p      *Provider
	client *kms.Client
	arn    string // the key's ARN, which every Sign call names
	m      mapping
	// created: by CreateKey; only such a key may be destroyed.
	created bool
}

var _ backends.Signer = (*Signer)(nil)

// Sign implements crypto.Signer; it is SignContext without a caller's
// deadline (each attempt still gets CallTimeout, and retries are bounded).
func (s *Signer) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.SignContext(context.Background(), digest, opts)
}

// SignContext asks KMS to sign digest (for Ed25519, the message) with the
// key's ARN, the explicit signing algorithm and MessageType DIGEST (RAW for
// Ed25519), and returns the signature only once the answer names this key
// and algorithm and the signature verifies against the public key.
func (s *Signer) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	const op = "sign"
	c := call{op: op, uri: s.URI(), action: "Sign"}
	if err := ctx.Err(); err != nil {
		return nil, backends.Wrap(backends.ErrTransient, op, c.uri, "", err)
	}
	if err := s.Algorithm().CheckOpts(opts); err != nil {
		return nil, backends.Wrap(backends.ErrUnsupportedAlgorithm, op, c.uri, "", err)
	}
	if err := s.checkInput(digest); err != nil {
		return nil, backends.Wrap(backends.ErrPermanent, op, c.uri, "", err)
	}
	if s.p.closed.Load() {
		return nil, backends.Errorf(backends.ErrPermanent, op, c.uri, "", "the awskms provider is closed")
	}
	out, err := s.client.Sign(ctx, &kms.SignInput{
		KeyId:            aws.String(s.arn),
		Message:          digest,
		MessageType:      s.m.messageType,
		SigningAlgorithm: s.m.signing,
	})
	if err != nil {
		return nil, s.p.failed(ctx, c, err)
	}
	if got := aws.ToString(out.KeyId); got != s.arn {
		return nil, backends.Errorf(backends.ErrPermanent, op, c.uri, "", "KMS answered with a signature by %q, not %q", got, s.arn)
	}
	if out.SigningAlgorithm != s.m.signing {
		return nil, backends.Errorf(backends.ErrPermanent, op, c.uri, "", "KMS answered with a %s signature, not %s", out.SigningAlgorithm, s.m.signing)
	}
	// Not retried: TLS brought this answer intact, so a signature that does
	// not verify means the key behind the ARN is not the one opened.
	if err := backends.VerifySignature(s.Public(), s.Algorithm(), digest, out.Signature); err != nil {
		return nil, backends.Wrap(backends.ErrPermanent, op, c.uri, "", fmt.Errorf("checking the KMS signature against the public key: %w", err))
	}
	return out.Signature, nil
}

// checkInput refuses, before any call, what KMS would: a digest of the
// wrong length, or an Ed25519 message longer than maxRawMessage.
func (s *Signer) checkInput(digest []byte) error {
	if h := s.Algorithm().Hash(); h != 0 && len(digest) != h.Size() {
		return fmt.Errorf("building the signing request: digest is %d bytes, %v digests are %d", len(digest), h, h.Size())
	}
	if len(digest) == 0 || len(digest) > maxRawMessage {
		return fmt.Errorf("building the signing request: KMS signs messages of 1 to %d bytes, this one is %d", maxRawMessage, len(digest))
	}
	return nil
}

// Close releases nothing: the KMS client belongs to the Provider.
func (s *Signer) Close() error { return nil }

var _ backends.Destroyer = (*Signer)(nil)

// Destroy schedules the key's deletion after AWS KMS's shortest waiting
// period, 7 days (backends.Destroyer): ScheduleKeyDeletion. The key is
// PendingDeletion meanwhile, signs nothing, and aws kms cancel-key-deletion
// brings it back; a key cannot be deleted sooner.
func (s *Signer) Destroy(ctx context.Context) (string, error) {
	if !s.created {
		return "", backends.NotCreated(s.URI())
	}
	const op = "destroy-key"
	c := call{op: op, uri: s.URI(), action: "ScheduleKeyDeletion"}
	if s.p.closed.Load() {
		return "", backends.Errorf(backends.ErrPermanent, op, c.uri, "", "the awskms provider is closed")
	}
	out, err := s.client.ScheduleKeyDeletion(ctx, &kms.ScheduleKeyDeletionInput{KeyId: aws.String(s.arn), PendingWindowInDays: aws.Int32(7)})
	if err != nil {
		return "", s.p.failed(ctx, c, err)
	}
	when := ""
	if out.DeletionDate != nil {
		when = " on " + out.DeletionDate.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("scheduled key %s for deletion%s (aws kms cancel-key-deletion --key-id %s undoes it until then)", s.arn, when, s.arn), nil
}
