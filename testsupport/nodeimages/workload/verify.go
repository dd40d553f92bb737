package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"
)

// verifyEvent is what verify prints. Without parseable files only Event,
// OK and Error are set; with them, the leaf's fields are set even when the
// check fails.
type verifyEvent struct {
	Event      string    `json:"event"`
	OK         bool      `json:"ok"`
	Error      string    `json:"error,omitempty"`
	Subject    string    `json:"subject,omitempty"`
	Issuer     string    `json:"issuer,omitempty"`
	Serial     string    `json:"serial,omitempty"` // hexadecimal
	NotBefore  time.Time `json:"notBefore,omitzero"`
	NotAfter   time.Time `json:"notAfter,omitzero"`
	KeyType    string    `json:"keyType,omitempty"`
	DNSNames   []string  `json:"dnsNames"`
	URIs       []string  `json:"uris"`
	RootSHA256 []string  `json:"rootSHA256"`
	LeafSHA256 string    `json:"leafSHA256,omitempty"`
	ChainLen   int       `json:"chainLen"`
}

// check loads the files and verifies them at now: the leaf chains to a root
// of the trust bundle through the chain's intermediates, and the private
// key is the leaf's.
func check(f files, now time.Time) (verifyEvent, [32]byte) {
	ev := verifyEvent{Event: "verify", DNSNames: []string{}, URIs: []string{}, RootSHA256: []string{}}
	m, sum, err := load(f)
	if err != nil {
		ev.Error = err.Error()
		return ev, sum
	}
	leaf := m.chain[0]
	ev.Subject, ev.Issuer, ev.Serial = leaf.Subject.String(), leaf.Issuer.String(), serial(leaf)
	ev.NotBefore, ev.NotAfter = leaf.NotBefore.UTC(), leaf.NotAfter.UTC()
	ev.KeyType = keyType(leaf.PublicKey)
	ev.DNSNames = append(ev.DNSNames, leaf.DNSNames...)
	for _, u := range leaf.URIs {
		ev.URIs = append(ev.URIs, u.String())
	}
	for _, r := range m.roots {
		ev.RootSHA256 = append(ev.RootSHA256, fingerprint(r))
	}
	ev.LeafSHA256 = fingerprint(leaf)
	ev.ChainLen = len(m.chain)
	if err := m.keyMatches(); err != nil {
		ev.Error = err.Error()
		return ev, sum
	}
	if _, err := verifyChain(m.chain, m.roots, now); err != nil {
		ev.Error = fmt.Sprintf("verifying the leaf against the trust bundle %s: %v", f.trust, err)
		return ev, sum
	}
	ev.OK = true
	return ev, sum
}

// verifyCommand checks once (--once: exit 0 if ok, else 1) or every
// interval, printing when a file changed or the outcome did (a leaf that
// expires changes no file).
func verifyCommand(ctx context.Context, args []string, out *printer, stderr io.Writer) int {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f files
	f.register(fs)
	interval := fs.Duration("interval", 2*time.Second, "how often to read the files again")
	once := fs.Bool("once", false, "check once and exit: 0 if ok, else 1")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := f.validate(); err != nil {
		fmt.Fprintln(stderr, "workload verify:", err)
		return 2
	}
	if *interval <= 0 {
		fmt.Fprintln(stderr, "workload verify: --interval must be positive")
		return 2
	}
	ev, sum := check(f, time.Now())
	out.print(ev)
	if *once {
		if ev.OK {
			return 0
		}
		return 1
	}
	t := time.NewTicker(*interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0
		case <-t.C:
		}
		next, nextSum := check(f, time.Now())
		if nextSum != sum || next.OK != ev.OK || next.Error != ev.Error {
			out.print(next)
		}
		ev, sum = next, nextSum
	}
}
