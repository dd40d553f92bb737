// Command release makes keyward's release artifacts in one directory
// (`make release`, docs/release.md):
//
//   - keyward-VERSION-linux-amd64 and -linux-arm64: the CLI and server
//     binary, cgo (PKCS#11), built by hack/build-release.sh, arm64 with
//     Debian's aarch64-linux-gnu-gcc;
//   - keyward-image-VERSION.oci.tar and keyward-image-VERSION-softhsm.oci.tar:
//     the runtime image and its SoftHSM2 variant for both architectures as
//     OCI image layouts (an index of two images each), assembled without a
//     container engine from the binaries and Debian 12 packages
//     (deploy/image.Assemble), named ghcr.io/keyward/keyward:VERSION and
//     :VERSION-softhsm;
//   - keyward-VERSION.tgz: the Helm chart, version and appVersion VERSION;
//   - keyward-VERSION.sbom.cdx.json: a CycloneDX SBOM of the binary's Go
//     modules (cyclonedx-gomod app);
//   - SHA256SUMS over all of them.
//
// It prints each artifact with its size and SHA-256.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/keyward/keyward/deploy/image"
)

// Repository is the image's name, as the chart and the overlays pull it.
const Repository = "ghcr.io/keyward/keyward"

// crossCC is the C compiler per GOARCH when building on another
// architecture (Debian's cross compilers).
var crossCC = map[string]string{"amd64": "x86_64-linux-gnu-gcc", "arm64": "aarch64-linux-gnu-gcc"}

type options struct {
	version, revision string
	epoch             int64
	dist, debCache    string
	archs             []string
	helm, sbomTool    string
	allowDirty        bool
}

func main() {
	// release push ARCHIVE REF: push the image archive (every platform).
	if len(os.Args) == 4 && os.Args[1] == "push" {
		d, err := image.PushOCIArchive(os.Args[2], os.Args[3], remote.WithAuthFromKeychain(authn.DefaultKeychain))
		if err != nil {
			fmt.Fprintln(os.Stderr, "release push:", err)
			os.Exit(1)
		}
		fmt.Printf("pushed %s@%s\n", os.Args[3], d)
		return
	}
	var o options
	var archs string
	flag.StringVar(&o.version, "version", "", "the release version, as in the VERSION file (required)")
	flag.StringVar(&o.revision, "revision", "", "the git commit (default: git rev-parse HEAD)")
	flag.Int64Var(&o.epoch, "source-date-epoch", -1, "build time as Unix seconds (default: the commit's time)")
	flag.StringVar(&o.dist, "dist", "dist", "output directory (emptied first)")
	flag.StringVar(&o.debCache, "deb-cache", "", "where the image's Debian packages are downloaded, per architecture (default: $KEYWARD_CACHE_DIR/debs)")
	flag.StringVar(&archs, "arch", "amd64,arm64", "architectures")
	flag.StringVar(&o.helm, "helm", "bin/helm", "the helm binary")
	flag.StringVar(&o.sbomTool, "cyclonedx-gomod", "bin/cyclonedx-gomod", "the cyclonedx-gomod binary")
	flag.BoolVar(&o.allowDirty, "allow-dirty", false, "release from a tree with uncommitted changes (the artifacts then name a commit they were not built from)")
	flag.Parse()
	o.archs = strings.Split(archs, ",")
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.version == "" {
		return errors.New("--version is required")
	}
	if out, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(out) > 0 && !o.allowDirty {
		return fmt.Errorf("the tree has uncommitted changes, which the artifacts would carry under commit HEAD's name: commit or stash them (or pass -allow-dirty):\n%s", out)
	}
	if out, err := exec.Command("git", "describe", "--tags", "--exact-match").Output(); err != nil || strings.TrimSpace(string(out)) != "v"+o.version {
		fmt.Fprintf(os.Stderr, "release: note: HEAD is not tagged v%s (a release is made from its tag)\n", o.version)
	}
	if o.revision == "" {
		out, err := exec.Command("git", "rev-parse", "HEAD").Output()
		if err != nil {
			return fmt.Errorf("--revision not given and git rev-parse HEAD failed: %w", err)
		}
		o.revision = strings.TrimSpace(string(out))
	}
	if o.epoch < 0 {
		out, err := exec.Command("git", "log", "-1", "--format=%ct").Output()
		if err != nil {
			return fmt.Errorf("--source-date-epoch not given and git log failed: %w", err)
		}
		if o.epoch, err = strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err != nil {
			return err
		}
	}
	if o.debCache == "" {
		cache := os.Getenv("KEYWARD_CACHE_DIR")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache", "keyward")
		}
		o.debCache = filepath.Join(cache, "debs")
	}
	if err := os.RemoveAll(o.dist); err != nil {
		return err
	}
	if err := os.MkdirAll(o.dist, 0o755); err != nil {
		return err
	}
	created := time.Unix(o.epoch, 0).UTC()

	variants := map[string][]v1.Image{}
	for _, arch := range o.archs {
		bin := filepath.Join(o.dist, fmt.Sprintf("keyward-%s-linux-%s", o.version, arch))
		if err := buildBinary(o, arch, bin); err != nil {
			return err
		}
		for _, variant := range []string{"", "softhsm"} {
			debs, err := image.FetchDebs(filepath.Join(o.debCache, "bookworm-"+arch), arch, image.Packages(variant))
			if err != nil {
				return err
			}
			img, err := image.Assemble(image.Build{Arch: arch, Variant: variant, Binary: bin, Debs: debs, Version: o.version, Revision: o.revision, Created: created})
			if err != nil {
				return fmt.Errorf("assembling the %s image %q: %w", arch, variant, err)
			}
			variants[variant] = append(variants[variant], img)
		}
	}
	for variant, images := range variants {
		idx, err := image.Index(images...)
		if err != nil {
			return err
		}
		tag := o.version
		if variant != "" {
			tag += "-" + variant
		}
		if err := image.WriteOCIArchive(filepath.Join(o.dist, "keyward-image-"+tag+".oci.tar"), idx, Repository+":"+tag, created); err != nil {
			return fmt.Errorf("writing the image %s: %w", tag, err)
		}
	}
	if err := runCmd(nil, o.helm, "package", "deploy/helm/keyward", "--version", o.version, "--app-version", o.version, "--destination", o.dist); err != nil {
		return fmt.Errorf("packaging the chart: %w", err)
	}
	sbom := filepath.Join(o.dist, "keyward-"+o.version+".sbom.cdx.json")
	if err := runCmd([]string{"CGO_ENABLED=1"}, o.sbomTool, "app", "-json", "-std", "-noserial", "-notimestamp", "-main", "cmd/keyward", "-output", sbom, "-output-version", "1.6", "."); err != nil {
		return fmt.Errorf("writing the SBOM: %w", err)
	}
	return checksums(o.dist, os.Stdout)
}

func buildBinary(o options, arch, out string) error {
	env := []string{"GOOS=linux", "GOARCH=" + arch, "VERSION=" + o.version, "GIT_COMMIT=" + o.revision, "SOURCE_DATE_EPOCH=" + strconv.FormatInt(o.epoch, 10)}
	if host, _ := exec.Command("go", "env", "GOHOSTARCH").Output(); strings.TrimSpace(string(host)) != arch {
		cc := crossCC[arch]
		if _, err := exec.LookPath(cc); err != nil {
			return fmt.Errorf("building for %s needs the cross compiler %s (Debian: apt-get install gcc-%s; make release-deps)", arch, cc, strings.TrimSuffix(cc, "-gcc"))
		}
		env = append(env, "CC="+cc)
	}
	if err := runCmd(env, "./hack/build-release.sh", out); err != nil {
		return fmt.Errorf("building the %s binary: %w", arch, err)
	}
	return nil
}

func runCmd(env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

// checksums writes SHA256SUMS (sha256sum's format) over every file in dist
// and lists each with its size.
func checksums(dist string, w io.Writer) error {
	entries, err := os.ReadDir(dist)
	if err != nil {
		return err
	}
	var sums strings.Builder
	fmt.Fprintf(w, "%-44s %12s  %s\n", "artifact", "bytes", "sha256")
	for _, e := range entries {
		if e.IsDir() || e.Name() == "SHA256SUMS" {
			continue
		}
		f, err := os.Open(filepath.Join(dist, e.Name()))
		if err != nil {
			return err
		}
		h := sha256.New()
		n, err := io.Copy(h, f)
		f.Close()
		if err != nil {
			return err
		}
		sum := hex.EncodeToString(h.Sum(nil))
		fmt.Fprintf(&sums, "%s  %s\n", sum, e.Name())
		fmt.Fprintf(w, "%-44s %12d  %s\n", e.Name(), n, sum)
	}
	return os.WriteFile(filepath.Join(dist, "SHA256SUMS"), []byte(sums.String()), 0o644)
}
