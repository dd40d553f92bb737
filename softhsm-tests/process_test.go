package softhsmtests

import (
	"bytes"
	"context"
	"fmt"
	"github.com/keyward/keyward/cmd/keyward/app"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/signer"
	"github.com/keyward/keyward/signer/config"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"
)

// envSignerConfig makes the test binary run as a signer replica (see
// TestMain): tests that must kill a replica outright run it as a process.
const envSignerConfig = "KEYWARD_TEST_SIGNER_CONFIG"

func runSignerProcess(path string) int {
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	reg, err := all.NewRegistry(all.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer reg.Close()
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := signer.Run(ctx, signer.Options{Config: cfg, Backends: reg, Identity: os.Getenv("KEYWARD_TEST_IDENTITY"),
		AlsoLead: app.TrustPublisherCompanion(cfg)}); err != nil {
		fmt.Fprintln(os.Stderr, "signer:", err)
		return 1
	}
	return 0
}

// signerProcess is a replica running in a child process.
type signerProcess struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	out bytes.Buffer
}

func (p *signerProcess) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

// Output is everything the replica logged so far.
func (p *signerProcess) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Kill ends the replica with SIGKILL: no lease release, no cleanup.
func (p *signerProcess) Kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// Stop ends the replica with SIGTERM and waits for it: a graceful stop.
func (p *signerProcess) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait()
}

// Pause stops the replica with SIGSTOP: alive, holding its connections,
// doing nothing (a stand-in for a partition or a long stall).
func (p *signerProcess) Pause() { _ = p.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused replica (SIGCONT).
func (p *signerProcess) Resume() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }

// startSignerProcess runs the test binary as a signer replica with cfg.
func startSignerProcess(t testing.TB, cfg *config.SignerConfiguration, identity string) *signerProcess {
	t.Helper()
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), identity+".yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	p := &signerProcess{}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), envSignerConfig+"="+path, "KEYWARD_TEST_IDENTITY="+identity)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.Resume()
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			_ = p.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("replica %s output:\n%s", identity, p.Output())
		}
	})
	return p
}
