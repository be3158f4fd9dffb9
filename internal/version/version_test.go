package version

import (
	"runtime/debug"
	"testing"

	. "github.com/onsi/gomega"
)

func TestBuildInfoFillsWhatTheStampsLeaveEmpty(t *testing.T) {
	bi := &debug.BuildInfo{
		Main: debug.Module{Path: "github.com/druid-stretch/druid-stretch", Version: "v0.3.0"},
		Deps: []*debug.Module{{Path: "go.etcd.io/etcd/client/v3", Version: "v3.6.16"}},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	tests := []struct {
		name                string
		stamped             Info
		wantVersion, wantCo string
	}{
		{"nothing stamped", Info{}, "v0.3.0", "abc123-dirty"},
		{"stamped wins", Info{Version: "v0.4.0", Commit: "def456"}, "v0.4.0", "def456"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			info := tc.stamped
			fromBuildInfo(&info, bi)
			g.Expect(info.Version).To(Equal(tc.wantVersion))
			g.Expect(info.Commit).To(Equal(tc.wantCo))
			g.Expect(info.EtcdClientVersion).To(Equal("v3.6.16"))
		})
	}
}

func TestADevelBuildIsDev(t *testing.T) {
	g := NewWithT(t)
	info := Info{}
	fromBuildInfo(&info, &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}})
	g.Expect(info.Version).To(BeEmpty(), "Get turns it into dev")
}
