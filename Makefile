# druid-stretch: every target a newcomer or CI needs.
SHELL := /usr/bin/env bash
GO ?= go
BIN := $(CURDIR)/bin
export KUBEBUILDER_ASSETS := $(BIN)/envtest

.PHONY: all build test-binaries test lint generate verify-generate demo bench clean

all: build

build: ## the druid-stretch binary
	$(GO) build -o $(BIN)/druid-stretch .

test-binaries: ## etcd and kube-apiserver, built once per machine into bin/
	hack/test-binaries.sh

test: test-binaries lint ## every test, on real etcd and a real kube-apiserver
	$(GO) test -count=1 -timeout 45m ./...

lint: ## go vet and a gofmt check
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

demo: test-binaries build ## the live move of an etcd cluster between two local clusters
	$(BIN)/druid-stretch demo

bench: test-binaries ## benchmarks; they print their figures
	$(GO) test -run '^$$' -bench . -benchtime 1x ./...

clean:
	rm -rf $(BIN)/druid-stretch
