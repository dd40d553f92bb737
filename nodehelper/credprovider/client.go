package credprovider

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Bounds on what the token service may send back.
const (
	maxAnswerBytes  = 64 << 10
	maxMessageChars = 512
)

// ServerError is the token service's refusal of a credential request: its
// HTTP status, and the code and message of its JSON error body (empty when
// the body was not the contract's JSON).
type ServerError struct {
	StatusCode int
	Code       string
	Message    string
}

func (e *ServerError) Error() string {
	what := "refused the credential request"
	if e.StatusCode >= 500 {
		what = "failed the credential request"
	}
	status := fmt.Sprintf("%d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if e.Code != "" {
		status += ", " + e.Code
	}
	if e.Message == "" {
		return fmt.Sprintf("token service %s (%s)", what, status)
	}
	return fmt.Sprintf("token service %s (%s): %s", what, status, e.Message)
}

// credentialAnswer is the 200 body of POST /v1/credential (TOKEN.md).
type credentialAnswer struct {
	Registry  string    `json:"registry"`
	Service   string    `json:"service"`
	Username  string    `json:"username"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// errorAnswer is the body of a refusal.
type errorAnswer struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

type tokenServiceClient struct {
	http    *http.Client
	timeout time.Duration
}

func newTokenServiceClient(roots *x509.CertPool, timeout time.Duration) *tokenServiceClient {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return &tokenServiceClient{
		http: &http.Client{
			Transport: transport,
			// The request carries the pod's token: follow no redirect.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		timeout: timeout,
	}
}

// credential asks the token service whether token may pull image.
func (c *tokenServiceClient) credential(ctx context.Context, endpoint, image, token string) (*credentialAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	body, err := json.Marshal(map[string]string{"image": image})
	if err != nil {
		return nil, fmt.Errorf("encoding the credential request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("building the credential request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.http.Do(req)
	if err != nil {
		// The URL is in the message already; url.Error would repeat it.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("calling the token service at %s: no answer within %s: %w", endpoint, c.timeout, err)
		}
		return nil, fmt.Errorf("calling the token service at %s: %w", endpoint, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading the token service's answer (%s): %w", resp.Status, err)
	}
	if len(data) > maxAnswerBytes {
		return nil, fmt.Errorf("%w: its answer (%s) is larger than %d bytes", ErrBadAnswer, resp.Status, maxAnswerBytes)
	}
	if resp.StatusCode != http.StatusOK {
		serr := &ServerError{StatusCode: resp.StatusCode}
		var e errorAnswer
		if json.Unmarshal(data, &e) == nil {
			serr.Code, serr.Message = oneLine(e.Error), oneLine(e.Message)
		}
		return nil, serr
	}
	var answer credentialAnswer
	if err := json.Unmarshal(data, &answer); err != nil {
		return nil, fmt.Errorf("%w: decoding its 200 answer: %w", ErrBadAnswer, err)
	}
	if answer.Registry == "" {
		return nil, fmt.Errorf("%w: its 200 answer names no registry", ErrBadAnswer)
	}
	if answer.Username == "" {
		// containerd's CRI drops the password of an entry without a
		// username: the pull would go out anonymously.
		return nil, fmt.Errorf("%w: its 200 answer names no username", ErrBadAnswer)
	}
	return &answer, nil
}

// oneLine makes a server-supplied string fit the plugin's single stderr
// line: control characters become spaces and it is cut to maxMessageChars.
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if r := []rune(s); len(r) > maxMessageChars {
		s = string(r[:maxMessageChars]) + "…"
	}
	return strings.TrimSpace(s)
}
