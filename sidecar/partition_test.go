package sidecar_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestPartitionedMemberAndQuorum cuts one member's site off from the others
// (a blackhole): the sidecar reports it unhealthy and refuses to remove
// another voter, since the two voters left would have one healthy member,
// less than their quorum. After the heal the member recovers and the same
// removal goes through.
func TestPartitionedMemberAndQuorum(t *testing.T) {
	testbin.Need(t)
	sites := []string{"site-0", "site-1", "site-2"}
	tc := startCluster(t, 3, clusterOptions{sites: sites})
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cut := tc.Members[2]

	tc.WAN.Partition(sites[2], sites[0])
	tc.WAN.Partition(sites[2], sites[1])
	partitioned := time.Now()

	// The leader is one of the two connected members once the cut member
	// stops hearing from (or being) the leader.
	var list *sidecar.MemberList
	g.Eventually(func(g Gomega) {
		var err error
		list, err = tc.client(tc.Members[0]).Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		m := memberByName(list, cut.Name)
		g.Expect(m.Healthy).To(BeFalse())
		g.Expect(m.Error).NotTo(BeEmpty())
		g.Expect(leaderName(list)).To(BeElementOf(tc.Members[0].Name, tc.Members[1].Name))
		for _, o := range tc.Members[:2] {
			g.Expect(memberByName(list, o.Name).Healthy).To(BeTrue())
		}
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
	t.Logf("cut member unhealthy after %s: %q", time.Since(partitioned), memberByName(list, cut.Name).Error)

	// Remove the connected follower through the leader's sidecar.
	leader, target := tc.Members[0], tc.Members[1]
	if leaderName(list) == target.Name {
		leader, target = target, leader
	}
	c := tc.client(leader)
	before := tc.membership(g, leader)
	_, err := c.Remove(ctx, target.Name, sidecar.CallOptions{Fingerprint: list.Fingerprint})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonQuorumAtRisk)).To(BeTrue(), "%v", err)
	var se *sidecar.Error
	g.Expect(err).To(BeAssignableToTypeOf(se))
	g.Expect(err.(*sidecar.Error).StatusCode).To(Equal(412))
	t.Logf("refused: %v", err)
	g.Expect(tc.membership(g, leader)).To(Equal(before))

	tc.WAN.Heal(sites[2], sites[0])
	tc.WAN.Heal(sites[2], sites[1])
	healed := time.Now()
	g.Eventually(func(g Gomega) {
		l, err := c.Members(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		for _, m := range l.Members {
			g.Expect(m.Healthy).To(BeTrue(), "%s: %s", m.Name, m.Error)
		}
	}).WithTimeout(30 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
	t.Logf("cut member healthy again %s after the heal", time.Since(healed))

	// etcd itself refuses the removal until the healed member has been
	// connected for 5 s (its strict reconfiguration check).
	refused := retryWhile(g, sidecar.ReasonUnhealthyCluster, 30*time.Second, func() error {
		_, err := c.Remove(ctx, target.Name, sidecar.CallOptions{})
		return err
	})
	t.Logf("removed %s %s after the heal, after %d UnhealthyCluster refusals", target.Name, time.Since(healed), refused)
	after := tc.membership(g, leader)
	g.Expect(after).To(HaveLen(2))
	g.Expect(after).NotTo(ContainElement(ContainSubstring("name=" + target.Name + " ")))
}
