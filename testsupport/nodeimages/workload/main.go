// Command workload is the container program of keyward's real-node tests.
// Each subcommand prints one line per event to stdout, which kubelet keeps
// as the container's log, in the form
//
//	KEYWARD-WORKLOAD {"event":...}
//
// so that a test can find it in the pod's logs:
//
//	verify      checks the pod-certificate files kubelet projects against a trust bundle
//	mtls-serve  a TLS server that requires client certificates issued under the trust bundle
//	mtls-dial   connects to an mtls-serve again and again with freshly read files
//	sleep       blocks until SIGTERM or SIGINT
//
// SIGTERM or SIGINT ends every subcommand with exit status 0 (verify
// --once excepted, which exits as soon as it has checked).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Prefix starts every line the workload prints.
const Prefix = "KEYWARD-WORKLOAD "

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: workload verify|mtls-serve|mtls-dial|sleep [flags]
  verify     --credential-bundle F | (--key K --chain C)  --trust T [--interval 2s] [--once]
  mtls-serve --listen ADDR --credential-bundle F | (--key K --chain C) --trust T
  mtls-dial  --addr ADDR [--server-name N] --credential-bundle F | (--key K --chain C) --trust T [--interval 500ms]
  sleep
`

// run runs the subcommand args[0] and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	out := &printer{w: stdout}
	var err error
	switch args[0] {
	case "verify":
		return verifyCommand(ctx, args[1:], out, stderr)
	case "mtls-serve":
		err = serveCommand(ctx, args[1:], out, stderr)
	case "mtls-dial":
		err = dialCommand(ctx, args[1:], out, stderr)
	case "sleep":
		<-ctx.Done()
	default:
		fmt.Fprintf(stderr, "workload: unknown subcommand %q\n%s", args[0], usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "workload %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// printer writes events, one line each, from any goroutine.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) print(event any) {
	b, err := json.Marshal(event)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"event": "internal-error", "error": err.Error()})
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "%s%s\n", Prefix, b)
}
