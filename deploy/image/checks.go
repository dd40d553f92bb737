package image

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// What the Dockerfile must say (SHIP.md: image names, user, entrypoint).
const (
	BuildBase   = "golang:1.26-bookworm"
	RuntimeBase = "gcr.io/distroless/cc-debian12:nonroot"
	SoftHSMBase = "debian:bookworm-slim"
	Binary      = "/usr/local/bin/keyward"
	User        = "65532:65532"
	BuildScript = "./hack/build-release.sh /out/keyward"
	TokenDir    = "/var/lib/softhsm/tokens"
)

// MaxGlibc is the newest glibc symbol version the binary may need: Debian
// 12's glibc 2.36, which both the distroless debian12 images and
// debian:bookworm-slim carry.
var MaxGlibc = [2]int{2, 36}

// RuntimeLibraries are the shared objects the runtime base provides that a
// cgo binary may link: glibc's (Debian 12, glibc 2.36; libpthread, libdl and
// librt are empty stubs since glibc 2.34) and its dynamic loader, per
// architecture.
var RuntimeLibraries = map[elf.Machine][]string{
	elf.EM_X86_64:  {"libc.so.6", "libpthread.so.0", "libdl.so.2", "libm.so.6", "librt.so.1", "ld-linux-x86-64.so.2"},
	elf.EM_AARCH64: {"libc.so.6", "libpthread.so.0", "libdl.so.2", "libm.so.6", "librt.so.1", "ld-linux-aarch64.so.1"},
}

// Interpreters are the dynamic loaders' paths in the runtime base.
var Interpreters = map[elf.Machine]string{
	elf.EM_X86_64:  "/lib64/ld-linux-x86-64.so.2",
	elf.EM_AARCH64: "/lib/ld-linux-aarch64.so.1",
}

// The kinds of problem the checks find; each error wraps one of them.
var (
	ErrStage       = errors.New("stage missing or out of place")
	ErrBase        = errors.New("unexpected base image")
	ErrShellNeeded = errors.New("needs a shell at run time")
	ErrUser        = errors.New("does not run as " + User)
	ErrEntrypoint  = errors.New("entrypoint is not " + Binary)
	ErrBuild       = errors.New("binary not built by " + BuildScript)
	ErrSoftHSM     = errors.New("softhsm stage incomplete")
	ErrLibrary     = errors.New("needs a shared library the runtime base lacks")
	ErrGlibc       = errors.New("needs a newer glibc than the runtime base's")
	ErrNoCgo       = errors.New("built without cgo: no PKCS#11 support")
)

// CheckDockerfile returns every way d departs from what SHIP.md fixes, joined.
func CheckDockerfile(d *Dockerfile) error {
	var errs []error
	bad := func(stage string, kind error, format string, a ...any) {
		errs = append(errs, fmt.Errorf("stage %s: %s: %w", stage, fmt.Sprintf(format, a...), kind))
	}
	stages := map[string]string{"build": BuildBase, "softhsm": SoftHSMBase, "runtime": RuntimeBase}
	for name, base := range stages {
		s, ok := d.Stage(name)
		if !ok {
			bad(name, ErrStage, "no stage named %s", name)
			continue
		}
		if s.Base != base {
			bad(name, ErrBase, "FROM %s, want %s", s.Base, base)
		}
	}
	if last := d.Stages[len(d.Stages)-1]; last.Name != "runtime" {
		bad(last.Name, ErrStage, "the last stage, which `docker build` builds without --target, is %q, want runtime", last.Name)
	}

	if s, ok := d.Stage("build"); ok {
		var script, goBuild int
		for _, in := range s.Body {
			if in.Cmd != "RUN" {
				continue
			}
			if strings.Contains(in.Args, BuildScript) {
				script++
			}
			if strings.Contains(in.Args, "go build") || strings.Contains(in.Args, "go install") {
				goBuild++
			}
		}
		if script != 1 || goBuild != 0 {
			bad("build", ErrBuild, "%d RUN of %s and %d of go build/install, want 1 and 0", script, BuildScript, goBuild)
		}
	}

	for _, name := range []string{"runtime", "softhsm"} {
		s, ok := d.Stage(name)
		if !ok {
			continue
		}
		checkRunStage(name, s, bad)
	}

	if s, ok := d.Stage("runtime"); ok {
		for _, in := range s.Body {
			switch in.Cmd {
			case "RUN", "SHELL":
				bad("runtime", ErrShellNeeded, "line %d: %s in a stage whose base has no shell", in.Line, in.Cmd)
			}
		}
	}

	if s, ok := d.Stage("softhsm"); ok {
		var installs, writesConf bool
		conf := ""
		for _, in := range s.Body {
			if in.Cmd == "ENV" {
				if v, ok := envValue(in.Args, "SOFTHSM2_CONF"); ok {
					conf = v
				}
			}
		}
		for _, in := range s.Body {
			if in.Cmd != "RUN" {
				continue
			}
			if strings.Contains(in.Args, "apt-get install") && slices.Contains(strings.Fields(in.Args), "softhsm2") {
				installs = true
			}
			if conf != "" && strings.Contains(in.Args, "directories.tokendir = "+TokenDir) && strings.Contains(in.Args, "> "+conf) {
				writesConf = true
			}
		}
		if !installs {
			bad("softhsm", ErrSoftHSM, "no RUN apt-get install of softhsm2")
		}
		if conf == "" {
			bad("softhsm", ErrSoftHSM, "no ENV SOFTHSM2_CONF")
		} else if !writesConf {
			bad("softhsm", ErrSoftHSM, "no RUN writes %s with directories.tokendir = %s", conf, TokenDir)
		}
	}
	return errors.Join(errs...)
}

// checkRunStage checks a stage that is an image people run: it copies the
// built binary, runs as the non-root user and starts keyward without a shell.
func checkRunStage(name string, s Stage, bad func(string, error, string, ...any)) {
	var user, entrypoint string
	var copied bool
	for _, in := range s.Body {
		switch in.Cmd {
		case "USER":
			user = in.Args
		case "COPY":
			if in.Args == "--from=build /out/keyward "+Binary {
				copied = true
			}
		case "ENTRYPOINT", "CMD":
			argv, err := ExecForm(in)
			if err != nil {
				bad(name, ErrShellNeeded, "%v", err)
				continue
			}
			if in.Cmd == "ENTRYPOINT" {
				entrypoint = strings.Join(argv, " ")
			}
		}
	}
	if user != User {
		bad(name, ErrUser, "last USER is %q", user)
	}
	if entrypoint != Binary {
		bad(name, ErrEntrypoint, "ENTRYPOINT is %q", entrypoint)
	}
	if !copied {
		bad(name, ErrBuild, "no COPY --from=build /out/keyward %s", Binary)
	}
}

// envValue finds key in ENV's arguments, "K=V ..." or the old "K V" form.
func envValue(args, key string) (string, bool) {
	if k, v, ok := strings.Cut(args, " "); ok && k == key && !strings.Contains(k, "=") {
		return strings.TrimSpace(v), true
	}
	for _, f := range strings.Fields(args) {
		if k, v, ok := strings.Cut(f, "="); ok && k == key {
			return strings.Trim(v, `"`), true
		}
	}
	return "", false
}

// Linkage is what a dynamically linked ELF binary asks of the system.
type Linkage struct {
	Machine     elf.Machine
	Interpreter string   // PT_INTERP, "" for a static binary
	Needed      []string // DT_NEEDED
	Symbols     []elf.ImportedSymbol
}

// ReadLinkage reads f's interpreter, DT_NEEDED entries and imported symbols.
func ReadLinkage(f *elf.File) (Linkage, error) {
	l := Linkage{Machine: f.Machine}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return Linkage{}, fmt.Errorf("reading PT_INTERP: %w", err)
		}
		l.Interpreter = strings.TrimRight(string(b), "\x00")
	}
	var err error
	if l.Needed, err = f.ImportedLibraries(); err != nil {
		return Linkage{}, fmt.Errorf("reading DT_NEEDED: %w", err)
	}
	if l.Symbols, err = f.ImportedSymbols(); err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return Linkage{}, fmt.Errorf("reading the dynamic symbols: %w", err)
	}
	return l, nil
}

// CheckLinkage returns every way l needs more than the runtime base offers,
// or shows a binary built without cgo (no dlopen, so no PKCS#11), joined.
func CheckLinkage(l Linkage) error {
	var errs []error
	allowed, ok := RuntimeLibraries[l.Machine]
	if !ok {
		return fmt.Errorf("machine %v: no known runtime library set: %w", l.Machine, ErrLibrary)
	}
	switch {
	case l.Interpreter == "":
		errs = append(errs, fmt.Errorf("statically linked: %w", ErrNoCgo))
	case l.Interpreter != Interpreters[l.Machine]:
		errs = append(errs, fmt.Errorf("interpreter %q, want %q: %w", l.Interpreter, Interpreters[l.Machine], ErrLibrary))
	}
	for _, lib := range l.Needed {
		if !slices.Contains(allowed, lib) {
			errs = append(errs, fmt.Errorf("DT_NEEDED %s: %w", lib, ErrLibrary))
		}
	}
	var dlopen bool
	for _, s := range l.Symbols {
		if s.Name == "dlopen" {
			dlopen = true
		}
		v, ok := strings.CutPrefix(s.Version, "GLIBC_")
		if !ok {
			continue
		}
		if newer(v, MaxGlibc) {
			errs = append(errs, fmt.Errorf("%s@GLIBC_%s, newer than %d.%d: %w", s.Name, v, MaxGlibc[0], MaxGlibc[1], ErrGlibc))
		}
	}
	if !dlopen {
		errs = append(errs, fmt.Errorf("imports no dlopen: %w", ErrNoCgo))
	}
	return errors.Join(errs...)
}

// newer reports whether glibc version v ("2.34", "2.2.5") is after max.
func newer(v string, max [2]int) bool {
	parts := strings.Split(v, ".")
	for i := 0; i < 2; i++ {
		n := 0
		if i < len(parts) {
			n, _ = strconv.Atoi(parts[i])
		}
		if n != max[i] {
			return n > max[i]
		}
	}
	return false
}
