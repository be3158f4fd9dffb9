#!/usr/bin/env bash
# Builds the real binaries the tests and the demo run: etcd (from the etcd
# server module pinned in go.mod) and kube-apiserver (from k8s.io/kubernetes in
# the separate module hack/tools/kube-apiserver). Each lands in bin/ under a
# versioned name and is built once per machine; bin/envtest/ links the current
# versions under the names envtest expects (KUBEBUILDER_ASSETS).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${DRUID_STRETCH_BIN:-$root/bin}
mkdir -p "$bin/envtest"

# The compile flags never change: a change would throw away the build cache
# (the -X version stamps below touch only the link step).
build_flags=(-trimpath)

etcd_version=$(cd "$root" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
kube_version=$(cd "$root/hack/tools/kube-apiserver" && go list -m -f '{{.Version}}' k8s.io/kubernetes)

build() { # name version dir package [extra ldflags]
	local name=$1 version=$2 dir=$3 pkg=$4 ldflags=${5:-} out="$bin/$1-$2"
	if [[ -x $out ]]; then
		echo "$name $version: $out (cached)"
	else
		echo "$name $version: building into $out (once per machine; kube-apiserver takes several minutes)"
		local start=$SECONDS
		(cd "$dir" && go build "${build_flags[@]}" "-ldflags=-s -w $ldflags" -o "$out.tmp" "$pkg")
		mv "$out.tmp" "$out"
		echo "$name $version: built in $((SECONDS - start))s"
	fi
	ln -sfn "../$name-$version" "$bin/envtest/$name"
}

build etcd "$etcd_version" "$root" ./hack/etcd
# kube-apiserver reports the version it was built from (discovery, Helm's kubeVersion check).
kube_minor=${kube_version#v1.}; kube_minor=${kube_minor%%.*}
build kube-apiserver "$kube_version" "$root/hack/tools/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver \
	"-X k8s.io/component-base/version.gitVersion=$kube_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kube_minor"
echo "KUBEBUILDER_ASSETS=$bin/envtest"
