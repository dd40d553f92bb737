// Package trust projects ClusterTrustBundles to a trust file on the node:
// selected by name, or by signer name and canary/live version (which a
// label on the Node may choose), merged, deduplicated and written
// atomically, rewritten when a bundle or the Node label changes.
package trust

import (
	"bytes"
	"encoding/pem"
	"slices"
)

// Merge returns the certificates of bundles as one PEM file: only
// CERTIFICATE blocks, their headers and any data between blocks dropped,
// each DER once, ordered by DER bytes so that the same set of certificates
// always gives the same file whatever the order of the bundles. It returns
// nil when bundles hold no certificate.
func Merge(bundles ...[]byte) []byte {
	seen := map[string]bool{}
	var ders [][]byte
	for _, b := range bundles {
		for rest := b; ; {
			var block *pem.Block
			block, rest = pem.Decode(rest)
			if block == nil {
				break
			}
			if block.Type != "CERTIFICATE" || len(block.Bytes) == 0 || seen[string(block.Bytes)] {
				continue
			}
			seen[string(block.Bytes)] = true
			ders = append(ders, block.Bytes)
		}
	}
	if len(ders) == 0 {
		return nil
	}
	slices.SortFunc(ders, bytes.Compare)
	var out bytes.Buffer
	for _, der := range ders {
		// Encoding to a bytes.Buffer does not fail.
		_ = pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	return out.Bytes()
}
