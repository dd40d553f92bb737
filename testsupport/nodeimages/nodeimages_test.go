package nodeimages

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/testsupport/testregistry"
)

// build runs Build once per test binary: each run compiles two programs.
var built struct {
	imgs *Images
	err  error
	dir  string
}

func buildOnce(t *testing.T) *Images {
	t.Helper()
	if built.dir == "" {
		dir, err := os.MkdirTemp("", "nodeimages-")
		if err != nil {
			t.Fatal(err)
		}
		built.dir = dir
		built.imgs, built.err = Build(context.Background(), dir)
	}
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.imgs
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

func TestBuildMakesArchivesNamingTheirRefs(t *testing.T) {
	imgs := buildOnce(t)
	for _, tc := range []struct {
		program, ref, archive string
	}{
		{"pause", PauseRef, imgs.PauseArchive},
		{"workload", WorkloadRef, imgs.WorkloadArchive},
	} {
		t.Run("the "+tc.program+" archive", func(t *testing.T) {
			// manifest.json names the ref and the config and layer it holds.
			var mf []struct {
				Config   string
				RepoTags []string
				Layers   []string
			}
			if err := json.Unmarshal(readMember(t, tc.archive, "manifest.json"), &mf); err != nil {
				t.Fatalf("manifest.json: %v", err)
			}
			if len(mf) != 1 || !slices.Equal(mf[0].RepoTags, []string{tc.ref}) || len(mf[0].Layers) != 1 {
				t.Fatalf("manifest.json %+v, want one image tagged %s with one layer", mf, tc.ref)
			}

			var cf v1.ConfigFile
			if err := json.Unmarshal(readMember(t, tc.archive, mf[0].Config), &cf); err != nil {
				t.Fatalf("config: %v", err)
			}
			if !slices.Equal(cf.Config.Entrypoint, []string{"/" + tc.program}) || cf.OS != "linux" ||
				cf.Architecture != runtime.GOARCH || cf.Config.Labels[Label] != tc.program {
				t.Errorf("config: entrypoint %q, platform %s/%s, labels %v", cf.Config.Entrypoint, cf.OS, cf.Architecture, cf.Config.Labels)
			}

			// The archive's layer (gzip-compressed, which docker load and
			// containerd accept) holds the program, executable, owned by root.
			zr, err := gzip.NewReader(bytes.NewReader(readMember(t, tc.archive, mf[0].Layers[0])))
			if err != nil {
				t.Fatalf("layer %s: %v", mf[0].Layers[0], err)
			}
			tr := tar.NewReader(zr)
			h, err := tr.Next()
			if err != nil {
				t.Fatal(err)
			}
			if h.Name != tc.program || h.Typeflag != tar.TypeReg || h.Mode != 0o755 || h.Uid != 0 || h.Gid != 0 || h.Size < 1<<20 {
				t.Errorf("layer entry %q: type %c, mode %o, owner %d:%d, %d bytes", h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Size)
			}
			if _, err := tr.Next(); err != io.EOF {
				t.Errorf("the layer holds more than %s (%v)", tc.program, err)
			}
		})
	}
}

// TestContainerdImportsTheArchives feeds each archive to containerd's own
// importer (the code `ctr images import` runs, here with a content store
// in a directory, no daemon): the image keeps its name and platform.
func TestContainerdImportsTheArchives(t *testing.T) {
	imgs := buildOnce(t)
	store, err := local.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, a := range []struct{ archive, ref string }{{imgs.PauseArchive, PauseRef}, {imgs.WorkloadArchive, WorkloadRef}} {
		f, err := os.Open(a.archive)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := archive.ImportIndex(ctx, store, f)
		f.Close()
		if err != nil {
			t.Fatalf("containerd importing %s: %v", a.archive, err)
		}
		b, err := content.ReadBlob(ctx, store, desc)
		if err != nil {
			t.Fatal(err)
		}
		var idx ocispec.Index
		if err := json.Unmarshal(b, &idx); err != nil {
			t.Fatal(err)
		}
		if len(idx.Manifests) != 1 {
			t.Fatalf("%s imported as %d images, want 1", a.archive, len(idx.Manifests))
		}
		m := idx.Manifests[0]
		if got := m.Annotations[images.AnnotationImageName]; got != a.ref {
			t.Errorf("%s imported as %q, want %q", a.archive, got, a.ref)
		}
		if m.Platform == nil || m.Platform.OS != "linux" || m.Platform.Architecture != runtime.GOARCH {
			t.Errorf("%s imported for platform %+v, want linux/%s", a.archive, m.Platform, runtime.GOARCH)
		}
	}
}

// TestPauseExitsZeroOnSIGTERM runs the built pause program (built for this
// machine's architecture) and stops it as a runtime does.
func TestPauseExitsZeroOnSIGTERM(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the program is built for linux")
	}
	buildOnce(t)
	cmd := exec.Command(filepath.Join(built.dir, "pause"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("pause exited by itself: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("pause after SIGTERM: %v, want exit status 0", err)
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("pause did not exit on SIGTERM")
	}
}

// TestPushToTestRegistry pushes the workload image to testregistry with a
// token scoped to push one repository, signed by a key the registry trusts,
// and reads the manifest back.
func TestPushToTestRegistry(t *testing.T) {
	imgs := buildOnce(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := testregistry.SelfSign(key, "nodeimages pusher")
	if err != nil {
		t.Fatal(err)
	}
	reg := testregistry.Start(t, testregistry.Options{RootCerts: []*x509.Certificate{cert}})
	const repo = "keyward/workload"
	mint := func(actions ...string) authn.Authenticator {
		now := time.Now()
		tok, err := registrytoken.Mint(context.Background(), key, registrytoken.Token{
			Issuer: reg.Issuer, Audience: reg.Service, Subject: "nodeimages-test",
			Access:    []registrytoken.Access{{Type: "repository", Name: repo, Actions: actions}},
			NotBefore: now, Expiry: now.Add(5 * time.Minute), Chain: []*x509.Certificate{cert},
		})
		if err != nil {
			t.Fatal(err)
		}
		return authn.FromConfig(authn.AuthConfig{RegistryToken: tok})
	}
	ref := reg.Host + "/" + repo + ":test"
	ctx := context.Background()

	// A pull-only token may not push.
	var terr *transport.Error
	if err := Push(ctx, imgs.Workload, ref, mint("pull"), nil); !errors.As(err, &terr) ||
		(terr.StatusCode != http.StatusUnauthorized && terr.StatusCode != http.StatusForbidden) {
		t.Fatalf("pushing with a pull-only token: %v, want the registry's 401 or 403", err)
	}

	if err := Push(ctx, imgs.Workload, ref, mint("pull", "push"), nil); err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(r, remote.WithAuth(mint("pull")), remote.WithContext(ctx))
	if err != nil {
		t.Fatalf("pulling %s back: %v", ref, err)
	}
	want, err := imgs.Workload.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if d, err := got.Digest(); err != nil || d != want {
		t.Errorf("pulled manifest digest %v (%v), want %v", d, err, want)
	}
	cf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.Labels[Label] != "workload" {
		t.Errorf("pulled config labels %v", cf.Config.Labels)
	}
}

// readMember returns the content of the archive's member name.
func readMember(t *testing.T, archive, name string) []byte {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("%s has no member %s", archive, name)
		}
		if err != nil {
			t.Fatalf("reading %s: %v", archive, err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}
