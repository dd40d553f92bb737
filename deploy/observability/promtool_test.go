package observability_test

import (
	"testing"
)

// promtool (Prometheus's own rule checker, pinned in hack/promtool) accepts
// rules.yaml, templates included, and the alerts fire exactly as
// testdata/rules_test.yaml says: the CA-expiry alert on the Active
// generation only, NoLeader once no replica leads, a stuck gate past an
// hour only, a failure ratio over 5% per signer.
func TestPromtoolChecksAndUnitTestsTheRules(t *testing.T) {
	promtool := tool(t, "KEYWARD_PROMTOOL", "promtool")
	t.Run("promtool check rules accepts rules.yaml", func(t *testing.T) {
		run(t, promtool, "check", "rules", "rules.yaml")
	})
	t.Run("promtool test rules passes the alert unit tests", func(t *testing.T) {
		run(t, promtool, "test", "rules", "testdata/rules_test.yaml")
	})
}
