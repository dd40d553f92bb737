// Package nodeimages builds the two container images of keyward's
// real-node tests from this module's own programs, so that kubelet and
// containerd can run pods with no registry reachable: the sandbox image
// (pause/, blocks until SIGTERM) and the workload image (workload/, which
// checks projected pod certificates and talks mTLS with them).
//
// Build writes each as a docker-save archive that `ctr -n k8s.io images
// import FILE` loads under its reference; Push uploads an image to a
// registry instead.
package nodeimages

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The references the archives carry (their manifest.json RepoTags), under
// which containerd stores the imported images.
const (
	PauseRef    = "registry.keyward.test/pause:3.10"
	WorkloadRef = "registry.keyward.test/workload:test"
)

// Label is the image config label naming which image it is: "pause" or
// "workload".
const Label = "dev.keyward.test-image"

// The programs' import paths.
const (
	pausePackage    = "github.com/keyward/keyward/testsupport/nodeimages/pause"
	workloadPackage = "github.com/keyward/keyward/testsupport/nodeimages/workload"
)

// Images are the built images and their archives.
type Images struct {
	PauseRef, WorkloadRef         string
	PauseArchive, WorkloadArchive string // docker-save tarballs in Build's dir
	Pause, Workload               v1.Image
}

// Build compiles pause and workload for linux/runtime.GOARCH (static:
// CGO_ENABLED=0) into dir and makes an image of each: one layer holding
// the binary as /pause or /workload (mode 0755, owner 0:0), entrypoint
// that file. It writes the archives pause.tar and workload.tar into dir,
// replacing earlier ones. The go command must be on PATH and the working
// directory inside this module (as it is for `go test`); go's build cache
// makes a rebuild cheap.
func Build(ctx context.Context, dir string) (*Images, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("making %s: %w", dir, err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", dir+string(filepath.Separator), pausePackage, workloadPackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the pause and workload programs: %w\n%s", err, out)
	}
	imgs := &Images{PauseRef: PauseRef, WorkloadRef: WorkloadRef}
	var err error
	if imgs.Pause, imgs.PauseArchive, err = image(dir, "pause", PauseRef); err != nil {
		return nil, err
	}
	if imgs.Workload, imgs.WorkloadArchive, err = image(dir, "workload", WorkloadRef); err != nil {
		return nil, err
	}
	return imgs, nil
}

// epoch is every file's and image's timestamp, so that the same binary
// makes the same image.
var epoch = time.Unix(0, 0).UTC()

// image makes the image of dir/program and writes it to dir/program.tar.
func image(dir, program, ref string) (v1.Image, string, error) {
	bin, err := os.ReadFile(filepath.Join(dir, program))
	if err != nil {
		return nil, "", fmt.Errorf("reading the %s binary: %w", program, err)
	}
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: program, Size: int64(len(bin)), Mode: 0o755,
		Uid: 0, Gid: 0, ModTime: epoch, Format: tar.FormatPAX,
	}); err != nil {
		return nil, "", err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, "", err
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("making the %s layer: %w", program, err)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "keyward testsupport/nodeimages", Comment: program},
	})
	if err != nil {
		return nil, "", fmt.Errorf("making the %s image: %w", program, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, "", fmt.Errorf("reading the %s image's config: %w", program, err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = []string{"/" + program}
	cf.Config.Labels = map[string]string{Label: program}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, "", fmt.Errorf("setting the %s image's config: %w", program, err)
	}
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return nil, "", fmt.Errorf("parsing %s: %w", ref, err)
	}
	archive := filepath.Join(dir, program+".tar")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		return nil, "", fmt.Errorf("writing %s: %w", archive, err)
	}
	return img, archive, nil
}

// Push uploads img to ref ("HOST:PORT/repository:tag") with remote.Write.
// auth is what the registry wants (authn.FromConfig(authn.AuthConfig{
// RegistryToken: tok}) for a bearer token a test minted; nil: anonymous);
// transport nil is http.DefaultTransport. A loopback or RFC 1918 host is
// reached over plain HTTP, any other over HTTPS (go-containerregistry's
// name.Registry.Scheme).
func Push(ctx context.Context, img v1.Image, ref string, auth authn.Authenticator, transport http.RoundTripper) error {
	r, err := name.ParseReference(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("parsing %s: %w", ref, err)
	}
	if img == nil {
		return errors.New("pushing a nil image")
	}
	opts := []remote.Option{remote.WithContext(ctx)}
	if auth != nil {
		opts = append(opts, remote.WithAuth(auth))
	}
	if transport != nil {
		opts = append(opts, remote.WithTransport(transport))
	}
	if err := remote.Write(r, img, opts...); err != nil {
		return fmt.Errorf("pushing %s: %w", ref, err)
	}
	return nil
}
