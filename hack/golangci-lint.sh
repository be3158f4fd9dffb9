#!/usr/bin/env bash
# Runs golangci-lint at the version hack/tools/golangci-lint/go.mod pins,
# built once per machine into bin/golangci-lint-<version> (as
# hack/test-binaries.sh builds the real binaries), in the root module and
# in every nested module of the project. Arguments go to `golangci-lint
# run`; the linters are chosen in .golangci.yml.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${DRUID_STRETCH_BIN:-$root/bin}
tools=$root/hack/tools/golangci-lint
version=$(cd "$tools" && GOWORK=off go list -m -f '{{.Version}}' github.com/golangci/golangci-lint/v2)
lint=$bin/golangci-lint-$version
if [[ ! -x $lint ]]; then
	echo "golangci-lint $version: building into $lint (once per machine; about 3 minutes)"
	mkdir -p "$bin"
	(cd "$tools" && GOWORK=off go build -trimpath -ldflags="-s -w" -o "$lint.tmp.$$" github.com/golangci/golangci-lint/v2/cmd/golangci-lint)
	mv "$lint.tmp.$$" "$lint"
fi
# Each module on its own go.mod (GOWORK=off), as each is built and shipped;
# the test module reaches the root and the API modules through its replace
# directives.
status=0
for m in . api test test/promrules; do
	(cd "$root/$m" && GOWORK=off "$lint" run --config "$root/.golangci.yml" "$@" ./...) || status=1
done
exit $status
