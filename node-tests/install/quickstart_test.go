package install

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/keyward/keyward/deploy/image"
	"github.com/keyward/keyward/testsupport/controlplane"
)

// debCache is the folder of this architecture's cached Debian packages
// (deploy/image.FetchDebs): debs/bookworm-ARCH in the cache root that
// holds controlplane.CacheDir.
func debCache() (string, error) {
	cp, err := controlplane.CacheDir() // <root>/controlplane/<version>
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(filepath.Dir(cp)), "debs", "bookworm-"+runtime.GOARCH), nil
}

// cachedDebs returns the cached .deb files of packages (fetching any that
// is missing, which needs apt and the network: outside the namespaces).
func cachedDebs(packages []string) ([]string, error) {
	dir, err := debCache()
	if err != nil {
		return nil, err
	}
	return image.FetchDebs(dir, runtime.GOARCH, packages)
}

// fetchDebs fills the cache with every package the run's images need.
func fetchDebs() error {
	for _, pkgs := range [][]string{image.Packages("softhsm"), {"busybox-static"}} {
		if _, err := cachedDebs(pkgs); err != nil {
			return err
		}
	}
	return nil
}

// busyboxArchive makes the demo pod's image from Debian's busybox-static
// (its files, plus /bin/sleep, cat, sh, cp, tar and gzip as links to busybox: the commands of the guides' pods and of the HSM client image) and
// writes it as an archive named busyboxRef.
func (c *cluster) busyboxArchive() (string, error) {
	debs, err := cachedDebs([]string{"busybox-static"})
	if err != nil {
		return "", err
	}
	if len(debs) != 1 {
		return "", fmt.Errorf("busybox-static: %d packages, want 1", len(debs))
	}
	data, err := exec.Command("dpkg-deb", "--fsys-tarfile", debs[0]).Output()
	if err != nil {
		return "", fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", debs[0], err)
	}
	var links bytes.Buffer
	tw := tar.NewWriter(&links)
	for _, l := range []string{"sleep", "cat", "sh", "cp", "tar", "gzip"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + l, Linkname: "busybox", Mode: 0o777, ModTime: time.Unix(0, 0)}); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	img := v1.Image(empty.Image)
	for _, layer := range [][]byte{data, links.Bytes()} {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer)), nil })
		if err != nil {
			return "", err
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return "", err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Env = []string{"PATH=/bin:/usr/bin"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}
	tag, err := name.NewTag(busyboxRef)
	if err != nil {
		return "", err
	}
	archive := filepath.Join(c.dir, "images", "busybox.tar")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		return "", errors.Join(fmt.Errorf("writing %s", archive), err)
	}
	return archive, nil
}
