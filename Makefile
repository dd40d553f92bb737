# keyward — build, test and demo. `make help` lists the targets.

# keyward's version (the VERSION file): make release stamps it into the
# binaries, the image tag and the chart's version and appVersion; the
# chart, the overlays and the docs carry it (deploy/image's tests check).
VERSION        := $(shell cat VERSION)
KUBE_VERSION   := v1.37.1
CACHE_DIR      ?= $(or $(KEYWARD_CACHE_DIR),$(HOME)/.cache/keyward)
CP_DIR         := $(CACHE_DIR)/controlplane/$(KUBE_VERSION)
KUBE_APISERVER := $(CP_DIR)/kube-apiserver
KUBE_CONTROLLER_MANAGER := $(CP_DIR)/kube-controller-manager
# The real node (node-tests): kubelet from hack/tools' Kubernetes pin, and
# containerd + runc from hack/node's pins; these versions must match those
# go.mod files (testsupport/node's tests check).
CONTAINERD_VERSION := v2.4.2
RUNC_VERSION       := v1.5.2
CNI_PLUGINS_VERSION := v1.10.0
KUBELET            := $(CACHE_DIR)/node/kubelet-$(KUBE_VERSION)/kubelet
RUNTIME_DIR        := $(CACHE_DIR)/node/containerd-$(CONTAINERD_VERSION)-runc-$(RUNC_VERSION)
CNI_DIR            := $(CACHE_DIR)/node/cni-plugins-$(CNI_PLUGINS_VERSION)
KUBE_SCHEDULER     := $(CP_DIR)/kube-scheduler
KUBECTL            := $(CP_DIR)/kubectl
GO             ?= go
SHELL          := /bin/bash
.SHELLFLAGS    := -o pipefail -c
TEST_TIMEOUT   ?= 45m
UNIT_PKGS       = $(shell $(GO) list ./... | grep -v -e /softhsm-tests -e /node-tests)

# Pinned CLIs the deploy tests run (`make tools`); tests find them through
# these variables and fail with "run make tools" when they are missing.
HELM_VERSION      := v3.22.0
KUSTOMIZE_VERSION := v5.8.1
TOOLS_DIR         := $(CURDIR)/bin/.tools
HELM              := $(TOOLS_DIR)/helm-$(HELM_VERSION)
KUSTOMIZE         := $(TOOLS_DIR)/kustomize-$(KUSTOMIZE_VERSION)

export KEYWARD_CACHE_DIR := $(CACHE_DIR)
export KEYWARD_HELM      := $(CURDIR)/bin/helm
export KEYWARD_KUSTOMIZE := $(CURDIR)/bin/kustomize

.PHONY: release release-deps
DIST := dist
CYCLONEDX_VERSION := v1.10.0
CYCLONEDX         := $(TOOLS_DIR)/cyclonedx-gomod-$(CYCLONEDX_VERSION)

release: release-deps tools $(CYCLONEDX) ## the release artifacts of VERSION into dist/: linux amd64+arm64 binaries (cgo), the runtime image (OCI archive, both architectures, no container engine), the chart package, a CycloneDX SBOM, SHA256SUMS (docs/release.md)
	$(GO) run ./hack/release -version $(VERSION) -dist $(DIST) -helm $(HELM) -cyclonedx-gomod $(CYCLONEDX)

release-deps: ## install what make release needs beyond make deps: Debian's arm64 cross compiler, and arm64 packages known to apt (for the arm64 image)
	@./hack/install-deps.sh release

$(CYCLONEDX):
	@echo "tools: building cyclonedx-gomod $(CYCLONEDX_VERSION)"
	@rm -f $(TOOLS_DIR)/cyclonedx-gomod-*
	GOBIN=$(TOOLS_DIR)/cyclonedx.tmp $(GO) install github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$(CYCLONEDX_VERSION)
	mv $(TOOLS_DIR)/cyclonedx.tmp/cyclonedx-gomod $@ && rmdir $(TOOLS_DIR)/cyclonedx.tmp

.PHONY: help build registry test test-unit test-e2e test-node lint demo deps controlplane controller-manager node clean generate verify-generate

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16

build: ## build bin/keyward
	$(GO) build -o bin/keyward ./cmd/keyward

registry: ## build bin/registry (CNCF Distribution's registry, token auth, local storage) for the demo
	$(GO) build -o bin/registry ./hack/registry

test: deps tools controlplane node ## all tests: unit tests, softhsm-tests (real kube-apiserver + etcd + SoftHSM2) and node-tests (a real kubelet + containerd node; root)
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

test-unit: tools ## tests that need no control plane
	$(GO) test -count=1 $(UNIT_PKGS)

test-e2e: deps controlplane ## only softhsm-tests (verbose)
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -v ./softhsm-tests/...

test-node: deps controlplane node ## only node-tests (verbose): keyward with a real kubelet + containerd + runc in private namespaces; root
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -v ./node-tests/...

lint: verify-generate ## gofmt, go vet, import rules (importrules.yaml files, hack/importcheck), and generated files up to date
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run ./hack/importcheck

# controller-gen is pinned in hack/codegen, a module of its own (neither
# keyward's go.mod nor hack/tools, whose pins build kube-apiserver), and
# built into bin/ whenever that module's pins change.
CONTROLLER_GEN := bin/controller-gen
CRD_TYPES      := ./kubeclient/authority/...

$(CONTROLLER_GEN): hack/codegen/go.mod hack/codegen/go.sum
	@mkdir -p bin
	cd hack/codegen && $(GO) build -o ../../$(CONTROLLER_GEN) sigs.k8s.io/controller-tools/cmd/controller-gen

# The base's RBAC (deploy/rbac) from the base's own configuration files,
# and the token service component's from its own.
BASE_RBAC_FLAGS = --namespace keyward --signer-config deploy/kustomize/base/signer-config.yaml --approver \
	--node-agent --node-agent-namespace keyward-node --ca-admin
TOKEN_SERVICE_RBAC_FLAGS = --namespace keyward --token-service-config deploy/kustomize/components/token-service/token-service-config.yaml

# promtool is pinned in hack/promtool, a module of its own (`go install
# …/promtool@version` refuses Prometheus's go.mod, which has replace
# directives); deploy/observability's tests run it (KEYWARD_PROMTOOL).
PROMTOOL := bin/promtool
export KEYWARD_PROMTOOL := $(CURDIR)/$(PROMTOOL)

$(PROMTOOL): hack/promtool/go.mod hack/promtool/go.sum
	@mkdir -p bin
	@echo "building promtool into bin/ (a few minutes the first time)"
	cd hack/promtool && $(GO) build -o ../../$(PROMTOOL) github.com/prometheus/prometheus/cmd/promtool

generate: $(CONTROLLER_GEN) ## regenerate deepcopy code and deploy/crds from kubeclient/authority; docs/signers.md, docs/configuration.md, docs/metrics.md and the monitoring copies
	$(CONTROLLER_GEN) object paths=$(CRD_TYPES)
	$(CONTROLLER_GEN) crd paths=$(CRD_TYPES) output:crd:artifacts:config=deploy/crds
	$(GO) test ./signer/csr -count=1 -run TestSignersDocMatchesTheExampleConfig -update
	$(GO) test ./deploy/observability -count=1 -run TestGeneratedFilesAreCurrent -update
	$(GO) test ./hack/docgen -count=1 -run TestConfigurationDocIsCurrent -update
	cp deploy/kustomize/overlays/softhsm/softhsm-init.sh deploy/helm/keyward/files/softhsm-init.sh
	cp deploy/kustomize/components/node-address-lock/policy.yaml deploy/helm/keyward/files/node-address-lock.yaml
	$(GO) run ./cmd/keyward deploy rbac $(BASE_RBAC_FLAGS) > deploy/kustomize/base/rbac.yaml.tmp && mv deploy/kustomize/base/rbac.yaml.tmp deploy/kustomize/base/rbac.yaml
	$(GO) run ./cmd/keyward deploy rbac $(TOKEN_SERVICE_RBAC_FLAGS) > deploy/kustomize/components/token-service/rbac.yaml.tmp && mv deploy/kustomize/components/token-service/rbac.yaml.tmp deploy/kustomize/components/token-service/rbac.yaml
	rm -f deploy/helm/keyward/files/crds/*.yaml && cp deploy/crds/*_*.yaml deploy/helm/keyward/files/crds/

verify-generate: $(CONTROLLER_GEN) ## fail if deepcopy code or deploy/crds differ from what the types generate
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(CONTROLLER_GEN) object paths=$(CRD_TYPES) output:object:dir=$$tmp/object && \
	$(CONTROLLER_GEN) crd paths=$(CRD_TYPES) output:crd:dir=$$tmp/crds && \
	diff -u kubeclient/authority/v1alpha1/zz_generated.deepcopy.go $$tmp/object/zz_generated.deepcopy.go && \
	diff -ru -x Kustomization deploy/crds $$tmp/crds || { echo "generated files are stale: run make generate"; exit 1; }
	@$(GO) test ./signer/csr -count=1 -run TestSignersDocMatchesTheExampleConfig >/dev/null || { echo "docs/signers.md is stale: run make generate"; exit 1; }
	@$(GO) test ./deploy/observability -count=1 -run TestGeneratedFilesAreCurrent >/dev/null || { echo "docs/metrics.md or the monitoring copies of deploy/observability are stale: run make generate"; exit 1; }
	@$(GO) test ./hack/docgen -count=1 -run "TestConfigurationDocIsCurrent|TestEveryConfigurationFieldHasADoc" >/dev/null || { echo "docs/configuration.md is stale or a configuration field lacks a doc comment: run go test ./hack/docgen"; exit 1; }
	@cmp -s deploy/kustomize/overlays/softhsm/softhsm-init.sh deploy/helm/keyward/files/softhsm-init.sh || { echo "deploy/helm/keyward/files/softhsm-init.sh differs from the softhsm overlay's: run make generate"; exit 1; }
	@cmp -s deploy/kustomize/components/node-address-lock/policy.yaml deploy/helm/keyward/files/node-address-lock.yaml || { echo "deploy/helm/keyward/files/node-address-lock.yaml differs from the node-address-lock component's: run make generate"; exit 1; }
	@$(GO) run ./cmd/keyward deploy rbac $(BASE_RBAC_FLAGS) | diff -u deploy/kustomize/base/rbac.yaml - || { echo "deploy/kustomize/base/rbac.yaml is stale: run make generate"; exit 1; }
	@$(GO) run ./cmd/keyward deploy rbac $(TOKEN_SERVICE_RBAC_FLAGS) | diff -u deploy/kustomize/components/token-service/rbac.yaml - || { echo "deploy/kustomize/components/token-service/rbac.yaml is stale: run make generate"; exit 1; }
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; cp deploy/crds/*_*.yaml $$tmp/ && \
	diff -ru $$tmp deploy/helm/keyward/files/crds || { echo "the Helm chart's CRDs (deploy/helm/keyward/files/crds) are stale: run make generate"; exit 1; }

demo: deps build registry controlplane ## start kube-apiserver + etcd + a SoftHSM2 token; Ctrl-C stops and cleans up
	./bin/keyward demo

deps: ## install etcd-server, softhsm2, gcc and openssl from Debian if missing (make demo and make test run it)
	@./hack/install-deps.sh

# $(PROMTOOL), where it is defined (deploy/observability's rules tests), has
# its rule next to generate: make tools builds every pinned CLI the tests run.
.PHONY: tools
tools: $(HELM) $(KUSTOMIZE) $(PROMTOOL) ## build the pinned helm, kustomize and promtool CLIs into bin/ (once per pinned version)
	@ln -sfn .tools/$(notdir $(HELM)) bin/helm
	@ln -sfn .tools/$(notdir $(KUSTOMIZE)) bin/kustomize

# Each CLI is built into a file named by its version, so a new pin builds
# anew and the same pin never rebuilds; bin/helm and bin/kustomize link to
# the current one. go install builds in module mode at the pinned version,
# with the tool's own go.mod (keyward's go.mod is not involved).
$(HELM):
	@echo "tools: building helm $(HELM_VERSION)"
	@rm -f $(TOOLS_DIR)/helm-*
	GOBIN=$(TOOLS_DIR)/helm.tmp $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	mv $(TOOLS_DIR)/helm.tmp/helm $@ && rmdir $(TOOLS_DIR)/helm.tmp

$(KUSTOMIZE):
	@echo "tools: building kustomize $(KUSTOMIZE_VERSION)"
	@rm -f $(TOOLS_DIR)/kustomize-*
	GOBIN=$(TOOLS_DIR)/kustomize.tmp $(GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
	mv $(TOOLS_DIR)/kustomize.tmp/kustomize $@ && rmdir $(TOOLS_DIR)/kustomize.tmp

controlplane: ## build kube-apiserver $(KUBE_VERSION) into the cache (once per version)
	@# A binary built before the version flags reports v0.0.0-master (and
	@# helm refuses charts whose kubeVersion it then fails): rebuilt, which
	@# relinks only.
	@if [ -x $(KUBE_APISERVER) ] && ! $(KUBE_APISERVER) --version | grep -qx 'Kubernetes $(KUBE_VERSION)'; then \
		echo "controlplane: $(KUBE_APISERVER) reports $$($(KUBE_APISERVER) --version), not $(KUBE_VERSION): rebuilding"; \
		GO=$(GO) ./hack/build-apiserver.sh $(KUBE_APISERVER); fi
	@$(MAKE) --no-print-directory $(KUBE_APISERVER)

# Keyed by version in the path: a new KUBE_VERSION builds anew, the same one
# never rebuilds. The build lives in hack/tools so keyward's own module never
# compiles Kubernetes.
$(KUBE_APISERVER):
	@echo "building kube-apiserver $(KUBE_VERSION) into $(CP_DIR) (5 to 10 minutes cold; progress every 15s)"
	@mkdir -p $(CP_DIR)
	@GO=$(GO) ./hack/build-apiserver.sh $(KUBE_APISERVER)

node: $(KUBELET) $(RUNTIME_DIR)/runc $(CNI_DIR)/portmap $(KUBE_CONTROLLER_MANAGER) $(KUBE_SCHEDULER) $(KUBECTL) ## build kubelet $(KUBE_VERSION), containerd $(CONTAINERD_VERSION), runc $(RUNC_VERSION), the CNI plugins $(CNI_PLUGINS_VERSION), kube-controller-manager, kube-scheduler and kubectl into the cache (once per version)

# kubelet comes from hack/tools like kube-apiserver (minutes cold, most
# packages shared); containerd, its shim, ctr and runc from hack/node. runc
# is built last, so its presence says the runtime set is whole.
$(KUBELET):
	@echo "building kubelet $(KUBE_VERSION) into $(dir $@) (minutes cold; progress every 15s)"
	@mkdir -p $(dir $@)
	@GO=$(GO) ./hack/build-apiserver.sh $@ kubelet

# The pods' network on the node (bridge, host-local, loopback, portmap),
# from hack/cni; portmap is built last, so its presence says the set is whole.
$(CNI_DIR)/portmap:
	@echo "building the CNI plugins $(CNI_PLUGINS_VERSION) into $(CNI_DIR) (about a minute cold)"
	@GO=$(GO) ./hack/build-cni.sh $(CNI_DIR)

# The node's cluster runs Deployments and schedules pods like a real one.
$(KUBE_SCHEDULER):
	@echo "building kube-scheduler $(KUBE_VERSION) into $(CP_DIR) (minutes; progress every 15s)"
	@mkdir -p $(CP_DIR)
	@GO=$(GO) ./hack/build-apiserver.sh $@ kube-scheduler

# The install test (node-tests/install) runs docs/quickstart.md's kubectl
# commands as written.
$(KUBECTL):
	@echo "building kubectl $(KUBE_VERSION) into $(CP_DIR) (minutes; progress every 15s)"
	@mkdir -p $(CP_DIR)
	@GO=$(GO) ./hack/build-apiserver.sh $@ kubectl

$(RUNTIME_DIR)/runc:
	@echo "building containerd $(CONTAINERD_VERSION) and runc $(RUNC_VERSION) into $(RUNTIME_DIR) (about 6 minutes cold)"
	@GO=$(GO) ./hack/build-node.sh $(RUNTIME_DIR)

controller-manager: $(KUBE_CONTROLLER_MANAGER) ## build kube-controller-manager $(KUBE_VERSION) into the cache, the peer of BenchmarkCSRSigning

# Built like kube-apiserver, from the same pin (it reuses most of its
# compiled packages); only the CSR signing benchmark runs it.
$(KUBE_CONTROLLER_MANAGER):
	@echo "building kube-controller-manager $(KUBE_VERSION) into $(CP_DIR) (minutes; progress every 15s)"
	@mkdir -p $(CP_DIR)
	@GO=$(GO) ./hack/build-apiserver.sh $(KUBE_CONTROLLER_MANAGER) kube-controller-manager

clean: ## remove bin/ and dist/ (the control-plane cache stays)
	rm -rf bin dist

BENCH_COUNT ?= 5
BENCH_OUT   ?= docs/bench
BURST_COUNT ?= 2

.PHONY: bench bench-tokens bench-results
bench: ## run the benchmarks ($(BENCH_COUNT) rounds each) into $(BENCH_OUT)/*.txt; see docs/benchmarks.md
	@mkdir -p $(BENCH_OUT)
	@# One round per go test run, so that raw and keyward alternate and the VM's drift hits both alike.
	for i in $$(seq $(BENCH_COUNT)); do $(GO) test -run '^$$' -bench . -benchtime 2s -count 1 ./backends/file/ ./backends/pkcs11/ || exit 1; done | tee $(BENCH_OUT)/backends-local.txt
	$(GO) test -run '^$$' -bench . -benchtime 5s -count $(BENCH_COUNT) ./backends/gcpkms/ ./backends/awskms/ | tee $(BENCH_OUT)/backends-kms.txt
	$(MAKE) controlplane
	@# Issuance rate against the bare ceiling and latency (file, SoftHSM2, KMS fake at 20 ms), failover, trust propagation.
	$(GO) test -run '^$$' -bench 'PCRThroughput|PCRLatency|Failover|TrustPropagation' -benchtime 1x -count $(BENCH_COUNT) -timeout 60m ./softhsm-tests/ | tee $(BENCH_OUT)/signer.txt
	@# keyward against kube-controller-manager's csrsigning on the same CSRs; KEYWARD_PEER_N=100 for a quick try.
	$(MAKE) controller-manager
	@# One round per go test run: kcm, keyward-file, keyward-softhsm alternate, and each of-kcm is against the kcm round just before.
	for i in $$(seq $(BENCH_COUNT)); do $(GO) test -run '^$$' -bench CSRSigning -benchtime 1x -count 1 -timeout 60m ./softhsm-tests/ || exit 1; done | tee $(BENCH_OUT)/peer.txt
	$(MAKE) bench-tokens
	@# Issuance against an AWS KMS fake throttled to 50 Sign/s, signers[].intermediate off and on, against the bare ceiling.
	$(GO) test -run '^$$' -bench KMSQuota -benchtime 1x -count $(BENCH_COUNT) -timeout 60m ./softhsm-tests/ | tee $(BENCH_OUT)/kmsquota.txt
	@# The 10 000-PCR burst against bin/keyward: BURST_COUNT rounds, each on a fresh control plane; KEYWARD_BURST_N=500 for a quick try.
	$(GO) build -o bin/keyward ./cmd/keyward
	for i in $$(seq $(BURST_COUNT)); do KEYWARD_BURST_BINARY=$(CURDIR)/bin/keyward $(GO) test -run '^$$' -bench Burst10k -benchtime 1x -count 1 -timeout 60m ./softhsm-tests/ || exit 1; done | tee $(BENCH_OUT)/burst.txt

bench-results: ## judge docs/bench/*.txt against docs/bench/targets.yaml: docs/bench/results.json and the table in docs/benchmarks.md
	$(GO) run ./hack/benchresults -commit "$$(git rev-parse --short HEAD 2>/dev/null)"

bench-tokens: controlplane ## the registry token service's issuance rate and latency ($(BENCH_COUNT) rounds) into $(BENCH_OUT)/tokenservice.txt
	@mkdir -p $(BENCH_OUT)
	$(GO) test -run '^$$' -bench TokenService -benchtime 1x -count $(BENCH_COUNT) -timeout 60m ./softhsm-tests/ | tee $(BENCH_OUT)/tokenservice.txt

FUZZTIME ?= 30s
# A new input that widens coverage is minimized for up to this long, inside
# FUZZTIME; at go's default (60s) one big input (a configuration file, an
# oversize annotation) takes the whole run and nothing else is tried.
FUZZMINIMIZETIME ?= 2s

# package:target, run one after another (a fuzz run takes every core it is
# given; two at once only halve each other). docs/fuzzing.md says what each
# checks and what the last runs found.
FUZZ_TARGETS = \
	./signer/pcr/:FuzzPublicKey \
	./signer/pcr/:FuzzUnverifiedUserAnnotations \
	./signer/csr/:FuzzCSRPolicy \
	./signer/config/:FuzzSignerConfigParse \
	./backends/pkcs11/:FuzzParseLocation \
	./nodehelper/trust/:FuzzMerge \
	./signer/tokenservice/config/:FuzzConfigParse \
	./signer/tokenservice/policy/:FuzzParseScopes \
	./signer/tokenservice/policy/:FuzzParseImage

.PHONY: fuzz
fuzz: ## run each fuzz target for $(FUZZTIME), one after another (docs/fuzzing.md); a crasher lands in the package's testdata/fuzz
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "== $$name ($$pkg, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $$pkg; \
	done

.PHONY: vuln
vuln: ## govulncheck ./... (vuln.go.dev, else a database built from golang.org/x/vulndb on the module proxy); see docs/security.md
	GO=$(GO) ./hack/vulncheck.sh

.PHONY: test-faults
FAULT_TESTS = Fault|BackendOutageDuringABurst|LeaderStoppedMidBurst|KMSOutageDuringABurst
test-faults: deps controlplane ## the fault-injection runs of docs/faults.md at full length (KEYWARD_FAULTS=long)
	KEYWARD_FAULTS=long $(GO) test -count=1 -v -run '$(FAULT_TESTS)' -timeout 30m ./softhsm-tests/
