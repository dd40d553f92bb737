package crc32c

import "testing"

// RFC 3720 (iSCSI) B.4 gives the CRC32C of 32 zero bytes; "123456789" is
// the usual check value.
func TestChecksumMatchesKnownValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want int64
	}{
		{"the check string 123456789", []byte("123456789"), 0xe3069283},
		{"32 zero bytes", make([]byte, 32), 0x8a9136aa},
		{"nothing", nil, 0},
	} {
		if got := Checksum(tc.in); got != tc.want {
			t.Errorf("%s: Checksum = %#x, want %#x", tc.name, got, tc.want)
		}
	}
}
