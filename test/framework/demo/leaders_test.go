package demo

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
)

// A leadership transfer as etcd v3.6 logged it in an e2e run: the old
// leader 87ca… steps down at .357001, the transferee 4fbd… leads from
// .448359. Other lines around it must be ignored.
const transferLog = `{"level":"info","ts":"2026-11-22T05:27:06.146356Z","logger":"raft","caller":"v3@v3.6.0/raft.go:970","msg":"87ca472cef21539f became leader at term 2"}
{"level":"info","ts":"2026-11-22T05:27:59.997221Z","logger":"raft","caller":"v3@v3.6.0/raft.go:1652","msg":"87ca472cef21539f [term 2] starts to transfer leadership to 4fbd13c75de3725e"}
{"level":"info","ts":"2026-11-22T05:28:00.357001Z","logger":"raft","caller":"v3@v3.6.0/raft.go:1053","msg":"87ca472cef21539f became follower at term 3"}
{"level":"info","ts":"2026-11-22T05:28:00.357100Z","logger":"raft","caller":"v3@v3.6.0/node.go:376","msg":"raft.node: 87ca472cef21539f lost leader 87ca472cef21539f at term 3"}
not json, became leader at term 9
{"level":"info","ts":"2026-11-22T05:28:00.448359Z","logger":"raft","caller":"v3@v3.6.0/raft.go:970","msg":"4fbd13c75de3725e became leader at term 3"}
{"level":"info","ts":"2026-11-22T05:28:01.000000Z","logger":"raft","caller":"v3@v3.6.0/raft.go:970","msg":"aaaaaaaaaaaaaaaa became leader at term 7"}
`

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, "2026-11-22T"+s+"Z")
	if err != nil {
		panic(err)
	}
	return t
}

func TestLeaderEventsFromEtcdLogs(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "etcd.log")
	g.Expect(os.WriteFile(path, []byte(transferLog), 0o600)).To(Succeed())
	members := []*localetcd.Member{{Name: "m", LogPath: path}, {Name: "never-started", LogPath: filepath.Join(dir, "missing.log")}}

	ids := idSet{}
	ids.add("87CA472CEF21539F")
	ids.add("4fbd13c75de3725e")
	evs, err := readLeaderEvents(members, ids)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(evs).To(Equal([]leaderEvent{
		{At: at("05:27:06.146356"), ID: "87ca472cef21539f", Leader: true},
		{At: at("05:28:00.357001"), ID: "87ca472cef21539f"},
		{At: at("05:28:00.448359"), ID: "4fbd13c75de3725e", Leader: true},
	}), "the leader of another cluster (aaaa…) and lines that are not role changes are left out")

	g.Expect(leaderless(evs, at("05:27:10"), at("05:28:10"))).To(Equal(91358*time.Microsecond), "the transfer's gap")
	g.Expect(leaderless(evs, at("05:28:00.400"), at("05:28:10"))).To(Equal(48359*time.Microsecond), "clipped at the start of the window")
	g.Expect(leaderless(evs, at("05:27:00"), at("05:27:10"))).To(Equal(6146356*time.Microsecond), "before the first leader")
}

func TestLeaderless(t *testing.T) {
	from, to := at("10:00:00"), at("10:01:00")
	tests := []struct {
		name   string
		events []leaderEvent
		want   time.Duration
	}{
		{"no event: never a leader", nil, time.Minute},
		{"a leader throughout", []leaderEvent{{At: at("09:00:00"), ID: "a", Leader: true}}, 0},
		{"a follower stepping down changes nothing", []leaderEvent{
			{At: at("09:00:00"), ID: "a", Leader: true},
			{At: at("10:00:10"), ID: "b"},
		}, 0},
		{"a leader that steps down and is never replaced", []leaderEvent{
			{At: at("09:00:00"), ID: "a", Leader: true},
			{At: at("10:00:50"), ID: "a"},
		}, 10 * time.Second},
		{"two elections", []leaderEvent{
			{At: at("09:00:00"), ID: "a", Leader: true},
			{At: at("10:00:10"), ID: "a"},
			{At: at("10:00:12"), ID: "b", Leader: true},
			{At: at("10:00:30"), ID: "b"},
			{At: at("10:00:30.5"), ID: "a", Leader: true},
		}, 2500 * time.Millisecond},
		{"a killed leader (no line) is replaced by the next election", []leaderEvent{
			{At: at("09:00:00"), ID: "a", Leader: true},
			{At: at("10:00:20"), ID: "b", Leader: true},
			{At: at("10:00:40"), ID: "b"},
			{At: at("10:00:41"), ID: "c", Leader: true},
		}, time.Second},
		{"a stretch that ends after the window", []leaderEvent{
			{At: at("09:00:00"), ID: "a", Leader: true},
			{At: at("10:00:59"), ID: "a"},
			{At: at("10:01:05"), ID: "b", Leader: true},
		}, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(leaderless(tt.events, from, to)).To(Equal(tt.want))
		})
	}
}
