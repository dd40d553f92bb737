// Package httpserve starts the small HTTP listeners keyward's processes
// share (metrics, health).
package httpserve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/klog/v2"
)

// Endpoint is one listener: an address (":0" picks a port) and its handler.
type Endpoint struct {
	Addr    string
	Handler http.Handler
}

// Start listens on every endpoint and serves it in the background. It
// returns the bound addresses, in order, and stop, which shuts every
// server down (5 s grace each). If one address cannot be bound, the ones
// already started are stopped and the error names the address.
func Start(ctx context.Context, endpoints ...Endpoint) ([]string, func(), error) {
	var (
		servers   []*http.Server
		listeners []net.Listener
	)
	// Shutdown closes only the listeners Serve has begun to use; a server
	// whose goroutine has not started yet would bind its port until then,
	// so stop closes every listener itself too.
	stop := func() {
		for _, s := range servers {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = s.Shutdown(sctx)
			cancel()
		}
		for _, ln := range listeners {
			_ = ln.Close()
		}
	}
	var addrs []string
	for _, e := range endpoints {
		ln, err := net.Listen("tcp", e.Addr)
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("listening on %s: %w", e.Addr, err)
		}
		srv := &http.Server{Handler: e.Handler, ReadHeaderTimeout: 5 * time.Second}
		servers, listeners = append(servers, srv), append(listeners, ln)
		addrs = append(addrs, ln.Addr().String())
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.FromContext(ctx).Error(err, "HTTP server stopped", "addr", ln.Addr().String())
			}
		}()
	}
	return addrs, stop, nil
}
