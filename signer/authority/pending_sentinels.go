package authority

import "errors"

// Placeholders until the h-certs branch lands (it defines both in authority.go).
var (
	ErrCANotYetValid = errors.New("CA certificate not valid yet")
	ErrBadSignature  = errors.New("signature from the CA key does not verify")
)
