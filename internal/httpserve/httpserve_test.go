package httpserve

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
)

func TestStartServesEachEndpointAndStops(t *testing.T) {
	h := func(body string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) })
	}
	addrs, stop, err := Start(context.Background(), Endpoint{Addr: "127.0.0.1:0", Handler: h("one")}, Endpoint{Addr: "127.0.0.1:0", Handler: h("two")})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"one", "two"} {
		resp, err := http.Get("http://" + addrs[i] + "/")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != want {
			t.Errorf("%s answered %q, want %q", addrs[i], got, want)
		}
	}
	stop()
	if _, err := http.Get("http://" + addrs[0] + "/"); err == nil {
		t.Errorf("%s still serves after stop", addrs[0])
	}
}

// An address that cannot be bound fails Start, and the listeners already
// started are closed again.
func TestStartFailsOnABusyAddressAndClosesTheOthers(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	_, _, err = Start(context.Background(), Endpoint{Addr: freeAddr, Handler: http.NotFoundHandler()}, Endpoint{Addr: busy.Addr().String(), Handler: http.NotFoundHandler()})
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Fatalf("err = %v, want a *net.OpError", err)
	}
	again, err := net.Listen("tcp", freeAddr)
	if err != nil {
		t.Fatalf("the first listener was left open: %v", err)
	}
	again.Close()
}
