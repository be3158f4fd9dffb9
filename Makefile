# druid-stretch: every target a newcomer or CI needs.
SHELL := /usr/bin/env bash
GO ?= go
BIN := $(CURDIR)/bin
# The real binaries come from DRUID_STRETCH_BIN when set (one set shared by
# several clones, as hack/test-binaries.sh builds them), else from bin/.
export KUBEBUILDER_ASSETS := $(or $(DRUID_STRETCH_BIN),$(BIN))/envtest

.PHONY: all build dev image test-binaries test test-unit test-integration test-e2e test-sites fault-matrix site-fault-matrix lint generate verify-generate demo bench clean help

all: build

# What ships is built from the root go.mod alone (GOWORK=off), not from the
# workspace of go.work that the tests use.
build: ## the druid-stretch binary, version-stamped
	GOWORK=off $(GO) build -ldflags="$(VERSION_LDFLAGS)" -o $(BIN)/druid-stretch .

dev: ## druid-stretch-dev: the demo, the benchmarks and the image writer, which the shipped binary leaves out
	$(GO) build -ldflags="$(VERSION_LDFLAGS)" -o $(BIN)/druid-stretch-dev ./test/cmd/druid-stretch-dev

# The image needs no Docker engine: a static Linux binary for ARCH (default:
# this machine's) goes into a FROM-scratch image, written as a tarball for
# docker load -i, kind load image-archive or crane push. IMAGE and VERSION
# make its tag; SOURCE_DATE_EPOCH, when set, stamps its times (else 1970).
# VERSION's dirty check is diff-index, plumbing that never rewrites
# .git/index (describe --dirty refreshes it).
IMAGE ?= druid-stretch
VERSION ?= $(shell git describe --tags --always 2>/dev/null || echo dev)$(shell git rev-parse -q --verify HEAD >/dev/null 2>&1 && ! git diff-index --quiet HEAD -- && echo -dirty)
COMMIT ?= $(shell git rev-parse -q --verify HEAD 2>/dev/null)$(shell git rev-parse -q --verify HEAD >/dev/null 2>&1 && ! git diff-index --quiet HEAD -- && echo -dirty)
ARCH ?= $(shell $(GO) env GOARCH)
# druid-stretch version and --version print these; the controller logs them
# at start and the image carries them as labels.
VERSION_PKG := github.com/druid-stretch/druid-stretch/internal/version
VERSION_LDFLAGS := -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).commit=$(COMMIT)

image: dev ## the container image as bin/druid-stretch-image.tar, without Docker
	GOWORK=off CGO_ENABLED=0 GOOS=linux GOARCH=$(ARCH) $(GO) build -trimpath -ldflags="-s -w $(VERSION_LDFLAGS)" -o $(BIN)/druid-stretch-linux-$(ARCH) .
	$(BIN)/druid-stretch-dev image --binary $(BIN)/druid-stretch-linux-$(ARCH) \
		--output $(BIN)/druid-stretch-image.tar --tag $(IMAGE):$(VERSION) --version $(VERSION) --revision $(COMMIT)

test-binaries: ## etcd, the Kubernetes control plane, etcd-druid and etcdbrctl once per machine, the static project binaries on every run, into bin/
	hack/test-binaries.sh

# The modules. go.work makes one workspace of the first three, so that one
# go test run takes packages of each:
#   .               the product: the controller, the sidecar, the migration
#                   and rebalance commands, and the harness of their own tests
#   api/            the API gardenlet imports, kept free of the controller's
#                   dependencies
#   test/           the test infrastructure (real sites, the node and
#                   etcd-wrapper stand-ins, the pod network, load, reports,
#                   the demo and the bench, druid-stretch-dev) and the tests
#                   on it: e2e on processes, sites, the chart, the CRDs, docs
#   test/promrules  the PrometheusRule checked with Prometheus' rule parser,
#                   outside the workspace: its dependencies would raise the
#                   versions the product's tests build with
# Nested modules run on their own go.mod (GOWORK=off), from their folders.
NESTED_MODULES := api test/promrules
# Every package of the workspace but the API module's.
ALL_PACKAGES := ./... ./test/...

# The tiers. Every package's tests are one of:
#   unit         pure tests, no binary: go test -short skips every test
#                that runs real parts (testbin.Need); no bin/ needed
#   integration  real etcd, envtest's kube-apiserver, the sidecar, the
#                chart: every package but the two below
#   e2e          test/e2e: live moves on etcd processes between two envtest
#                clusters, with faults
#   sites        test/site: live moves, the GEP-39 move and the
#                rebalance on real sites
# No test asserts a time bound (a write gap, a tie's length, a step's
# duration): a busy machine stretches them all; the demo and the bench
# report them.
E2E_PACKAGES := ./test/e2e
SITE_PACKAGES := ./test/site
# The longest packages first: go test runs two at a time, in the order
# given, and in ./...'s order test/e2e would start only once every other
# package had run.
SLOW_PACKAGES := $(E2E_PACKAGES) $(SITE_PACKAGES) ./controllers/membership
other_packages = $$($(GO) list $(ALL_PACKAGES) | grep -v -e '/test/e2e$$' -e '/test/site$$' -e '/controllers/membership$$')

# The unit tier leaves out the packages whose TestMain runs no test under
# -short and says so ("none runs under -short"): building their test
# binaries, which link a control plane's worth of dependencies, would be
# most of the tier's time for nothing.
unit_packages = $$(skip=$$(grep -rl --include='*_test.go' 'none runs under -short' . | xargs -r -n1 dirname | sort -u | sed 's|^\.|$(CURDIR)|'); $(GO) list -f '{{.Dir}} {{.ImportPath}}' $(ALL_PACKAGES) | awk -v skip="$$skip" 'BEGIN { n = split(skip, s, "\n"); for (i = 1; i <= n; i++) out[s[i]] = 1 } !($$1 in out) { print $$2 }')

# go vet runs in make lint (golangci-lint), not a second time here.
test-unit: ## the unit tier: pure tests, no binaries, about a minute
	for m in $(NESTED_MODULES); do GOWORK=off $(GO) -C $$m test -short -count=1 -vet=off ./... || exit 1; done
	$(GO) test -short -count=1 -vet=off $(unit_packages)

test-integration: test-binaries ## the integration tier: real etcd, envtest, the sidecar and the chart
	$(GO) test -count=1 -vet=off -timeout 30m ./controllers/membership $(other_packages)

test-e2e: test-binaries ## the e2e tier: live moves on etcd processes between two envtest clusters, with faults
	$(GO) test -count=1 -vet=off -timeout 40m $(E2E_PACKAGES)

test-sites: test-binaries ## the sites tier: live moves and the rebalance on real sites
	$(GO) test -count=1 -vet=off -timeout 40m $(SITE_PACKAGES)

# On a failure, the end of each failed test's output is printed again
# after the run (hack/failed-tests.sh): a live move logs hundreds of lines
# before its failed assertion.
test: test-binaries lint verify-generate ## every tier in one run, two packages at a time: the README's and CI's command
	for m in $(NESTED_MODULES); do GOWORK=off $(GO) -C $$m test -count=1 -vet=off ./... || exit 1; done
	@log=$$(mktemp); trap 'rm -f "$$log"' EXIT; set -o pipefail; \
	echo "$(GO) test -count=1 -vet=off -timeout 55m $(SLOW_PACKAGES) <the other packages>"; \
	$(GO) test -count=1 -vet=off -timeout 55m $(SLOW_PACKAGES) $(other_packages) 2>&1 | tee "$$log" || { hack/failed-tests.sh "$$log"; exit 1; }

# Two lanes: two moves at a time, each in two clusters of its own. -v
# streams each run's log as it goes: without it a failed run's messages
# show only once the whole matrix ended.
# Then the etcd pods deleted at every step of a live move between two real
# sites (five moves, one at a time: each runs two sites of real parts).
fault-matrix: test-binaries ## every fault in every phase of a live move (40 moves, two at a time; writes the table into docs/reliability.md), then etcd pods deleted at every step of a move between real sites (5 moves)
	$(GO) test -count=1 -timeout 240m -v -run TestFaultMatrix ./test/e2e -args -faults=full -faults.lanes=2 -faults.write=$(CURDIR)/docs/reliability.md
	$(GO) test -count=1 -timeout 60m -v -run TestLiveMoveSurvivesPodDeletion ./test/site -args -pod-deletions=full

# One move per row, one at a time: each runs two sites of real parts.
site-fault-matrix: test-binaries ## faults of druid's and druid-stretch's side (druid or the controller killed, CRDs re-applied, status dropped, fields deleted, a partition, busy cores) at each phase of a live move between real sites and of a rebalance (41 moves; writes the table into docs/reliability.md)
	$(GO) test -count=1 -timeout 240m -v -run TestSiteFaultMatrix ./test/site -args -site-faults=full -site-faults.write=$(CURDIR)/docs/reliability.md

# golangci-lint (its linters, go vet among them, in .golangci.yml; its
# version pinned in hack/tools/golangci-lint, built into bin/ once) in every
# module, and a gofmt check of every Go file, the tools' modules included.
lint: ## golangci-lint and a gofmt check, in every module
	hack/golangci-lint.sh
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

CRD_DIR := charts/druid-stretch/crds
# The EtcdMembership (druid-stretch's own group) is the chart's only CRD.
# The extended Etcd (druid's group, the inline form of earlier releases)
# is generated for the tests of the upgrade from it, never shipped: a seed
# keeps druid's own Etcd CRD. controller-gen takes one group per package.
STRETCH_API_DIR := api/stretch/v1alpha1
EXTENDED_API_DIR := api/v1alpha1
EXTENDED_CRD_DIR := internal/testing/extendedcrd
API_DIRS := $(EXTENDED_API_DIR) $(STRETCH_API_DIR)
CONTROLLER_GEN := $(GO) tool controller-gen

generate: ## deepcopy and the CRDs from the API types
	for d in $(API_DIRS); do $(CONTROLLER_GEN) object paths=./$$d || exit 1; done
	$(CONTROLLER_GEN) crd paths=./$(STRETCH_API_DIR) output:crd:dir=$(CRD_DIR)
	$(CONTROLLER_GEN) crd paths=./$(EXTENDED_API_DIR) output:crd:dir=$(EXTENDED_CRD_DIR)

verify-generate: ## fails when the generated deepcopy or CRDs are not current
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	for d in $(API_DIRS); do \
		$(CONTROLLER_GEN) object paths=./$$d output:object:dir="$$tmp/$$d" && \
		diff -u $$d/zz_generated.deepcopy.go "$$tmp/$$d/zz_generated.deepcopy.go" || { echo "generated files are stale: run make generate"; exit 1; }; \
	done; \
	$(CONTROLLER_GEN) crd paths=./$(STRETCH_API_DIR) output:crd:dir="$$tmp/crd" && \
	$(CONTROLLER_GEN) crd paths=./$(EXTENDED_API_DIR) output:crd:dir="$$tmp/extended" && \
	diff -ru $(CRD_DIR) "$$tmp/crd" && diff -u $(EXTENDED_CRD_DIR)/druid.gardener.cloud_etcds.yaml "$$tmp/extended/druid.gardener.cloud_etcds.yaml" || { echo "generated files are stale: run make generate"; exit 1; }

demo: test-binaries dev ## the live move of an etcd cluster between two local clusters
	$(BIN)/druid-stretch-dev demo

bench: test-binaries ## benchmarks; they print their figures
	$(GO) test -run '^$$' -bench . -benchtime 1x $(ALL_PACKAGES)

help: ## these targets, each with what it does
	@awk -F ':.*## ' '/^[a-zA-Z0-9_-]+:.*## / { printf "  %-20s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

clean:
	rm -rf $(BIN)/druid-stretch $(BIN)/druid-stretch-dev $(BIN)/druid-stretch-linux-* $(BIN)/druid-stretch-image.tar
