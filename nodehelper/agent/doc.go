// Package agent is `keyward node agent`: it keeps node-daemon credentials
// (key and certificate via CertificateSigningRequests, crash-safe in a
// certstore, projected with atomicdir) and trust files (ClusterTrustBundles)
// current on a node, with KEP-266's bootstrap of the node identity, metrics
// and a health endpoint.
package agent
