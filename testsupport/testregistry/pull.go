package testregistry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Errors Pull wraps, so a test can tell who refused a pull.
var (
	// ErrTokenRefused: the token endpoint (the registry's realm) answered
	// the token request with a 4xx status.
	ErrTokenRefused = errors.New("the token endpoint refused the token request")
	// ErrRegistryRefused: the registry refused the token it was shown
	// (401/403 after the token dance: a scope the token lacks, a key it
	// does not trust, an expired token, …).
	ErrRegistryRefused = errors.New("the registry refused the pull")
)

// Pull pulls repo:ref (ref a tag or a digest) from the registry at
// registryHost (host:port, plain HTTP) the way containerd — and so the
// kubelet's container runtime — does: containerd's own resolver and
// fetcher, with containerd's Docker authorizer holding username and
// password (an empty pair pulls anonymously). On the registry's bearer
// challenge the authorizer asks the realm for a token with an OAuth2
// password-grant POST and falls back to GET with HTTP Basic on 400, 401,
// 404 or 405, exactly as in a kubelet's containerd. The realm is reached
// over HTTPS trusting caPool (nil: the system roots).
//
// Pull fetches the manifest, checks its digest, and fetches and checks the
// config and layer blobs it names. It returns the manifest's digest.
func Pull(ctx context.Context, registryHost, repo, ref, username, password string, caPool *x509.CertPool) (string, error) {
	client := &http.Client{Transport: &http.Transport{
		Proxy:           nil,
		TLSClientConfig: &tls.Config{RootCAs: caPool, MinVersion: tls.VersionTLS12},
	}}
	authorizer := docker.NewDockerAuthorizer(
		docker.WithAuthClient(client),
		docker.WithAuthCreds(func(host string) (string, string, error) {
			if host != registryHost {
				return "", "", nil
			}
			return username, password, nil
		}),
	)
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: docker.ConfigureDefaultRegistries(
			docker.WithClient(client),
			docker.WithAuthorizer(authorizer),
			docker.WithPlainHTTP(docker.MatchAllHosts),
		),
	})
	sep := ":"
	if len(ref) > 7 && ref[:7] == "sha256:" {
		sep = "@"
	}
	name := registryHost + "/" + repo + sep + ref

	_, desc, err := resolver.Resolve(ctx, name)
	if err != nil {
		return "", classify(registryHost, fmt.Errorf("resolving %s: %w", name, err))
	}
	fetcher, err := resolver.Fetcher(ctx, name)
	if err != nil {
		return "", fmt.Errorf("making a fetcher for %s: %w", name, err)
	}
	raw, err := fetch(ctx, fetcher, desc)
	if err != nil {
		return "", classify(registryHost, fmt.Errorf("fetching the manifest of %s: %w", name, err))
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return "", fmt.Errorf("decoding the manifest of %s: %w", name, err)
	}
	for _, blob := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
		if _, err := fetch(ctx, fetcher, blob); err != nil {
			return "", classify(registryHost, fmt.Errorf("fetching blob %s of %s: %w", blob.Digest, name, err))
		}
	}
	return desc.Digest.String(), nil
}

// fetch reads the content desc names and checks its size and digest.
func fetch(ctx context.Context, fetcher interface {
	Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error)
}, desc ocispec.Descriptor) ([]byte, error) {
	rc, err := fetcher.Fetch(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, desc.Size+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", desc.Digest, err)
	}
	if int64(len(b)) != desc.Size {
		return nil, fmt.Errorf("%s: read %d bytes, descriptor says %d", desc.Digest, len(b), desc.Size)
	}
	if got := desc.Digest.Algorithm().FromBytes(b); got != desc.Digest {
		return nil, fmt.Errorf("content of %s has digest %s", desc.Digest, got)
	}
	return b, nil
}

// classify adds ErrTokenRefused or ErrRegistryRefused to err when
// containerd's error says who refused.
func classify(registryHost string, err error) error {
	if errors.Is(err, docker.ErrInvalidAuthorization) {
		return fmt.Errorf("%w: %w", ErrRegistryRefused, err)
	}
	var status remoteerrors.ErrUnexpectedStatus
	if !errors.As(err, &status) || status.StatusCode < 400 || status.StatusCode >= 500 {
		return err
	}
	if u, perr := url.Parse(status.RequestURL); perr == nil && u.Host != registryHost {
		return fmt.Errorf("%w (%s: %s): %w", ErrTokenRefused, status.Status, status.Body, err)
	}
	if status.StatusCode == http.StatusUnauthorized || status.StatusCode == http.StatusForbidden {
		return fmt.Errorf("%w: %w", ErrRegistryRefused, err)
	}
	return err
}
