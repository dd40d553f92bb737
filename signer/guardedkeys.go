package signer

import (
	"errors"

	"k8s.io/utils/clock"

	"github.com/keyward/keyward/backends"
)

// GuardKey guards k as the signer guards its CA keys: a signature never
// holds its caller past its context even when the backend hangs, at most a
// few calls may stay stuck, and KeysReady and KeysAlive report the key's
// health. The returned key closes k. Other modes of the keyward binary that
// sign with generations' keys (the token service) open them through it.
func GuardKey(k backends.Signer) (backends.Signer, error) {
	return newHealthKey(k, keyOptions{Clock: clock.RealClock{}})
}

// KeysReady is nil when every key among keys that GuardKey (or the signer)
// guards answered its last signature and has no call stuck in its backend;
// otherwise it says which and why (for /readyz). While a key's last
// signature failed, it starts a probe signature now and then, so that a
// backend that is back is noticed without traffic. Other keys are skipped.
func KeysReady(keys []backends.Signer) error {
	var errs []error
	for _, k := range keys {
		if h, ok := k.(*healthKey); ok {
			errs = append(errs, h.check())
		}
	}
	return errors.Join(errs...)
}

// KeysAlive is nil unless a guarded key among keys has had a backend call
// stuck for so long that only a restart is likely to help (/healthz).
func KeysAlive(keys []backends.Signer) error {
	var errs []error
	for _, k := range keys {
		if h, ok := k.(*healthKey); ok {
			errs = append(errs, h.alive())
		}
	}
	return errors.Join(errs...)
}
