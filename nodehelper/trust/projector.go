package trust

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/keyward/keyward/internal/kubemsg"
	"github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/nodehelper/atomicdir"
	"github.com/keyward/keyward/nodehelper/internal/listwatch"
)

// ErrInvalidOptions is matched by errors from New.
var ErrInvalidOptions = errors.New("invalid trust projection options")

// Defaults.
const (
	DefaultFileName    = "ca-bundle.pem"
	DefaultLabelDomain = "keyward.dev"
	DefaultMode        = os.FileMode(0o644)
	DefaultHookTimeout = 30 * time.Second
	// DefaultMaxCertificates and DefaultMaxBytes cap the trust file: a
	// signer's canary and live roots during a rotation are a handful of
	// certificates and a few KiB.
	DefaultMaxCertificates = 64
	DefaultMaxBytes        = 128 << 10
	// DefaultHookDebounce is how long after a change the change hook
	// runs; changes in that time are folded into the one run.
	DefaultHookDebounce = 10 * time.Second
)

// Options configure a Projector. Either Name, or SignerName (with Version
// and optionally NodeName plus NodeLabel), selects the bundles.
type Options struct {
	// Client reads ClusterTrustBundles (list, watch) and, with NodeLabel,
	// the Node NodeName (get, list, watch). A node identity may do both.
	Client kubernetes.Interface
	// Name selects the one ClusterTrustBundle of that name.
	Name string
	// SignerName selects the bundles whose spec.signerName it is and
	// whose <LabelDomain>/cluster-trust-bundle-version label is the
	// version: the NodeLabel's value on the Node when it is canary or
	// live, else Version.
	SignerName string
	// LabelDomain defaults to DefaultLabelDomain.
	LabelDomain string
	// Version is canary or live (the default).
	Version string
	// NodeName and NodeLabel: the label on this Node that chooses the
	// version. Both or neither.
	NodeName, NodeLabel string
	// AdditionalBundleNames, with SignerName, are bundle names merged
	// besides keyward's own <signer>:<version> (the signer name with / as
	// :), each still with the signer name and version label. Anyone with
	// attest on the signer name may write a bundle under its prefix: by
	// default every other name is ignored (and reported in Outcome.Ignored).
	AdditionalBundleNames []string
	// MaxCertificates (DefaultMaxCertificates) and MaxBytes
	// (DefaultMaxBytes) cap the merged trust file; over a cap the last good
	// file stays and Outcome.OverLimit says why.
	MaxCertificates, MaxBytes int

	// Dir is written with atomicdir.Write; FileName (DefaultFileName) is
	// the trust file in it, with Mode (DefaultMode) and owner UID/GID
	// (-1: unchanged; the zero value means root).
	Dir      string
	FileName string
	Mode     os.FileMode
	UID, GID int

	// OnChange, if set, runs after each write that changed the file;
	// its error is logged, the file stays. Its context does not end with
	// Run's (a stopped projector lets it finish), so it must bound itself,
	// as CommandHook does.
	OnChange func(ctx context.Context) error
	// OnChangeDebounce (DefaultHookDebounce) is how long after the first
	// change the hook has not run for it runs, once, for the file as it is
	// then: changes within that time are folded into that run, so runs are
	// at least that far apart and the last change is never left without
	// one. A projector that stops with a run due runs the hook before Run
	// returns.
	OnChangeDebounce time.Duration
	// Clock times the hook's debounce; nil is the real clock.
	Clock clock.WithTicker
	// Synced, if set, is told the outcome of each pass (tests).
	Synced func(Outcome)
}

// Outcome is what one pass of the projector did.
type Outcome struct {
	// Version is the version selected ("" when selecting by name).
	Version string
	// Empty: the selection held no certificate; the file was kept.
	Empty bool
	// Written: the file was (re)written with Data.
	Written bool
	Data    []byte
	// OverLimit, if set, says which cap the merged selection broke; the
	// file was kept.
	OverLimit string
	// Ignored are bundles of the signer with the version label whose
	// name is neither keyward's nor an additional name.
	Ignored []string
}

// Projector keeps a trust file equal to the merge of the selected
// ClusterTrustBundles. It never writes an empty file: on errors or an
// empty selection the last good file stays.
type Projector struct {
	opts Options

	trigger chan struct{}

	mu        sync.Mutex
	last      []byte // the content last written or found on disk
	problem   string // the condition last said at default verbosity
	ignored   string // the ignored bundles last said at default verbosity
	hookDue   bool   // a written change waits for its hook run
	ctbStore  cache.Store
	nodeStore cache.Store
}

// New validates and defaults opts; it starts nothing.
func New(opts Options) (*Projector, error) {
	var errs []string
	if opts.Client == nil {
		errs = append(errs, "a client is required")
	}
	switch {
	case opts.Name == "" && opts.SignerName == "":
		errs = append(errs, "a bundle name or a signer name is required")
	case opts.Name != "" && opts.SignerName != "":
		errs = append(errs, "a bundle name and a signer name are exclusive")
	case opts.Name != "" && (opts.NodeLabel != "" || opts.Version != ""):
		errs = append(errs, "a version or node label applies only with a signer name")
	}
	if (opts.NodeName == "") != (opts.NodeLabel == "") {
		errs = append(errs, "a node name and a node label go together")
	}
	if opts.Version == "" {
		opts.Version = v1alpha1.BundleLive
	}
	if opts.Version != v1alpha1.BundleCanary && opts.Version != v1alpha1.BundleLive {
		errs = append(errs, fmt.Sprintf("version %q is neither canary nor live", opts.Version))
	}
	if opts.Dir == "" {
		errs = append(errs, "a directory is required")
	}
	if opts.FileName == "" {
		opts.FileName = DefaultFileName
	}
	if strings.ContainsRune(opts.FileName, '/') || strings.HasPrefix(opts.FileName, "..") {
		errs = append(errs, fmt.Sprintf("file name %q must be a plain name not starting with ..", opts.FileName))
	}
	if opts.LabelDomain == "" {
		opts.LabelDomain = DefaultLabelDomain
	}
	if opts.Mode == 0 {
		opts.Mode = DefaultMode
	}
	prefix := BundlePrefix(opts.SignerName)
	for _, n := range opts.AdditionalBundleNames {
		switch {
		case opts.SignerName == "":
			errs = append(errs, "additional bundle names apply only with a signer name")
		case !strings.HasPrefix(n, prefix) || len(n) == len(prefix):
			errs = append(errs, fmt.Sprintf("additional bundle name %q must start with %q (the apiserver admits no other name for the signer's bundles)", n, prefix))
		}
	}
	if opts.MaxCertificates < 0 || opts.MaxBytes < 0 || opts.OnChangeDebounce < 0 {
		errs = append(errs, "maxCertificates, maxBytes and the hook debounce must not be negative")
	}
	if opts.MaxCertificates == 0 {
		opts.MaxCertificates = DefaultMaxCertificates
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.OnChangeDebounce == 0 {
		opts.OnChangeDebounce = DefaultHookDebounce
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrInvalidOptions, strings.Join(errs, "; "))
	}
	return &Projector{opts: opts, trigger: make(chan struct{}, 1)}, nil
}

// RunWith is Run with client in place of Options.Client, for one who runs
// the projector anew with another client (the node agent, after each node
// identity rotation). What the projector said is kept from one run to the
// next, so a problem that persists is not said again at default verbosity.
// Runs must not overlap.
func (p *Projector) RunWith(ctx context.Context, client kubernetes.Interface) error {
	if client == nil {
		return fmt.Errorf("%w: a client is required", ErrInvalidOptions)
	}
	p.opts.Client = client
	return p.Run(ctx)
}

// Run projects until ctx ends. It returns nil then, or an error when the
// informers could not start. It may be called again once it returned.
func (p *Projector) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	// The file a previous run left is the last good one.
	if data, err := os.ReadFile(filepath.Join(p.opts.Dir, p.opts.FileName)); err == nil && len(data) > 0 {
		p.last = data
	}

	// A change written but not yet hooked is not left behind: the hook
	// runs now (after the informers stopped).
	defer p.runHook(ctx)

	ctbInformer := cache.NewSharedIndexInformer(p.ctbListWatch(), &certv1.ClusterTrustBundle{}, 0, cache.Indexers{})
	p.ctbStore = ctbInformer.GetStore()
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.kick() },
		UpdateFunc: func(any, any) { p.kick() },
		DeleteFunc: func(any) { p.kick() },
	}
	if _, err := ctbInformer.AddEventHandler(handler); err != nil {
		return fmt.Errorf("watching ClusterTrustBundles: %w", err)
	}
	synced := []cache.InformerSynced{ctbInformer.HasSynced}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { ctbInformer.RunWithContext(ctx) })
	if p.opts.NodeName != "" {
		nodeInformer := cache.NewSharedIndexInformer(p.nodeListWatch(), &corev1.Node{}, 0, cache.Indexers{})
		p.nodeStore = nodeInformer.GetStore()
		if _, err := nodeInformer.AddEventHandler(handler); err != nil {
			return fmt.Errorf("watching Node %s: %w", p.opts.NodeName, err)
		}
		synced = append(synced, nodeInformer.HasSynced)
		wg.Go(func() { nodeInformer.RunWithContext(ctx) })
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended
	}
	logger.V(2).Info("Trust projection started", "dir", p.opts.Dir, "file", p.opts.FileName)

	const minBackoff, maxBackoff = time.Second, 30 * time.Second
	backoff := minBackoff
	var retry <-chan time.Time
	var hookTimer clock.Timer
	var hookC <-chan time.Time
	defer func() {
		if hookTimer != nil {
			hookTimer.Stop()
		}
	}()
	p.kick()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hookC:
			hookC, hookTimer = nil, nil
			p.runHook(ctx)
			continue
		case <-p.trigger:
		case <-retry:
		}
		retry = nil
		err := p.sync(ctx)
		if p.hookDue && hookC == nil {
			hookTimer = p.opts.Clock.NewTimer(p.opts.OnChangeDebounce)
			hookC = hookTimer.C()
		}
		if err != nil {
			p.say(ctx, err.Error(), "keeping the last good trust file", "retryIn", backoff)
			retry = time.After(backoff)
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = minBackoff
	}
}

// runHook runs OnChange if a written change waits for it. The file is
// written: a hook cut short by the end of ctx would never run again (the
// next run finds the file unchanged), so it runs to its end, bounded by its
// own timeout.
func (p *Projector) runHook(ctx context.Context) {
	if !p.hookDue {
		return
	}
	p.hookDue = false
	if err := p.opts.OnChange(context.WithoutCancel(ctx)); err != nil {
		klog.FromContext(ctx).Error(err, "Trust file change hook failed; the file stays")
	}
}

func (p *Projector) kick() {
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

func (p *Projector) ctbListWatch() cache.ListerWatcher {
	opts := func(o *metav1.ListOptions) {
		if p.opts.Name != "" {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.opts.Name).String()
			return
		}
		o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", p.opts.SignerName).String()
		o.LabelSelector = v1alpha1.BundleVersionLabel(p.opts.LabelDomain) + " in (canary,live)"
	}
	c := p.opts.Client.CertificatesV1().ClusterTrustBundles()
	return listwatch.For(c.List, c.Watch, opts)
}

func (p *Projector) nodeListWatch() cache.ListerWatcher {
	sel := fields.OneTermEqualSelector("metadata.name", p.opts.NodeName).String()
	c := p.opts.Client.CoreV1().Nodes()
	return listwatch.For(c.List, c.Watch, func(o *metav1.ListOptions) { o.FieldSelector = sel })
}

// version is the bundle version this node takes now.
func (p *Projector) version(ctx context.Context) string {
	if p.nodeStore == nil {
		return p.opts.Version
	}
	obj, ok, _ := p.nodeStore.GetByKey(p.opts.NodeName)
	if !ok {
		klog.FromContext(ctx).V(2).Info("Node not found, using the default version", "node", p.opts.NodeName, "version", p.opts.Version)
		return p.opts.Version
	}
	v, ok := obj.(*corev1.Node).Labels[p.opts.NodeLabel]
	switch {
	case !ok:
		return p.opts.Version
	case v == v1alpha1.BundleCanary || v == v1alpha1.BundleLive:
		return v
	}
	p.say(ctx, fmt.Sprintf("label %s=%q on Node %s is neither canary nor live", p.opts.NodeLabel, v, p.opts.NodeName), "using the default version", "version", p.opts.Version)
	return p.opts.Version
}

// BundlePrefix is what every ClusterTrustBundle name of signerName starts
// with: the signer name with / as :, then :.
func BundlePrefix(signerName string) string {
	return strings.ReplaceAll(signerName, "/", ":") + ":"
}

// BundleName is keyward's ClusterTrustBundle of signerName and version
// (canary or live): the trust publisher's record.BundleName.
func BundleName(signerName, version string) string {
	return record.BundleName(signerName, version)
}

// selected returns the selected bundles' names and PEM, ordered by name,
// and the names of the signer's bundles with the version label that were
// left out for their name.
func (p *Projector) selected(version string) (names []string, pems [][]byte, ignored []string) {
	key := v1alpha1.BundleVersionLabel(p.opts.LabelDomain)
	var ctbs []*certv1.ClusterTrustBundle
	for _, obj := range p.ctbStore.List() {
		ctb := obj.(*certv1.ClusterTrustBundle)
		if p.opts.Name == "" {
			if ctb.Spec.SignerName != p.opts.SignerName || ctb.Labels[key] != version {
				continue
			}
			if ctb.Name != BundleName(p.opts.SignerName, version) && !slices.Contains(p.opts.AdditionalBundleNames, ctb.Name) {
				ignored = append(ignored, ctb.Name)
				continue
			}
		}
		ctbs = append(ctbs, ctb)
	}
	slices.SortFunc(ctbs, func(a, b *certv1.ClusterTrustBundle) int { return strings.Compare(a.Name, b.Name) })
	for _, ctb := range ctbs {
		names = append(names, ctb.Name)
		pems = append(pems, []byte(ctb.Spec.TrustBundle))
	}
	slices.Sort(ignored)
	return names, pems, ignored
}

// sayIgnored logs the ignored bundles at default verbosity when they
// changed.
func (p *Projector) sayIgnored(ctx context.Context, version string, ignored []string) {
	s := strings.Join(ignored, ",")
	p.mu.Lock()
	changed := p.ignored != s
	p.ignored = s
	p.mu.Unlock()
	if !changed {
		return
	}
	logger := klog.FromContext(ctx)
	if len(ignored) == 0 {
		logger.V(2).Info("No ClusterTrustBundle of the signer is ignored any more", "signerName", p.opts.SignerName)
		return
	}
	logger.Info("Ignoring ClusterTrustBundles of the signer that are not keyward's; name them in additionalBundleNames to merge them",
		"signerName", p.opts.SignerName, "version", version, "merged", BundleName(p.opts.SignerName, version), "ignored", ignored)
}

// sync writes the merged selection if it differs from the file. An empty
// selection is said, not an error: the next bundle event resyncs.
func (p *Projector) sync(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	version := ""
	if p.opts.Name == "" {
		version = p.version(ctx)
	}
	names, pems, ignored := p.selected(version)
	if p.opts.Name == "" {
		p.sayIgnored(ctx, version, ignored)
	}
	data := Merge(pems...)
	if data == nil {
		what := fmt.Sprintf("ClusterTrustBundle %s", p.opts.Name)
		if p.opts.Name == "" {
			what = fmt.Sprintf("ClusterTrustBundles of signer %s with version %s", p.opts.SignerName, version)
		}
		p.say(ctx, fmt.Sprintf("No certificate in the selected %s", what), "keeping the last good trust file", "bundles", names)
		p.observe(Outcome{Version: version, Empty: true, Ignored: ignored})
		return nil
	}
	if n := bytes.Count(data, []byte("-----BEGIN CERTIFICATE-----")); n > p.opts.MaxCertificates || len(data) > p.opts.MaxBytes {
		limit := fmt.Sprintf("the cap of %d certificates (maxCertificates)", p.opts.MaxCertificates)
		if len(data) > p.opts.MaxBytes {
			limit = fmt.Sprintf("the cap of %d bytes (maxBytes)", p.opts.MaxBytes)
		}
		problem := fmt.Sprintf("The selected ClusterTrustBundles %v hold %d certificates (%d bytes), over %s", names, n, len(data), limit)
		p.say(ctx, problem, "keeping the last good trust file")
		p.observe(Outcome{Version: version, OverLimit: problem, Ignored: ignored})
		return nil
	}
	if bytes.Equal(data, p.last) {
		p.recovered(ctx)
		p.observe(Outcome{Version: version, Data: data, Ignored: ignored})
		return nil
	}
	err := atomicdir.Write(p.opts.Dir, map[string]atomicdir.File{p.opts.FileName: {Data: data, Mode: p.opts.Mode}}, atomicdir.Options{UID: p.opts.UID, GID: p.opts.GID})
	if err != nil {
		return fmt.Errorf("writing trust file %s: %w", filepath.Join(p.opts.Dir, p.opts.FileName), err)
	}
	p.last = data
	p.recovered(ctx)
	logger.Info("Trust file written", "path", filepath.Join(p.opts.Dir, p.opts.FileName), "version", version, "bundles", names, "certificates", bytes.Count(data, []byte("-----BEGIN")))
	if p.opts.OnChange != nil {
		p.hookDue = true // run by Run after OnChangeDebounce
	}
	p.observe(Outcome{Version: version, Written: true, Data: data, Ignored: ignored})
	return nil
}

func (p *Projector) observe(o Outcome) {
	if p.opts.Synced != nil {
		p.opts.Synced(o)
	}
}

// say logs a problem once at default verbosity (again only after it
// changed or cleared), at V(4) when repeated.
func (p *Projector) say(ctx context.Context, problem, consequence string, kv ...any) {
	logger := klog.FromContext(ctx)
	p.mu.Lock()
	repeated := p.problem == problem
	p.problem = problem
	p.mu.Unlock()
	if repeated {
		logger.V(4).Info(problem+"; "+consequence, kv...)
		return
	}
	logger.Info(problem+"; "+consequence, kv...)
}

func (p *Projector) recovered(ctx context.Context) {
	p.mu.Lock()
	had := p.problem
	p.problem = ""
	p.mu.Unlock()
	if had != "" {
		klog.FromContext(ctx).Info("Trust file up to date again", "after", had)
	}
}

// CommandHook returns an OnChange that runs argv (no shell) with at most
// timeout (DefaultHookTimeout if 0); a non-zero exit, a start failure or
// the timeout is its error, with the command's output.
func CommandHook(argv []string, timeout time.Duration) func(ctx context.Context) error {
	if timeout <= 0 {
		timeout = DefaultHookTimeout
	}
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.WaitDelay = time.Second
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (after %s)", ctx.Err(), timeout)
		}
		if err != nil {
			return fmt.Errorf("running hook %q: %w; output: %q", strings.Join(argv, " "), err, kubemsg.Truncate(string(out), 512))
		}
		return nil
	}
}
