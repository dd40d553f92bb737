// Package crc32c computes the CRC32C (Castagnoli) checksums Cloud KMS puts
// in its requests and answers, for the gcpkms backend and its test fake.
package crc32c

import "hash/crc32"

var table = crc32.MakeTable(crc32.Castagnoli)

// Checksum is b's CRC32C as the Cloud KMS API carries it: an int64 that is
// never negative and fits in 32 bits.
func Checksum(b []byte) int64 { return int64(crc32.Checksum(b, table)) }
