package testkeys

import (
	"crypto/ecdsa"
	"strings"
	"testing"
)

func TestPoolReusesOnlyWhenAsked(t *testing.T) {
	fresh := &Pool{}
	a, err := fresh.Get(P256)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := fresh.Get(P256)
	if a.(*ecdsa.PrivateKey).Equal(b) {
		t.Error("a Pool without Reuse gave the same key twice")
	}
	shared := &Pool{Reuse: true}
	c, _ := shared.Get(P256)
	d, _ := shared.Get(P256)
	e, _ := shared.Get(P384)
	if !c.(*ecdsa.PrivateKey).Equal(d) {
		t.Error("a Pool with Reuse gave two keys of one shape")
	}
	if e.(*ecdsa.PrivateKey).Curve == c.(*ecdsa.PrivateKey).Curve {
		t.Error("a P-384 request got the P-256 key")
	}
	if _, err := shared.Get("dsa1024"); err == nil || !strings.Contains(err.Error(), "dsa1024") {
		t.Errorf("unknown shape: %v", err)
	}
}
