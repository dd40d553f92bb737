// Package testkeys makes the private keys behind the in-process KMS fakes:
// by shape, either fresh each time or, to spare tests RSA generation, one
// per shape for the life of a Pool.
package testkeys

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"sync"
)

// Shapes Generate makes.
const (
	P256    = "p256"
	P384    = "p384"
	P521    = "p521"
	Ed25519 = "ed25519"
	RSA2048 = "rsa2048"
	RSA3072 = "rsa3072"
	RSA4096 = "rsa4096"
)

// Generate makes a new private key of shape.
func Generate(shape string) (crypto.Signer, error) {
	var (
		k   crypto.Signer
		err error
	)
	switch shape {
	case P256:
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case P384:
		k, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case P521:
		k, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case Ed25519:
		_, k, err = ed25519.GenerateKey(rand.Reader)
	case RSA2048:
		k, err = rsa.GenerateKey(rand.Reader, 2048)
	case RSA3072:
		k, err = rsa.GenerateKey(rand.Reader, 3072)
	case RSA4096:
		k, err = rsa.GenerateKey(rand.Reader, 4096)
	default:
		return nil, fmt.Errorf("testkeys: no key shape %q", shape)
	}
	if err != nil {
		return nil, fmt.Errorf("testkeys: generating a %s key: %w", shape, err)
	}
	return k, nil
}

// Pool hands out keys by shape. The zero value makes a new key every time;
// with Reuse, each shape's key is made once and then shared. A Pool is safe
// for concurrent use.
type Pool struct {
	Reuse bool

	mu   sync.Mutex
	keys map[string]crypto.Signer
}

// Get returns a key of shape: a new one, or under Reuse the shared one.
func (p *Pool) Get(shape string) (crypto.Signer, error) {
	if !p.Reuse {
		return Generate(shape)
	}
	p.mu.Lock()
	k, ok := p.keys[shape]
	p.mu.Unlock()
	if ok {
		return k, nil
	}
	k, err := Generate(shape) // outside the lock: RSA takes a while
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if prev, ok := p.keys[shape]; ok {
		return prev, nil // another call made it meanwhile
	}
	if p.keys == nil {
		p.keys = map[string]crypto.Signer{}
	}
	p.keys[shape] = k
	return k, nil
}
