package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/keyward/keyward/nodehelper/atomicdir"
	"github.com/keyward/keyward/nodehelper/certstore"
	"github.com/keyward/keyward/nodehelper/csrclient"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// renewError is a failed renewal step with its metric reason.
type renewError struct {
	reason string
	err    error
}

func (e *renewError) Error() string { return e.err.Error() }
func (e *renewError) Unwrap() error { return e.err }

func failed(reason string, err error) error { return &renewError{reason: reason, err: err} }

// decisionRetryMax caps the wait after consecutive Denied or Failed CSRs
// (unless renewal.retryMax is longer).
const decisionRetryMax = time.Hour

// recheckEvery bounds one sleep until a renewal: the pair, its expiry and
// the output are looked at again at least this often.
const recheckEvery = 5 * time.Minute

// errWaitTimeout ends one wait for issuance after renewal.waitTimeout.
var errWaitTimeout = errors.New("wait timeout")

// runCredential is one credential's loop: keep the output equal to the
// current pair, sleep until the pair is due (or RenewNow), renew; after an
// error keep every file and retry with backoff.
func (a *Agent) runCredential(ctx context.Context, c *credential) {
	logger := klog.FromContext(ctx).WithValues("credential", c.name)
	ctx = klog.NewContext(ctx, logger)
	bo := backoff{initial: a.cfg.Renewal.RetryInitial.Duration, max: a.cfg.Renewal.RetryMax.Duration, rnd: a.deps.rnd}
	// A Denied or Failed CSR waits for someone to change a decision: the
	// next request comes after at least retryMax, doubling up to an hour.
	// (backoff draws from [d/2, d]: d starts at twice retryMax.)
	decisions := backoff{initial: 2 * a.cfg.Renewal.RetryMax.Duration, max: max(2*a.cfg.Renewal.RetryMax.Duration, decisionRetryMax), rnd: a.deps.rnd}
	var scheduled []byte // the leaf renewAt was drawn for
	due := false         // a renewal failed: retry it, do not wait for renewAt
	for ctx.Err() == nil {
		renewing, err := a.step(ctx, c, &scheduled, due)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			bo.reset()
			decisions.reset()
			due = false
			c.problem = ""
			continue
		}
		due = renewing
		d := bo.next()
		var re *renewError
		if errors.As(err, &re) && (re.reason == ReasonDenied || re.reason == ReasonFailed) {
			d = max(d, decisions.next())
		}
		a.failed(ctx, c, err, d)
		if !a.sleep(ctx, d, c.kick) {
			return
		}
	}
}

// step does one pass: with a valid pair, make the output match it and
// sleep until it is due (unless due already); then renew. It returns nil
// after a renewal, and whether the error (if any) came from renewing.
func (a *Agent) step(ctx context.Context, c *credential, scheduled *[]byte, due bool) (renewing bool, err error) {
	logger := klog.FromContext(ctx)
	pair, err := c.store.Current()
	if err != nil {
		// A current pair that cannot be read is not deleted: a new pair's
		// commit replaces the link.
		a.metrics.renewErrors.WithLabelValues(c.name, ReasonStore).Inc()
		if msg := err.Error(); msg != c.currentProblem {
			c.currentProblem = msg
			logger.Error(err, "Reading the current pair failed; keeping it and requesting a new one")
		}
		pair = nil
	} else {
		c.currentProblem = ""
	}
	now := a.clock.Now()
	if pair != nil {
		leaf := pair.Chain[0]
		a.mu.Lock()
		c.status.NotAfter = leaf.NotAfter
		a.mu.Unlock()
		a.metrics.expiration.WithLabelValues(c.name).Set(float64(leaf.NotAfter.Unix()))
		if !now.Before(leaf.NotAfter) {
			logger.Error(fmt.Errorf("certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339)),
				"Credential expired; renewing", "path", pair.Path)
			pair = nil
		}
	}
	if pair != nil {
		leaf := pair.Chain[0]
		if err := a.useIdentity(c, pair); err != nil {
			return false, err
		}
		outErr := a.ensureOutput(ctx, c, pair)
		if !bytes.Equal(*scheduled, leaf.Raw) {
			at := renewAt(leaf, a.deps.rnd)
			a.mu.Lock()
			c.renewAt = at
			a.mu.Unlock()
			*scheduled = leaf.Raw
			logger.V(2).Info("Renewal scheduled", "at", at, "notBefore", leaf.NotBefore, "notAfter", leaf.NotAfter)
			if now.Before(leaf.NotBefore) {
				// Written anyway (other hosts' clocks accept it), but this
				// node's own checks and the renewal point run on its clock.
				logger.Info("The certificate is not valid yet by this node's clock: is the clock behind?",
					"notBefore", leaf.NotBefore, "now", now, "renewAt", at, "path", pair.Path)
			}
		}
		a.mu.Lock()
		at := c.renewAt
		a.mu.Unlock()
		if outErr != nil {
			if at.After(now) && !due {
				return false, failed(ReasonOutput, outErr)
			}
			// A broken output does not hold up a renewal that is due: the
			// state directory's pair would run out too.
			a.noteFailure(ctx, c, failed(ReasonOutput, outErr))
		}
		if d := at.Sub(now); d > 0 && !due {
			// At most recheckEvery at a time, then a fresh pass: timers
			// stop while a VM is paused or suspended (the pair may have run
			// out meanwhile), and a removed output is repaired in minutes.
			timer := a.clock.NewTimer(min(d, recheckEvery))
			defer timer.Stop()
			select {
			case <-ctx.Done():
				return false, nil
			case <-timer.C():
				if a.clock.Now().Before(at) {
					return false, nil
				}
			case <-c.kick:
			}
		}
	}
	// A RenewNow made before this renewal starts is answered by it.
	select {
	case <-c.kick:
	default:
	}
	return true, a.renew(ctx, c)
}

// renew obtains a new pair: the pending key (created and persisted
// first, reused after a restart), its CSR (same key, same name: a
// restarted agent finds the one it created), the wait, the commit.
func (a *Agent) renew(ctx context.Context, c *credential) error {
	logger := klog.FromContext(ctx)
	client := a.clients.forIdentity()
	if !c.identity {
		if client = a.clients.wait(ctx); client == nil {
			return ctx.Err()
		}
	}
	key, resumed, err := c.store.Pending(c.keyType)
	if err != nil {
		// A pending file that holds no key is the store's to set aside.
		return failed(ReasonStore, fmt.Errorf("loading or creating the pending key: %w", err))
	}
	req := c.request
	req.Key = key
	submitCtx, cancelSubmit := context.WithTimeout(ctx, a.deps.submitTimeout)
	// client-go's helper says "csr for this node already exists, reusing"
	// at default verbosity at every resumed try (and of any credential);
	// "Waiting for the certificate" below names the CSR.
	submitCtx = klog.NewContext(submitCtx, logger.V(2))
	csr, err := a.deps.submit(submitCtx, client, req)
	unanswered := submitCtx.Err() != nil
	cancelSubmit()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if unanswered {
			return failed(ReasonAPI, fmt.Errorf("submitting the CSR: no answer from the apiserver within %s: %w", a.deps.submitTimeout, err))
		}
		if errors.Is(err, csrclient.ErrConflict) {
			// Another request holds this key's name: start over with a new key.
			return failed(ReasonConflict, errors.Join(fmt.Errorf("submitting the CSR: %w", err), a.discard(c)))
		}
		return failed(ReasonAPI, fmt.Errorf("submitting the CSR: %w", err))
	}
	a.mu.Lock()
	c.status.Pending = csr.Name
	a.mu.Unlock()
	// Said once; while retrying a failure (said already) only at V(4).
	v := 0
	if c.problem != "" {
		v = 4
	}
	logger.V(v).Info("Waiting for the certificate", "csr", csr.Name, "signerName", c.request.SignerName, "resumed", resumed)

	waitCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := a.clock.NewTimer(a.cfg.Renewal.WaitTimeout.Duration)
	defer timer.Stop()
	go func() {
		select {
		case <-timer.C():
			cancel(errWaitTimeout)
		case <-waitCtx.Done():
		}
	}()
	chainPEM, err := a.deps.wait(waitCtx, client, csr)
	if err != nil {
		var decision *csrclient.DecisionError
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &decision):
			// Permanent for this request: the next try is a new key and CSR.
			reason := ReasonDenied
			if decision.Type == certv1.CertificateFailed {
				reason = ReasonFailed
			}
			return failed(reason, errors.Join(err, a.discard(c)))
		case errors.Is(err, csrclient.ErrDeleted):
			// The same key asks again under the same name.
			return failed(ReasonDeleted, fmt.Errorf("CSR %s: %w", csr.Name, err))
		case errors.Is(context.Cause(waitCtx), errWaitTimeout):
			return failed(ReasonTimeout, fmt.Errorf("CSR %s not issued within %s: %s; it is looked up again at the next try",
				csr.Name, a.cfg.Renewal.WaitTimeout.Duration, holdUp(ctx, client, csr.Name, c.request.SignerName)))
		}
		return failed(ReasonAPI, fmt.Errorf("waiting for CSR %s: %w", csr.Name, err))
	}
	pair, err := c.store.Commit(key, chainPEM, a.clock.Now())
	if err != nil {
		if errors.Is(err, certstore.ErrMismatch) || errors.Is(err, certstore.ErrExpired) {
			if errors.Is(err, certstore.ErrExpired) && !resumed {
				// Requested in this try, so not expired but for this
				// node's clock: each try will make another CSR until the
				// clock is set right.
				err = fmt.Errorf("%w (requested just now: is this node's clock ahead?)", err)
			}
			// The issued chain can never be used: a new key and CSR next time.
			return failed(ReasonInvalid, errors.Join(fmt.Errorf("CSR %s: %w", csr.Name, err), a.discard(c)))
		}
		return failed(ReasonStore, fmt.Errorf("storing the certificate of CSR %s: %w", csr.Name, err))
	}
	leaf := pair.Chain[0]
	a.mu.Lock()
	c.status.Renewals++
	c.status.Pending = ""
	c.status.NotAfter = leaf.NotAfter
	c.status.LastError = ""
	c.tried = true
	c.written = false
	a.mu.Unlock()
	a.metrics.renewals.WithLabelValues(c.name).Inc()
	a.metrics.expiration.WithLabelValues(c.name).Set(float64(leaf.NotAfter.Unix()))
	kv := []any{"csr", csr.Name, "notBefore", leaf.NotBefore, "notAfter", leaf.NotAfter, "path", pair.Path}
	lifetime := leaf.NotAfter.Sub(leaf.NotBefore)
	if earliest := leaf.NotBefore.Add(time.Duration(float64(lifetime) * renewFrom)); !earliest.After(a.clock.Now()) {
		// Already due: renewing at once would make CSR after CSR. The pair
		// is kept and written; the next renewal waits for the backoff.
		logger.Info("Certificate issued", kv...)
		if err := a.useIdentity(c, pair); err != nil {
			return err
		}
		if err := a.ensureOutput(ctx, c, pair); err != nil {
			return failed(ReasonOutput, err)
		}
		return failed(ReasonSchedule, fmt.Errorf("certificates of signer %s are due for renewal as soon as issued "+
			"(lifetime %s, more than %.0f %% of it past at issue): the lifetime is too short or this node's clock is off; renewing with backoff",
			c.request.SignerName, lifetime, renewFrom*100))
	}
	if c.problem != "" {
		kv = append(kv, "after", c.problem)
		c.problem = ""
	}
	logger.Info("Certificate issued", kv...)
	return nil
}

// useIdentity gives the clients a new identity pair (c is the bootstrap
// identity); other credentials do nothing.
func (a *Agent) useIdentity(c *credential, pair *certstore.Pair) error {
	if !c.identity || bytes.Equal(c.identityFor, pair.Chain[0].Raw) {
		return nil
	}
	if err := a.clients.setIdentity(pair); err != nil {
		return failed(ReasonStore, err)
	}
	c.identityFor = pair.Chain[0].Raw
	return nil
}

// holdUp says what CSR name waits for: an approval, or the signer's
// certificate once approved (or why that cannot be read).
func holdUp(ctx context.Context, client kubernetes.Interface, name, signerName string) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// List it as the wait does (by metadata.name), not Get: an identity
	// that may get but not list CSRs waits in vain, and this says why.
	list, err := client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return fmt.Sprintf("listing it as the wait does failed (the identity needs list and watch on certificatesigningrequests): %v", err)
	}
	if len(list.Items) == 0 {
		return "it no longer exists"
	}
	csr := &list.Items[0]
	for _, cond := range csr.Status.Conditions {
		if cond.Type == certv1.CertificateApproved && cond.Status == corev1.ConditionTrue {
			return fmt.Sprintf("approved, but signer %s has not issued it (is the signer running?)", signerName)
		}
	}
	return fmt.Sprintf("not approved (is an approver for signer %s running, and does it accept this request?)", signerName)
}

// discard drops the pending key so that the next try makes a new one
// (and a new CSR).
func (a *Agent) discard(c *credential) error {
	a.mu.Lock()
	c.status.Pending = ""
	a.mu.Unlock()
	if err := c.store.DiscardPending(); err != nil {
		return fmt.Errorf("discarding the pending key: %w", err)
	}
	return nil
}

// noteFailure counts err and logs it once per distinct message at default
// verbosity (at V(4) when repeated).
func (a *Agent) noteFailure(ctx context.Context, c *credential, err error, kv ...any) {
	reason := ReasonAPI
	var re *renewError
	if errors.As(err, &re) {
		reason = re.reason
	}
	a.metrics.renewErrors.WithLabelValues(c.name, reason).Inc()
	a.mu.Lock()
	c.status.Errors++
	c.status.LastError = err.Error()
	c.tried = true
	pending := c.status.Pending
	a.mu.Unlock()
	kv = append(kv, "reason", reason)
	if pending != "" {
		kv = append(kv, "csr", pending)
	}
	logger := klog.FromContext(ctx)
	if err.Error() == c.problem {
		logger.V(4).Info("Renewing the credential failed again; keeping the current files", append(kv, "err", err)...)
		return
	}
	c.problem = err.Error()
	logger.Error(err, "Renewing the credential failed; keeping the current files", kv...)
}

// failed records a failed step before the backoff wait d.
func (a *Agent) failed(ctx context.Context, c *credential, err error, d time.Duration) {
	a.noteFailure(ctx, c, err, "retryIn", d)
}

// outputFiles is the set of files c's output holds for pair.
func outputFiles(o *Output, pair *certstore.Pair) map[string]atomicdir.File {
	mode := fileMode(o.Mode)
	files := map[string]atomicdir.File{
		o.BundleFile: {Data: append(append([]byte{}, pair.KeyPEM...), pair.ChainPEM...), Mode: mode},
	}
	if o.KeyFile != "" {
		files[o.KeyFile] = atomicdir.File{Data: pair.KeyPEM, Mode: mode}
		files[o.ChainFile] = atomicdir.File{Data: pair.ChainPEM, Mode: mode}
	}
	return files
}

// ensureOutput writes c's output for pair unless the directory already
// holds exactly those files (content and mode): a crash between the
// commit and the write, or a hand edit, is repaired at the next pass.
func (a *Agent) ensureOutput(ctx context.Context, c *credential, pair *certstore.Pair) error {
	if c.output == nil {
		return nil
	}
	files := outputFiles(c.output, pair)
	opts := atomicdir.Options{UID: owner(c.output.UID), GID: owner(c.output.GID)}
	if !outputMatches(c.output.Dir, files, opts) {
		err := atomicdir.Write(c.output.Dir, files, opts)
		if err != nil {
			a.mu.Lock()
			c.written = false
			a.mu.Unlock()
			return fmt.Errorf("writing the credential files to %s: %w", c.output.Dir, err)
		}
		klog.FromContext(ctx).Info("Credential files written", "dir", c.output.Dir, "notAfter", pair.Chain[0].NotAfter)
	}
	a.mu.Lock()
	c.written = true
	a.mu.Unlock()
	return nil
}

// outputMatches reports whether dir's current set holds files exactly.
func outputMatches(dir string, files map[string]atomicdir.File, opts atomicdir.Options) bool {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	got, err := atomicdir.Read(dir, names...)
	if err != nil {
		return false
	}
	for n, f := range files {
		if !bytes.Equal(got[n], f.Data) {
			return false
		}
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil || fi.Mode().Perm() != f.Mode.Perm() || !ownedAs(fi, opts.UID, opts.GID) {
			return false
		}
	}
	return true
}
