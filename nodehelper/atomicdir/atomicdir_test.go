package atomicdir

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

var keep = Options{UID: KeepOwner, GID: KeepOwner}

func set(gen int) map[string]File {
	return map[string]File{
		"key.pem":  {Data: []byte(fmt.Sprintf("key %d", gen)), Mode: 0o600},
		"cert.pem": {Data: []byte(fmt.Sprintf("cert %d", gen)), Mode: 0o644},
	}
}

// timestamped lists the ..<timestamp> directories in dir.
func timestamped(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "..") {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestWriteLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	if err := Write(dir, set(1), keep); err != nil {
		t.Fatalf("Write: %v", err)
	}
	ts := timestamped(t, dir)
	if len(ts) != 1 {
		t.Fatalf("timestamped directories = %v, want one", ts)
	}
	if got, err := os.Readlink(filepath.Join(dir, DataLink)); err != nil || got != ts[0] {
		t.Fatalf("..data -> %q (%v), want %q", got, err, ts[0])
	}
	for name, f := range set(1) {
		link, err := os.Readlink(filepath.Join(dir, name))
		if err != nil || link != filepath.Join(DataLink, name) {
			t.Errorf("%s -> %q (%v), want ..data/%s", name, link, err, name)
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(b, f.Data) {
			t.Errorf("%s holds %q (%v), want %q", name, b, err, f.Data)
		}
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != f.Mode {
			t.Errorf("%s mode %v (%v), want %v", name, st.Mode().Perm(), err, f.Mode)
		}
	}
}

func TestWriteModes(t *testing.T) {
	dir := t.TempDir()
	// 0664 checks that the umask (usually 022) does not clear bits.
	files := map[string]File{"ca.pem": {Data: []byte("ca")}, "shared.pem": {Data: []byte("s"), Mode: 0o664}}
	if err := Write(dir, files, keep); err != nil {
		t.Fatalf("Write: %v", err)
	}
	for name, want := range map[string]os.FileMode{"ca.pem": 0o644, "shared.pem": 0o664} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s mode %v, want %v", name, st.Mode().Perm(), want)
		}
	}
}

func TestWriteSetsTheOwner(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("changing the owner to another uid needs root")
	}
	dir := t.TempDir()
	if err := Write(dir, set(1), Options{UID: 4321, GID: 4322}); err != nil {
		t.Fatalf("Write: %v", err)
	}
	target, err := os.Readlink(filepath.Join(dir, DataLink))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{target, filepath.Join(target, "key.pem"), filepath.Join(target, "cert.pem")} {
		st, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if sys.Uid != 4321 || sys.Gid != 4322 {
			t.Errorf("%s owned by %d:%d, want 4321:4322", p, sys.Uid, sys.Gid)
		}
	}
}

func TestSecondWriteSwapsAndCleansUp(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, set(1), keep); err != nil {
		t.Fatal(err)
	}
	first := timestamped(t, dir)
	// The second set drops cert.pem and adds chain.pem.
	second := map[string]File{
		"key.pem":   {Data: []byte("key 2"), Mode: 0o600},
		"chain.pem": {Data: []byte("chain 2")},
	}
	if err := Write(dir, second, keep); err != nil {
		t.Fatal(err)
	}
	ts := timestamped(t, dir)
	if len(ts) != 1 || ts[0] == first[0] {
		t.Fatalf("timestamped directories after second Write = %v (first was %v), want one new", ts, first)
	}
	got, err := Read(dir, "key.pem", "chain.pem")
	if err != nil {
		t.Fatal(err)
	}
	if string(got["key.pem"]) != "key 2" || string(got["chain.pem"]) != "chain 2" {
		t.Errorf("Read = %q, want the second set", got)
	}
	if _, err := os.Lstat(filepath.Join(dir, "cert.pem")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cert.pem link left after a set without it: %v", err)
	}
	if _, err := Read(dir, "cert.pem"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read of a name the set lacks = %v, want ErrNotExist", err)
	}
}

func TestWriteRemovesDirectoriesACrashLeft(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "..2020_01_01_00_00_00.123"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(dir, set(1), keep); err != nil {
		t.Fatal(err)
	}
	if ts := timestamped(t, dir); len(ts) != 1 {
		t.Errorf("timestamped directories = %v, want only the new one", ts)
	}
}

func TestWriteRepairsADataLinkToAMissingDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, set(1), keep); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, timestamped(t, dir)[0])); err != nil {
		t.Fatal(err)
	}
	if err := Write(dir, set(2), keep); err != nil {
		t.Fatalf("Write over a dangling ..data: %v", err)
	}
	got, err := Read(dir, "key.pem", "cert.pem")
	if err != nil || string(got["key.pem"]) != "key 2" || string(got["cert.pem"]) != "cert 2" {
		t.Errorf("Read = %q, %v; want the second set", got, err)
	}
}

func TestWriteErrorsKeepThePreviousSet(t *testing.T) {
	injected := errors.New("injected")
	cases := []struct {
		name    string
		files   map[string]File
		h       hooks
		wantErr error
	}{
		{name: "a name with a slash is refused", files: map[string]File{"a/b": {Data: []byte("x")}}, wantErr: ErrInvalidName},
		{name: "a name starting with .. is refused", files: map[string]File{"..data": {Data: []byte("x")}}, wantErr: ErrInvalidName},
		{name: "a failure after the files are written, before the swap, changes nothing", files: set(2),
			h: hooks{beforeSwap: func() error { return injected }}, wantErr: injected},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := Write(dir, set(1), keep); err != nil {
				t.Fatal(err)
			}
			before := timestamped(t, dir)
			err := write(dir, tc.files, keep, tc.h)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("write = %v, want %v", err, tc.wantErr)
			}
			got, err := Read(dir, "key.pem", "cert.pem")
			if err != nil {
				t.Fatal(err)
			}
			if string(got["key.pem"]) != "key 1" || string(got["cert.pem"]) != "cert 1" {
				t.Errorf("after a failed write Read = %q, want the first set", got)
			}
			if after := timestamped(t, dir); len(after) != 1 || after[0] != before[0] {
				t.Errorf("timestamped directories %v, want only %v", after, before)
			}
		})
	}
}

// TestReaderNeverSeesAMixedSet hammers Read while Write replaces the set
// many times: every read must return key and cert of the same generation.
func TestReaderNeverSeesAMixedSet(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, set(0), keep); err != nil {
		t.Fatal(err)
	}
	const writes = 300
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	reads := make([]int, 4)
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				got, err := Read(dir, "key.pem", "cert.pem")
				if err != nil {
					errs <- fmt.Errorf("Read: %w", err)
					return
				}
				reads[r]++
				k := strings.TrimPrefix(string(got["key.pem"]), "key ")
				c := strings.TrimPrefix(string(got["cert.pem"]), "cert ")
				if k != c {
					errs <- fmt.Errorf("mixed set: key of write %s, cert of write %s", k, c)
					return
				}
			}
		}()
	}
	for gen := 1; gen <= writes; gen++ {
		if err := Write(dir, set(gen), keep); err != nil {
			t.Fatalf("Write %d: %v", gen, err)
		}
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("reads per reader: %v", reads)
}
