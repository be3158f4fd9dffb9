package sidecar_test

import (
	"context"
	"crypto/sha1" //nolint:gosec // etcd's own member ID hash, reproduced to pick a peer URL
	"encoding/binary"
	"fmt"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// etcdMemberID is the ID etcd gives a member added with one peer URL in
// the second unix (etcd's computeMemberID for a MemberAdd call, which
// names no cluster).
func etcdMemberID(peerURL string, unix int64) uint64 {
	sum := sha1.Sum([]byte(peerURL + fmt.Sprintf("%d", unix))) //nolint:gosec // etcd's hash
	return binary.BigEndian.Uint64(sum[:8])
}

// A joining etcd asks the members in ID order whether a downgrade is
// enabled, and a learner still catching up answers only once it has: a
// learner whose ID is below every voter's holds the start of every learner
// that joins after it. The sidecar adds such a learner again in a later
// second, for another ID, before anyone admits it.
func TestLearnerIsAddedAgainForAnIDAboveAVoters(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ctx := context.Background()
	tc := startCluster(t, 1, clusterOptions{})
	via := tc.Members[0]
	c := tc.client(via)
	voters := tc.MemberList(g, via)
	g.Expect(voters).To(HaveLen(1))
	lowest := voters[0].ID

	// A peer URL whose ID is below the voter's when added in this second
	// or the next, and above it in the two after: the add lands low, and
	// the sidecar's next try does not.
	now := time.Now().Unix()
	var peer string
	for i := 0; i < 1<<24 && peer == ""; i++ {
		u := fmt.Sprintf("https://learner-%d.example:2380", i)
		if etcdMemberID(u, now) < lowest && etcdMemberID(u, now+1) < lowest && etcdMemberID(u, now+2) > lowest && etcdMemberID(u, now+3) > lowest {
			peer = u
		}
	}
	g.Expect(peer).NotTo(BeEmpty(), "no peer URL found whose ID falls below the voter's %x", lowest)

	var added *sidecar.ChangeResult
	retryWhile(g, sidecar.ReasonUnhealthyCluster, 30*time.Second, func() (err error) {
		added, err = c.AddLearner(ctx, "learner-low", []string{peer}, sidecar.CallOptions{})
		return err
	})
	g.Expect(time.Now().Unix()).To(BeNumerically("<=", now+3), "the add took so long that the seconds chosen above passed")
	id, err := strconv.ParseUint(added.Member.ID, 16, 64)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(id).To(BeNumerically(">", lowest), "the learner's ID, against the voter's")
	var learners []string
	for _, m := range tc.MemberList(g, via) {
		if m.IsLearner {
			learners = append(learners, fmt.Sprintf("%x %v", m.ID, m.PeerURLs))
			g.Expect(m.ID).To(BeNumerically(">", lowest))
		}
	}
	g.Expect(learners).To(Equal([]string{fmt.Sprintf("%x [%s]", id, peer)}), "one learner, the one the call answered with")
}
