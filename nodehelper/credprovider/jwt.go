package credprovider

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// tokenExpiry reads the exp claim of a service-account token (a JWS in
// compact form) WITHOUT verifying its signature. That is safe only because
// the value does nothing but shorten the cacheDuration kubelet is told; the
// token service verifies the token (TokenReview) before anything is granted,
// and a forged exp can at worst make kubelet keep a credential the registry
// realm then refuses. Errors wrap ErrBadRequest.
func tokenExpiry(token string) (time.Time, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, fmt.Errorf("%w: serviceAccountToken is not a JWT (%d dot-separated parts, want 3)", ErrBadRequest, len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: decoding the serviceAccountToken's payload: %w", ErrBadRequest, err)
	}
	var claims struct {
		Exp *json.Number `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return time.Time{}, fmt.Errorf("%w: decoding the serviceAccountToken's claims: %w", ErrBadRequest, err)
	}
	if claims.Exp == nil {
		return time.Time{}, fmt.Errorf("%w: the serviceAccountToken has no exp claim", ErrBadRequest)
	}
	exp, err := claims.Exp.Float64()
	if err != nil || exp <= 0 || exp > 1<<40 {
		return time.Time{}, fmt.Errorf("%w: the serviceAccountToken's exp claim %q is not a time", ErrBadRequest, claims.Exp.String())
	}
	return time.Unix(int64(exp), 0), nil
}
