package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Assembling the runtime image without a container engine: the same image
// the Dockerfile's runtime stage makes (distroless cc-debian12:nonroot plus
// the release binary), built from the Debian 12 packages distroless itself
// is made of, with go-containerregistry. TestAssembledImageMatchesTheDockerfile
// keeps the two recipes equal in entrypoint, user, working directory,
// environment, labels and the files keyward needs.

// RuntimePackages are the Debian 12 packages of the runtime image, those of
// distroless base-debian12 and cc-debian12: base-files (/etc/os-release),
// glibc, libssl3 (which vendor PKCS#11 libraries often link), libgcc_s,
// libstdc++ and libgomp (for a vendor's C++ library), the CA certificates,
// /etc/services and /etc/protocols, and time zones.
var RuntimePackages = []string{"base-files", "libc6", "libssl3", "gcc-12-base", "libgcc-s1", "libstdc++6", "libgomp1", "ca-certificates", "netbase", "tzdata"}

// SoftHSMPackages are the Debian 12 packages of the SoftHSM2 variant
// (-softhsm, for CI clusters) beyond RuntimePackages: SoftHSM2 and the
// libraries it links, and the shell and tools the softhsm overlay's init
// script (softhsm-init.sh) runs: dash as /bin/sh, coreutils' tr.
var SoftHSMPackages = []string{"softhsm2", "libsofthsm2", "softhsm2-common", "libsqlite3-0",
	"dash", "coreutils", "libacl1", "libattr1", "libselinux1", "libpcre2-8-0", "libgmp10"}

// The SoftHSM2 variant's files and settings, as the Dockerfile's softhsm
// stage makes them.
const (
	SoftHSMConfPath = "/etc/keyward/softhsm2.conf"
	SoftHSMConf     = "directories.tokendir = /var/lib/softhsm/tokens\nobjectstore.backend = file\nlog.level = INFO\nslots.removable = false\n"
	SoftHSMModule   = "/usr/lib/softhsm/libsofthsm2.so"
)

// Packages returns the Debian packages of variant ("" or "softhsm").
func Packages(variant string) []string {
	if variant == "softhsm" {
		return append(slices.Clone(RuntimePackages), SoftHSMPackages...)
	}
	return RuntimePackages
}

// The runtime image's configuration, as distroless nonroot sets it and the
// Dockerfile adds to it.
const (
	WorkingDir = "/home/nonroot"
	CABundle   = "/etc/ssl/certs/ca-certificates.crt"
	PathEnv    = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Label keys the image carries (OCI image annotations as labels); both
// recipes set the same values.
const (
	LabelTitle    = "org.opencontainers.image.title"
	LabelSource   = "org.opencontainers.image.source"
	LabelVersion  = "org.opencontainers.image.version"
	LabelRevision = "org.opencontainers.image.revision"
	Source        = "https://github.com/keyward/keyward"
)

// Labels are the image's labels for version and revision.
func Labels(version, revision string) map[string]string {
	return map[string]string{LabelTitle: "keyward", LabelSource: Source, LabelVersion: version, LabelRevision: revision}
}

// Build says what to assemble for one architecture.
type Build struct {
	Arch string // GOARCH: amd64 or arm64
	// Variant is "" (the runtime image) or "softhsm" (the SoftHSM2
	// variant: more packages, a shell, the token directory and SoftHSM2's
	// configuration).
	Variant  string
	Binary   string   // the release binary (hack/build-release.sh) for Arch
	Debs     []string // the .deb files of Packages(Variant) for Arch
	Version  string
	Revision string
	// Created is every file's and the image's time (SOURCE_DATE_EPOCH), so
	// that the same inputs make the same image, digest and all.
	Created time.Time
}

// Assemble makes the runtime image of b: one layer of the Debian packages'
// files (documentation left out), one of the distroless base files (users,
// groups, home, /tmp, the CA bundle), one of the binary.
func Assemble(b Build) (v1.Image, error) {
	if b.Arch != "amd64" && b.Arch != "arm64" {
		return nil, fmt.Errorf("architecture %q: want amd64 or arm64", b.Arch)
	}
	bin, err := os.ReadFile(b.Binary)
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	pkgs, certs, err := packagesLayer(b.Debs, b.Created)
	if err != nil {
		return nil, err
	}
	if b.Variant != "" && b.Variant != "softhsm" {
		return nil, fmt.Errorf("variant %q: want \"\" or softhsm", b.Variant)
	}
	base, err := baseFilesLayer(certs, b.Created, b.Variant)
	if err != nil {
		return nil, err
	}
	binLayer, err := layerOf(b.Created, file{name: strings.TrimPrefix(Binary, "/"), mode: 0o755, data: bin})
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	created := v1.Time{Time: b.Created}
	for _, l := range []struct {
		layer []byte
		what  string
	}{{pkgs, "Debian 12 packages: " + strings.Join(Packages(b.Variant), " ")}, {base, "base files: users, home, /tmp, CA bundle" + map[string]string{"softhsm": ", /bin/sh, SoftHSM2 configuration and token directory"}[b.Variant]}, {binLayer, "COPY keyward " + Binary}} {
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(l.layer)), nil },
			tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, err
		}
		if img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{Created: created, CreatedBy: "keyward deploy/image.Assemble", Comment: l.what}}); err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", b.Arch
	if b.Arch == "arm64" {
		cf.Variant = "v8"
	}
	cf.Created = created
	cf.Config.Entrypoint = []string{Binary}
	cf.Config.User = User
	cf.Config.WorkingDir = WorkingDir
	cf.Config.Env = []string{PathEnv, "SSL_CERT_FILE=" + CABundle}
	if b.Variant == "softhsm" {
		// debian:bookworm-slim sets only PATH and no working directory.
		cf.Config.WorkingDir = ""
		cf.Config.Env = []string{PathEnv, "SOFTHSM2_CONF=" + SoftHSMConfPath}
		cf.Config.Volumes = map[string]struct{}{TokenDir: {}}
	}
	cf.Config.Labels = Labels(b.Version, b.Revision)
	return mutate.ConfigFile(img, cf)
}

type file struct {
	name     string // without a leading slash
	mode     int64
	uid, gid int
	dir      bool
	link     string // a symbolic link to link
	data     []byte
}

func layerOf(at time.Time, files ...file) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		for d := path.Dir(f.name); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for _, d := range slices.Sorted(maps.Keys(dirs)) {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: at, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.gid, Size: int64(len(f.data)), ModTime: at, Format: tar.FormatPAX}
		switch {
		case f.dir:
			h.Typeflag, h.Name, h.Size = tar.TypeDir, f.name+"/", 0
		case f.link != "":
			h.Typeflag, h.Linkname, h.Size, h.Mode = tar.TypeSymlink, f.link, 0, 0o777
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// baseFilesLayer holds what distroless's nonroot base adds to its
// packages: root, nobody and nonroot (65532) in passwd and group, their
// homes, /tmp, nsswitch.conf for Go's resolver, and the CA bundle
// update-ca-certificates would write.
// The softhsm variant adds /bin/sh (dash's maintainer script makes it on
// Debian), SoftHSM2's configuration and the token directory, owned by
// 65532 and private to it.
func baseFilesLayer(certs []byte, at time.Time, variant string) ([]byte, error) {
	var extra []file
	if variant == "softhsm" {
		extra = []file{
			{name: "bin/sh", link: "dash"},
			{name: strings.TrimPrefix(SoftHSMConfPath, "/"), mode: 0o644, data: []byte(SoftHSMConf)},
			{name: strings.TrimPrefix(TokenDir, "/"), mode: 0o750, uid: 65532, gid: 65532, dir: true},
		}
	}
	return layerOf(at, append([]file{
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{name: "etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{name: strings.TrimPrefix(CABundle, "/"), mode: 0o644, data: certs},
		{name: "root", mode: 0o700, dir: true},
		{name: "home/nonroot", mode: 0o700, uid: 65532, gid: 65532, dir: true},
		{name: "tmp", mode: 0o1777, dir: true},
	}, extra...)...)
}

// skipped are package paths the image leaves out, as distroless does
// (documentation but each package's copyright file, which carries its
// licence).
var skipped = []string{"usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/lintian/", "usr/share/locale/"}

// keptDocs are usr/share/doc/PKG (a directory, or a link to another's)
// and its copyright file.
var keptDocs = regexp.MustCompile(`^usr/share/doc/[^/]+(/|/copyright)?$`)

func skip(name string) bool {
	if keptDocs.MatchString(name) {
		return false
	}
	return slices.ContainsFunc(skipped, func(p string) bool { return strings.HasPrefix(name, p) && name != p })
}

// packagesLayer unpacks the .deb files (dpkg-deb --fsys-tarfile) into one
// layer, each path once, owners and modes as packaged, times at; and returns the CA bundle
// made from ca-certificates' Mozilla certificates in name order.
func packagesLayer(debs []string, at time.Time) ([]byte, []byte, error) {
	if len(debs) == 0 {
		return nil, nil, errors.New("no Debian packages given")
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	certs := map[string][]byte{}
	var statusDirs []file
	for _, deb := range slices.Sorted(slices.Values(debs)) {
		out, err := exec.Command("dpkg-deb", "--fsys-tarfile", deb).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				err = fmt.Errorf("%w: %s", err, ee.Stderr)
			}
			return nil, nil, fmt.Errorf("unpacking %s: %w", deb, err)
		}
		entries, err := statusEntries(deb)
		if err != nil {
			return nil, nil, err
		}
		tr := tar.NewReader(bytes.NewReader(out))
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, nil, fmt.Errorf("reading %s: %w", deb, err)
			}
			name := strings.TrimPrefix(h.Name, "./")
			if name == "" || skip(name) {
				continue
			}
			if h.Typeflag == tar.TypeLink || h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock {
				return nil, nil, fmt.Errorf("%s: %s is a hard link or a device: Assemble does not carry those over", deb, name)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				return nil, nil, err
			}
			if strings.HasPrefix(name, "usr/share/ca-certificates/mozilla/") && strings.HasSuffix(name, ".crt") {
				certs[name] = data
			}
			key := strings.TrimSuffix(name, "/")
			if seen[key] {
				continue
			}
			seen[key] = true
			// Owners and modes as packaged (base-files' /var/local is
			// root:staff 2775); only the times are the release's.
			hdr := &tar.Header{Typeflag: h.Typeflag, Name: name, Linkname: h.Linkname, Mode: h.Mode, Uid: h.Uid, Gid: h.Gid, Uname: h.Uname, Gname: h.Gname, Size: int64(len(data)), ModTime: at, Format: tar.FormatPAX}
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, nil, err
			}
		}
		statusDirs = append(statusDirs, entries...)
	}
	// The dpkg database as distroless keeps it, one file per package, so
	// that image scanners (Trivy, Grype/Syft) find the packages and their
	// versions: /var/lib/dpkg/status.d/<package> (its control file) and
	// <package>.md5sums (its files).
	for _, d := range []string{"var/lib/dpkg", "var/lib/dpkg/status.d"} {
		if seen[d] {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: at, Format: tar.FormatPAX}); err != nil {
			return nil, nil, err
		}
	}
	for _, e := range statusDirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: at, Format: tar.FormatPAX}); err != nil {
			return nil, nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, nil, err
	}
	if len(certs) == 0 {
		return nil, nil, errors.New("no CA certificates among the packages (ca-certificates missing)")
	}
	names := slices.Collect(maps.Keys(certs))
	sort.Strings(names)
	var bundle bytes.Buffer
	for _, n := range names {
		bundle.Write(bytes.TrimRight(certs[n], "\n"))
		bundle.WriteByte('\n')
	}
	return buf.Bytes(), bundle.Bytes(), nil
}

// StatusDir is where the image keeps its dpkg database, one file per
// package (distroless's layout, which scanners read).
const StatusDir = "/var/lib/dpkg/status.d"

// statusEntries are deb's files in StatusDir: its control file, and its
// md5sums when it has them.
func statusEntries(deb string) ([]file, error) {
	control, err := exec.Command("dpkg-deb", "--info", deb, "control").Output()
	if err != nil {
		return nil, fmt.Errorf("reading %s's control file: %w", deb, err)
	}
	pkg := ""
	for _, line := range strings.Split(string(control), "\n") {
		if v, ok := strings.CutPrefix(line, "Package: "); ok {
			pkg = strings.TrimSpace(v)
		}
	}
	if pkg == "" || strings.ContainsAny(pkg, "/ ") {
		return nil, fmt.Errorf("%s: its control file names no package", deb)
	}
	dir := strings.TrimPrefix(StatusDir, "/") + "/"
	out := []file{{name: dir + pkg, mode: 0o644, data: control}}
	if sums, err := exec.Command("dpkg-deb", "--info", deb, "md5sums").Output(); err == nil && len(sums) > 0 {
		out = append(out, file{name: dir + pkg + ".md5sums", mode: 0o644, data: sums})
	}
	return out, nil
}

// Index makes the multi-architecture image index of images, each with its
// platform.
func Index(images ...v1.Image) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, img := range images {
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant},
		}})
	}
	return idx, nil
}

// WriteOCIArchive writes idx as an OCI image layout in a tar file at
// archive, named ref (annotations org.opencontainers.image.ref.name, the
// tag, and io.containerd.image.name, the whole reference, which `ctr
// images import` names the image by). Entries are in name order with the
// time at, so the same index makes the same file.
func WriteOCIArchive(archive string, idx v1.ImageIndex, ref string, at time.Time) error {
	dir, err := os.MkdirTemp("", "keyward-oci-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	tag := ref
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		tag = ref[i+1:]
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag,
		"io.containerd.image.name":          ref,
	})); err != nil {
		return err
	}
	var names []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		names = append(names, p)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	f, err := os.Create(archive)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, p := range names {
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Stat(p)
		if err != nil {
			return errors.Join(err, f.Close())
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: at, Format: tar.FormatPAX}
		var data []byte
		if fi.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		} else {
			if data, err = os.ReadFile(p); err != nil {
				return errors.Join(err, f.Close())
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return errors.Join(err, f.Close())
		}
		if _, err := tw.Write(data); err != nil {
			return errors.Join(err, f.Close())
		}
	}
	return errors.Join(tw.Close(), f.Close())
}

// FetchDebs downloads packages for arch into dir with apt-get
// download (the versions the machine's Debian 12 sources serve), unless
// each is there already, and returns their paths (of several files of one
// package, the newest version). A package once downloaded is not fetched
// again: delete the cache directory to take Debian's security updates.
func FetchDebs(dir, arch string, packages []string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var missing []string
	for _, p := range packages {
		if m, _ := filepath.Glob(filepath.Join(dir, p+"_*.deb")); len(m) == 0 {
			// An Architecture: all package has no p:arch candidate.
			if out, _ := exec.Command("apt-cache", "show", "--no-all-versions", p).Output(); regexp.MustCompile(`(?m)^Architecture: all$`).Match(out) {
				missing = append(missing, p)
			} else {
				missing = append(missing, p+":"+arch)
			}
		}
	}
	if len(missing) > 0 {
		download := func() ([]byte, error) {
			cmd := exec.Command("apt-get", append([]string{"download", "-q"}, missing...)...)
			cmd.Dir = dir
			return cmd.CombinedOutput()
		}
		out, err := download()
		if err != nil {
			// apt's package lists may be missing or stale (a fresh machine).
			if upd, uerr := exec.Command("apt-get", "update", "-qq").CombinedOutput(); uerr == nil {
				out, err = download()
			} else {
				out = append(out, upd...)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("apt-get download %s: %w\n%s(for another architecture's packages apt needs it: dpkg --add-architecture %s && apt-get update; make release-deps does it)", strings.Join(missing, " "), err, out, arch)
		}
	}
	var debs []string
	for _, p := range packages {
		m, _ := filepath.Glob(filepath.Join(dir, p+"_*.deb"))
		if len(m) == 0 {
			return nil, fmt.Errorf("%s: no %s package after apt-get download", dir, p)
		}
		newest := m[0]
		for _, f := range m[1:] {
			// Debian's version order (deb12u14 after deb12u9), not names'.
			if exec.Command("dpkg", "--compare-versions", debVersion(f), "gt", debVersion(newest)).Run() == nil {
				newest = f
			}
		}
		debs = append(debs, newest)
	}
	return debs, nil
}

// debVersion is the version in a .deb's file name (NAME_VERSION_ARCH.deb,
// with the epoch's colon as %3a).
func debVersion(path string) string {
	parts := strings.Split(strings.TrimSuffix(filepath.Base(path), ".deb"), "_")
	if len(parts) < 3 {
		return ""
	}
	return strings.ReplaceAll(parts[1], "%3a", ":")
}

// PushOCIArchive pushes the image index in an OCI archive that
// WriteOCIArchive wrote to ref ("registry/repository:tag"), every
// platform, with remote.WriteIndex. opts carry the credentials (e.g.
// remote.WithAuthFromKeychain(authn.DefaultKeychain), the docker login
// file) and the transport.
func PushOCIArchive(archive, ref string, opts ...remote.Option) (v1.Hash, error) {
	dir, err := os.MkdirTemp("", "keyward-oci-push-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(dir)
	if out, err := exec.Command("tar", "-xf", archive, "-C", dir).CombinedOutput(); err != nil {
		return v1.Hash{}, fmt.Errorf("unpacking %s: %w: %s", archive, err, out)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return v1.Hash{}, err
	}
	top, err := p.ImageIndex()
	if err != nil {
		return v1.Hash{}, err
	}
	im, err := top.IndexManifest()
	if err != nil {
		return v1.Hash{}, err
	}
	if len(im.Manifests) != 1 {
		return v1.Hash{}, fmt.Errorf("%s holds %d entries, want the one index WriteOCIArchive writes", archive, len(im.Manifests))
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		return v1.Hash{}, err
	}
	r, err := name.ParseReference(ref, name.StrictValidation)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("parsing %s: %w", ref, err)
	}
	if err := remote.WriteIndex(r, idx, opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("pushing to %s: %w", ref, err)
	}
	return idx.Digest()
}
