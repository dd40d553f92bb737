//go:build tools

// Package promtool pins Prometheus's promtool, which the tests of
// deploy/observability run (`promtool check rules`, `promtool test rules`).
// It is a module of its own: `go install …/promtool@version` refuses
// Prometheus's go.mod (it has replace directives), and Prometheus's
// dependencies must not move keyward's own (or hack/tools', which build
// kube-apiserver). Its version matches the PromQL parser in keyward's go.mod.
package promtool

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
