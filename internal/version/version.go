// Package version says which build of druid-stretch runs: its version and
// commit (stamped at link time by make and hack/test-binaries.sh, else read
// from the Go build information), the Go toolchain and the etcd client it
// was built with.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	etcdversion "go.etcd.io/etcd/api/v3/version"
)

// Stamped at link time:
//
//	-ldflags "-X github.com/druid-stretch/druid-stretch/internal/version.version=v0.3.0
//	          -X github.com/druid-stretch/druid-stretch/internal/version.commit=<sha>"
//
// Unset, they fall back to what the Go build information knows (the module
// version of `go install ...@vX`, the VCS revision of a build in a checkout).
var (
	version string
	commit  string
)

// Info is the build of this binary, as `druid-stretch version -o json`
// prints it.
type Info struct {
	// Version is the release (a git tag such as v0.3.0), or "dev".
	Version string `json:"version"`
	// Commit is the git commit the binary was built from, with "-dirty" when
	// the work tree had changes; "unknown" when nothing recorded it.
	Commit string `json:"commit"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"goVersion"`
	// EtcdClientVersion is the version of the etcd v3 client module, the
	// one the controller and the sidecar speak to etcd with.
	EtcdClientVersion string `json:"etcdClientVersion"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
}

// Get returns the running binary's build.
func Get() Info {
	info := Info{
		Version:           version,
		Commit:            commit,
		GoVersion:         runtime.Version(),
		EtcdClientVersion: "v" + etcdversion.Version,
		Platform:          runtime.GOOS + "/" + runtime.GOARCH,
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		fromBuildInfo(&info, bi)
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// fromBuildInfo fills what the link-time stamps left empty.
func fromBuildInfo(info *Info, bi *debug.BuildInfo) {
	if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		info.Version = bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == "go.etcd.io/etcd/client/v3" {
			info.EtcdClientVersion = d.Version
		}
	}
	if info.Commit != "" {
		return
	}
	var revision, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if revision != "" && modified == "true" {
		revision += "-dirty"
	}
	info.Commit = revision
}

// String is the one-line form that --version and the controller's start
// log show.
func (i Info) String() string {
	return fmt.Sprintf("druid-stretch %s (commit %s, %s, %s, etcd client %s)",
		i.Version, i.Commit, i.GoVersion, i.Platform, i.EtcdClientVersion)
}
