package image

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/keyward/keyward/testsupport/testregistry"
)

func cacheDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("KEYWARD_CACHE_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(home, ".cache", "keyward")
}

// assembled is the runtime image Assemble makes of the release binary for
// this machine's architecture, from the Debian packages (downloaded once
// into the cache).
func assembled(t *testing.T) v1.Image { return assembledVariant(t, "") }

func assembledVariant(t *testing.T, variant string) v1.Image {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb (Debian) is needed to unpack the image's packages")
	}
	debs, err := FetchDebs(filepath.Join(cacheDir(t), "debs", "bookworm-"+runtime.GOARCH), runtime.GOARCH, Packages(variant))
	if err != nil {
		t.Fatal(err)
	}
	img, err := Assemble(Build{Arch: runtime.GOARCH, Variant: variant, Binary: releaseBuilds(t)[0], Debs: debs, Version: testVersion, Revision: testCommit, Created: time.Unix(testEpoch, 0).UTC()})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// files reads the image's flattened file system: every path with its
// header (and content for regular files under 16 MiB, and the binary).
func files(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		hdrs[name] = h
		if h.Typeflag == tar.TypeReg && (h.Size < 16<<20 || name == Binary) {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			data[name] = b
		}
	}
	return hdrs, data
}

// The two recipes of the runtime image agree in what matters: the
// Dockerfile's runtime stage (distroless cc-debian12:nonroot + the binary)
// and Assemble's (the Debian 12 packages distroless is made of + the same
// binary). Entrypoint, user and labels are compared with the Dockerfile's
// own instructions; what the Dockerfile takes from its base (working
// directory, SSL_CERT_FILE, the nonroot user, glibc and libstdc++, the CA
// bundle) is checked as distroless documents it.
func TestAssembledImageMatchesTheDockerfile(t *testing.T) {
	img := assembled(t)
	cf, d, rt := configAndStage(t, img, "runtime")
	var err error
	var user string
	var entrypoint []string
	for _, in := range rt.Body {
		switch in.Cmd {
		case "USER":
			user = in.Args
		case "ENTRYPOINT":
			if entrypoint, err = ExecForm(in); err != nil {
				t.Fatal(err)
			}
		}
	}
	if cf.Config.User != user {
		t.Errorf("user %q, the Dockerfile's %q", cf.Config.User, user)
	}
	if !slices.Equal(cf.Config.Entrypoint, entrypoint) || len(cf.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, the Dockerfile's %q and none", cf.Config.Entrypoint, cf.Config.Cmd, entrypoint)
	}
	want, err := d.StageLabels("runtime", map[string]string{"VERSION": testVersion, "GIT_COMMIT": testCommit})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		t.Fatal("the Dockerfile's runtime stage sets no labels")
	}
	if got := cf.Config.Labels; !maps.Equal(got, want) {
		t.Errorf("labels %v, the Dockerfile's %v", got, want)
	}
	if rt.Base != RuntimeBase {
		t.Fatalf("the runtime stage is FROM %s: the checks below describe %s", rt.Base, RuntimeBase)
	}
	// What distroless cc-debian12:nonroot provides.
	if cf.Config.WorkingDir != WorkingDir || !slices.Contains(cf.Config.Env, "SSL_CERT_FILE="+CABundle) || cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("config %+v, os %s/%s", cf.Config, cf.OS, cf.Architecture)
	}

	hdrs, data := files(t, img)
	checkDpkgDatabase(t, data, Packages(""))
	bin, ok := hdrs[Binary]
	if !ok || bin.Mode&0o111 == 0 {
		t.Fatalf("%s missing or not executable", Binary)
	}
	f, err := os.ReadFile(releaseBuilds(t)[0])
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data[Binary], f) {
		t.Error("the image's binary is not the release build")
	}
	// Every library the binary links, and its interpreter, resolve in the
	// image (following symlinks as the loader would).
	libdir := map[string]string{"amd64": "/lib/x86_64-linux-gnu/", "arm64": "/lib/aarch64-linux-gnu/"}[runtime.GOARCH]
	for _, lib := range []string{"libc.so.6", "libstdc++.so.6", "libgcc_s.so.1"} {
		if resolve(hdrs, libdir+lib) == "" && resolve(hdrs, "/usr"+libdir+lib) == "" {
			t.Errorf("%s is not in the image", lib)
		}
	}
	for _, interp := range Interpreters {
		if strings.Contains(interp, map[string]string{"amd64": "x86-64", "arm64": "aarch64"}[runtime.GOARCH]) && resolve(hdrs, interp) == "" {
			t.Errorf("the dynamic loader %s is not in the image", interp)
		}
	}
	if !strings.Contains(string(data["/etc/passwd"]), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no nonroot 65532:\n%s", data["/etc/passwd"])
	}
	if h := hdrs[WorkingDir]; h == nil || h.Uid != 65532 {
		t.Errorf("%s missing or not owned by 65532", WorkingDir)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data[CABundle]) || strings.Count(string(data[CABundle]), "BEGIN CERTIFICATE") < 100 {
		t.Errorf("%s holds %d certificates", CABundle, strings.Count(string(data[CABundle]), "BEGIN CERTIFICATE"))
	}
	for name := range hdrs {
		if strings.HasPrefix(name, "/usr/share/doc/") && !keptDocs.MatchString(strings.TrimPrefix(name, "/")) || strings.HasPrefix(name, "/usr/share/man/") || name == "/bin/sh" {
			t.Errorf("the image carries %s", name)
		}
	}
	// What distroless base carries besides glibc: libssl (vendor PKCS#11
	// libraries link it), /etc/os-release (scanners read it), and each
	// package's licence.
	if resolve(hdrs, libdir+"libssl.so.3") == "" && resolve(hdrs, "/usr"+libdir+"libssl.so.3") == "" {
		t.Error("libssl.so.3 is not in the image")
	}
	if resolve(hdrs, "/etc/os-release") == "" {
		t.Error("/etc/os-release is not in the image")
	}
	for _, p := range Packages("") {
		dir := "/usr/share/doc/" + p
		if h := hdrs[dir]; h != nil && h.Typeflag == tar.TypeSymlink { // libgcc-s1 → gcc-12-base
			dir = filepath.Join("/usr/share/doc", h.Linkname)
		}
		if resolve(hdrs, dir+"/copyright") == "" {
			t.Errorf("package %s's copyright file is not in the image", p)
		}
	}
}

// configAndStage returns img's configuration, the parsed Dockerfile and
// its stage called stage, the recipe img must agree with.
func configAndStage(t *testing.T, img v1.Image, stage string) (*v1.ConfigFile, *Dockerfile, Stage) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseDockerfile(bytes.NewReader(readDockerfile(t)))
	if err != nil {
		t.Fatal(err)
	}
	st, ok := d.Stage(stage)
	if !ok {
		t.Fatalf("the Dockerfile has no stage %s", stage)
	}
	return cf, d, st
}

// resolve follows symlinks in hdrs from p to a regular file ("" if none).
func resolve(hdrs map[string]*tar.Header, p string) string {
	for range 10 {
		h, ok := hdrs[p]
		if !ok {
			// A parent directory may be a symlink (lib64 → …).
			return ""
		}
		switch h.Typeflag {
		case tar.TypeReg:
			return p
		case tar.TypeSymlink:
			if strings.HasPrefix(h.Linkname, "/") {
				p = h.Linkname
			} else {
				p = filepath.Join(filepath.Dir(p), h.Linkname)
			}
		default:
			return ""
		}
	}
	return ""
}

// The assembled image runs: its file system, unpacked, is a root in which
// the binary starts as user 65532 with nothing from this machine (chroot,
// an empty environment but the image's) and prints the stamped version;
// a second assembly of the same inputs has the same digest; and the OCI
// archive names the image and holds the index.
func TestAssembledImageRunsAndIsReproducible(t *testing.T) {
	img := assembled(t)
	dig, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	again := assembled(t)
	if d2, _ := again.Digest(); d2 != dig {
		t.Errorf("two assemblies of the same inputs: %s and %s", dig, d2)
	}

	idx, err := Index(img)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "image.oci.tar")
	if err := WriteOCIArchive(archive, idx, "ghcr.io/keyward/keyward:"+testVersion, time.Unix(testEpoch, 0)); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if out, err := exec.Command("tar", "-xf", archive, "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("untar: %v\n%s", err, out)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, _ := top.IndexManifest()
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations["io.containerd.image.name"] != "ghcr.io/keyward/keyward:"+testVersion {
		t.Fatalf("index.json: %+v", im.Manifests)
	}

	// Pushed to a registry (CNCF Distribution on loopback), the index and
	// its image come back with the same digests.
	reg := testregistry.StartOpen(t)
	ref := reg.Host + "/keyward/keyward:" + testVersion
	pushed, err := PushOCIArchive(archive, ref)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := idx.Digest(); pushed != want {
		t.Errorf("pushed index %s, the archive's %s", pushed, want)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(r, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
	if err != nil {
		t.Fatalf("pulling %s back: %v", ref, err)
	}
	if d, _ := pulled.Digest(); d != dig {
		t.Errorf("pulled image %s, assembled %s", d, dig)
	}

	if os.Geteuid() != 0 {
		t.Skip("running the image's binary in a chroot needs root")
	}
	root := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	untar := exec.Command("tar", "-x", "-C", root)
	untar.Stdin = rc
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("unpacking the image: %v\n%s", err, out)
	}
	cf, _ := img.ConfigFile()
	cmd := exec.Command("chroot", "--userspec="+cf.Config.User, root, cf.Config.Entrypoint[0], "version", "-o", "json")
	cmd.Env = cf.Config.Env
	cmd.Dir = "/"
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("the image's entrypoint failed: %v\n%s", err, ee.Stderr)
	}
	if err != nil {
		t.Fatal(err)
	}
	var v struct{ Version, GitCommit string }
	if err := json.Unmarshal(out, &v); err != nil || v.Version != testVersion {
		t.Fatalf("keyward version in the image printed %q (%v)", out, err)
	}
}

// unpack writes img's file system into a new directory and returns it.
func unpack(t *testing.T, img v1.Image) string {
	t.Helper()
	root := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	untar := exec.Command("tar", "-x", "-C", root)
	untar.Stdin = rc
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("unpacking the image: %v\n%s", err, out)
	}
	return root
}

// The SoftHSM2 variant agrees with the Dockerfile's softhsm stage (user,
// entrypoint, labels, SOFTHSM2_CONF and the file it names, the token
// volume owned by 65532), and works: in a chroot of its file system as
// 65532, with only the image's environment, keyward initialises a token
// through the image's SoftHSM2 module and creates a key in it, and the
// image's /bin/sh runs what softhsm-init.sh needs (tr).
func TestSoftHSMVariantMatchesTheDockerfileAndWorks(t *testing.T) {
	img := assembledVariant(t, "softhsm")
	cf, d, st := configAndStage(t, img, "softhsm")
	var err error
	var user, conf string
	var entrypoint, volumes []string
	env := map[string]string{}
	printf := regexp.MustCompile(`printf '([^']*)' > (\S+)`)
	for _, in := range st.Body {
		switch in.Cmd {
		case "USER":
			user = in.Args
		case "ENTRYPOINT":
			if entrypoint, err = ExecForm(in); err != nil {
				t.Fatal(err)
			}
		case "VOLUME":
			if volumes, err = ExecForm(in); err != nil {
				t.Fatal(err)
			}
		case "ENV":
			k, v, _ := strings.Cut(in.Args, "=")
			env[k] = v
		case "RUN":
			if m := printf.FindStringSubmatch(in.Args); m != nil && m[2] == SoftHSMConfPath {
				conf = strings.ReplaceAll(m[1], `\n`, "\n")
			}
		}
	}
	if cf.Config.User != user || !slices.Equal(cf.Config.Entrypoint, entrypoint) {
		t.Errorf("user %q entrypoint %q, the Dockerfile's %q %q", cf.Config.User, cf.Config.Entrypoint, user, entrypoint)
	}
	if len(volumes) != 1 || len(cf.Config.Volumes) != 1 {
		t.Errorf("volumes %v, the Dockerfile's %v", cf.Config.Volumes, volumes)
	} else if _, ok := cf.Config.Volumes[volumes[0]]; !ok {
		t.Errorf("volumes %v, the Dockerfile's %v", cf.Config.Volumes, volumes)
	}
	if env["SOFTHSM2_CONF"] == "" || !slices.Contains(cf.Config.Env, "SOFTHSM2_CONF="+env["SOFTHSM2_CONF"]) {
		t.Errorf("env %v, the Dockerfile's SOFTHSM2_CONF=%s", cf.Config.Env, env["SOFTHSM2_CONF"])
	}
	want, err := d.StageLabels("softhsm", map[string]string{"VERSION": testVersion, "GIT_COMMIT": testCommit})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(cf.Config.Labels, want) {
		t.Errorf("labels %v, the Dockerfile's %v", cf.Config.Labels, want)
	}
	hdrs, data := files(t, img)
	checkDpkgDatabase(t, data, Packages("softhsm"))
	if conf == "" || string(data[SoftHSMConfPath]) != conf {
		t.Errorf("%s is %q, the Dockerfile writes %q", SoftHSMConfPath, data[SoftHSMConfPath], conf)
	}
	if h := hdrs[TokenDir]; h == nil || h.Uid != 65532 || h.Mode&0o777 != 0o750 {
		t.Errorf("%s: %+v, want a directory 0750 owned by 65532", TokenDir, h)
	}
	if resolve(hdrs, SoftHSMModule) == "" {
		t.Errorf("%s is not in the image", SoftHSMModule)
	}

	if os.Geteuid() != 0 {
		t.Skip("running in a chroot needs root")
	}
	root := unpack(t, img)
	for _, f := range []string{"pin", "so-pin"} {
		if err := os.WriteFile(filepath.Join(root, "tmp", f), []byte("1234\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("chroot", append([]string{"--userspec=" + cf.Config.User, root}, args...)...)
		cmd.Env = cf.Config.Env
		cmd.Dir = "/"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s in the image: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run(Binary, "key", "init-token", "--module", SoftHSMModule, "--label", "imagetest", "--pin-file", "/tmp/pin", "--so-pin-file", "/tmp/so-pin")
	out := run(Binary, "key", "create", "--uri", "pkcs11:token=imagetest;object=ca?module-path="+SoftHSMModule+"&pin-source=file:/tmp/pin", "--algorithm", "ECDSAP256")
	if !strings.Contains(out, "sha256:") {
		t.Errorf("key create printed no fingerprint:\n%s", out)
	}
	if got := run("/bin/sh", "-c", "printf '%s' keyward.dev/x | tr '/.' '--'"); got != "keyward-dev-x" {
		t.Errorf("/bin/sh with tr printed %q", got)
	}
}

// checkDpkgDatabase checks that the image lists exactly its Debian
// packages in StatusDir, as distroless does and scanners expect: each
// package's control file (its name, version and architecture) and, where
// the package has them, its md5sums naming files that are in the image.
func checkDpkgDatabase(t *testing.T, data map[string][]byte, packages []string) {
	t.Helper()
	listed := map[string]bool{}
	for p, b := range data {
		dir, name := path.Split(p)
		if dir != StatusDir+"/" || strings.HasSuffix(name, ".md5sums") {
			continue
		}
		listed[name] = true
		fields := string(b)
		for _, want := range []string{"Package: " + name + "\n", "\nVersion: ", "\nArchitecture: "} {
			if !strings.Contains(fields, want) {
				t.Errorf("%s lacks %q:\n%s", p, strings.TrimSpace(want), fields)
			}
		}
		if sums, ok := data[p+".md5sums"]; ok {
			for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
				f := strings.Fields(line)
				if len(f) != 2 {
					t.Errorf("%s.md5sums: line %q", p, line)
				} else if _, ok := data["/"+f[1]]; !ok && !skip(f[1]) {
					t.Errorf("%s.md5sums names /%s, which the image lacks", p, f[1])
				}
			}
		}
	}
	for _, p := range packages {
		if !listed[p] {
			t.Errorf("%s/%s is missing: scanners would not see package %s", StatusDir, p, p)
		}
		delete(listed, p)
	}
	if len(listed) != 0 {
		t.Errorf("%s lists packages the image is not made of: %v", StatusDir, listed)
	}
}
