// Package caadmin carries the CA administrator's Job
// (deploy/examples/ca-admin/job.yaml, docs/production/ca-admin.md): keyward
// ca init as the keyward-ca-admin ServiceAccount, where the HSM is
// reachable. Its test proves the Job is admitted under Pod Security
// "restricted" and that its arguments are flags keyward ca init knows.
package caadmin

import _ "embed"

// Job is job.yaml.
//
//go:embed job.yaml
var Job []byte
