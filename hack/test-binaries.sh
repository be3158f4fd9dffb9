#!/usr/bin/env bash
# Builds the real binaries that the tests, the demo and a real test site run.
#
# Built once per machine, keyed by the version pinned in a go.mod:
#   bin/etcd-<v>                     etcd's server, hack/tools/etcd (the root go.mod's etcd client release)
#   bin/kube-apiserver-<v>           k8s.io/kubernetes, pinned in the separate module
#   bin/kube-controller-manager-<v>    hack/tools/kubernetes
#   bin/kube-scheduler-<v>
#   bin/etcd-druid-<v>               the etcd-druid manager, hack/tools/etcd-druid
#   bin/etcdbrctl-<v>                etcd-backup-restore, hack/tools/etcd-backup-restore
# Linked under stable names to the current versions:
#   bin/envtest/{etcd,kube-apiserver,kube-controller-manager,kube-scheduler}
#                                    (the names envtest expects in KUBEBUILDER_ASSETS)
#   bin/etcd-druid, bin/etcdbrctl
# Built from this repository on every run (the build cache makes that cheap),
# each only when its folder exists:
#   bin/etcd-wrapper, bin/pod-sandbox  test/cmd/{etcd-wrapper,pod-sandbox}
#   bin/druid-stretch-static           the druid-stretch command, for pods
# etcdbrctl and the binaries built from this repository are static
# (CGO_ENABLED=0): they run chrooted, without the host's libc.
#
# etcd's server, k8s.io/kubernetes, etcd-druid and etcd-backup-restore each
# live in a module of their own under hack/tools so that none of them enters
# the root go.mod. Every build here uses its own module's go.mod alone, not
# the workspace of go.work (which lists only the project's own modules).
set -euo pipefail
export GOWORK=off

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${DRUID_STRETCH_BIN:-$root/bin}
tools=$root/hack/tools
mkdir -p "$bin/envtest"

# The compile flags never change: a change would throw away the build cache
# (the -X version stamps below touch only the link step).
build_flags=(-trimpath)

pinned() { # dir module: the version of module that dir's go.mod pins
	(cd "$1" && go list -m -f '{{.Version}}' "$2")
}

etcd_version=$(pinned "$tools/etcd" go.etcd.io/etcd/server/v3)
kube_version=$(pinned "$tools/kubernetes" k8s.io/kubernetes)
druid_version=$(pinned "$tools/etcd-druid" github.com/gardener/etcd-druid)
br_version=$(pinned "$tools/etcd-backup-restore" github.com/gardener/etcd-backup-restore)

build() { # out dir package [ldflags]; CGO_ENABLED and GOFLAGS come from the caller
	(cd "$2" && go build "${build_flags[@]}" "-ldflags=-s -w ${4:-}" -o "$1" "$3")
}

# The external binaries are built once per machine, with -trimpath, so
# nothing else ever reuses their compiled packages: those gigabytes go to a
# build cache of their own, shared by these builds (the three Kubernetes
# commands share most packages) and removed on exit, instead of filling the
# disk that the tests' etcd members preallocate their logs on.
ext_cache=
cleanup() { [[ -z $ext_cache ]] || rm -rf "$ext_cache"; }
trap cleanup EXIT

once() { # name version dir package [ldflags]: bin/name-version, unless it exists
	local name=$1 version=$2 out="$bin/$1-$2"
	if [[ -x $out ]]; then
		echo "$name $version: $out (cached)"
		return
	fi
	if [[ -z $ext_cache ]]; then
		ext_cache=$(mktemp -d "${TMPDIR:-/tmp}/druid-stretch-gocache.XXXXXX")
	fi
	echo "$name $version: building into $out (once per machine; this takes minutes)"
	local start=$SECONDS
	# Written aside and renamed, so that an interrupted build leaves no binary
	# that a later run would take for a finished one.
	GOCACHE=$ext_cache build "$out.tmp.$$" "$3" "$4" "${5:-}"
	mv "$out.tmp.$$" "$out"
	echo "$name $version: built in $((SECONDS - start))s"
}

link() { # target name: bin/name -> target, relative to bin/
	ln -sfn "$1" "$bin/$2"
}

once etcd "$etcd_version" "$tools/etcd" .
link "../etcd-$etcd_version" envtest/etcd

# The Kubernetes commands report the version they were built from (discovery,
# Helm's kubeVersion check).
kube_minor=${kube_version#v1.}; kube_minor=${kube_minor%%.*}
kube_stamp="-X k8s.io/component-base/version.gitVersion=$kube_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kube_minor"
for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
	once "$cmd" "$kube_version" "$tools/kubernetes" "k8s.io/kubernetes/cmd/$cmd" "$kube_stamp"
	link "../$cmd-$kube_version" "envtest/$cmd"
done

# Static like upstream's image build.
CGO_ENABLED=0 once etcd-druid "$druid_version" "$tools/etcd-druid" github.com/gardener/etcd-druid/cmd \
	"-X github.com/gardener/etcd-druid/internal/version.gitVersion=$druid_version"
link "etcd-druid-$druid_version" etcd-druid

CGO_ENABLED=0 once etcdbrctl "$br_version" "$tools/etcd-backup-restore" github.com/gardener/etcd-backup-restore \
	"-X github.com/gardener/etcd-backup-restore/pkg/version.Version=$br_version"
link "etcdbrctl-$br_version" etcdbrctl

# Straight to bin/: go build leaves an up-to-date binary alone and otherwise
# replaces it with a new file, so a running copy is not disturbed.
project() { # name module folder [ldflags]
	if [[ ! -d $root/$2/$3 ]]; then
		echo "$1: skipped, $2/$3 does not exist"
		return
	fi
	CGO_ENABLED=0 build "$bin/$1" "$root/$2" "./$3" "${4:-}"
	echo "$1: $bin/$1"
}
project etcd-wrapper test cmd/etcd-wrapper
project pod-sandbox test cmd/pod-sandbox
# Stamped like make build, so the sidecars and controllers of the test
# sites say which commit they run.
version_pkg=github.com/druid-stretch/druid-stretch/internal/version
commit=$(git -C "$root" rev-parse -q --verify HEAD 2>/dev/null || echo unknown)
project druid-stretch-static . . "-X $version_pkg.commit=$commit"

echo "KUBEBUILDER_ASSETS=$bin/envtest"
