package trust

import (
	"bytes"
	"encoding/pem"
	"testing"
)

// FuzzMerge: whatever two bundles hold, Merge's output is bare
// CERTIFICATE blocks in canonical PEM (ders fails on anything else),
// strictly ascending by DER (so each certificate once, and the same bytes
// whatever the order of the bundles), holds exactly the CERTIFICATE
// blocks of the bundles, and merging it again changes nothing.
func FuzzMerge(f *testing.F) {
	a := pemOf(testCert(f, "a"), nil)
	b := pemOf(testCert(f, "b"), map[string]string{"Comment": "bundle b"})
	key := "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
	f.Add([]byte(a+b), []byte(b))
	f.Add([]byte("# explanatory text\n"+a+key), []byte(nil))
	f.Add([]byte(a), []byte(a[:len(a)/2]))
	f.Add([]byte(b+a+a), []byte("\r\n"+a))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), []byte(""))
	f.Fuzz(func(t *testing.T, x, y []byte) {
		out := Merge(x, y)
		got := ders(t, out)
		for i := 1; i < len(got); i++ {
			if bytes.Compare(got[i-1], got[i]) >= 0 {
				t.Fatalf("blocks %d and %d out of order or repeated", i-1, i)
			}
		}
		want := map[string]bool{}
		for _, in := range [][]byte{x, y} {
			for rest := in; ; {
				var block *pem.Block
				if block, rest = pem.Decode(rest); block == nil {
					break
				}
				if block.Type == "CERTIFICATE" && len(block.Bytes) > 0 {
					want[string(block.Bytes)] = true
				}
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%d certificates out, %d distinct in", len(got), len(want))
		}
		for _, der := range got {
			if !want[string(der)] {
				t.Fatalf("a certificate out that no bundle holds: %x", der)
			}
		}
		if len(want) == 0 && out != nil {
			t.Fatalf("no certificate in, %q out", out)
		}
		if swapped := Merge(y, x); !bytes.Equal(swapped, out) {
			t.Fatal("the order of the bundles changed the output")
		}
		if again := Merge(out); !bytes.Equal(again, out) {
			t.Fatal("merging the output again changed it")
		}
	})
}
