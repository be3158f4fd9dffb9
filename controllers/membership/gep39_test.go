package membership_test

import (
	"context"
	"strings"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	membershipctrl "github.com/druid-stretch/druid-stretch/controllers/membership"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
)

// sourceSidecars resolves the local members through the pod runner and the
// source's members, which GEP-39 names by peer URL only, through the
// sidecars the test started beside them.
type sourceSidecars struct {
	membershipctrl.Resolver
	urls map[string]string
}

func (s sourceSidecars) SourceSidecarURL(_ *v1alpha1.Etcd, m v1alpha1.ExternalMember) (string, error) {
	if u, ok := s.urls[m.Name]; ok {
		return u, nil
	}
	// As DNSResolver derives one for any member: a sidecar nobody runs.
	return "https://127.0.0.1:1", nil
}

// joining makes the Etcd the destination of a GEP-39 move, as gardenlet
// writes it: druid's own fields only (no ordinalStart, no EtcdMembership),
// spec.etcd.bootstrapWithExistingCluster naming the source's members.
func joining(source []*localetcd.Member, extra ...druidv1alpha1.BootstrapExistingMember) func(*v1alpha1.Etcd) {
	return func(x *v1alpha1.Etcd) {
		x.Spec.OrdinalStart = nil
		x.Spec.Etcd.ClientUrlTLS = &druidv1alpha1.TLSConfig{
			TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca-etcd"}},
			ServerTLSSecretRef: corev1.SecretReference{Name: "etcd-server"},
		}
		b := &druidv1alpha1.BootstrapWithExistingCluster{ClientEndpoints: []string{source[0].ClientURL}}
		for _, m := range source {
			b.Members = append(b.Members, druidv1alpha1.BootstrapExistingMember{Name: m.Name, PeerURLs: []string{m.PeerURL}})
		}
		b.Members = append(b.Members, extra...)
		x.Spec.Etcd.BootstrapWithExistingCluster = b
	}
}

// TestGEP39FieldsCarryTheMove drives a destination Etcd by druid's own
// fields alone, as gardenlet's GEP-39 steps write them, against a running
// 3-member source cluster:
//   - bootstrapWithExistingCluster naming a member the cluster does not
//     have: refused by a condition naming the field, nothing added;
//   - corrected, replicas 3: the destination joins with two voters and one
//     learner, so the source's three voters keep the quorum alone (no tie
//     while the source is kept);
//   - druid records the join and gardenlet unsets the field: the source's
//     members are retired through one tie, the leader moved once.
func TestGEP39FieldsCarryTheMove(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	source := startExternals(ctx, g, e)
	urls := map[string]string{}
	for _, m := range source {
		urls[m.Name] = m.SidecarURL
	}
	ghost := druidv1alpha1.BootstrapExistingMember{Name: "ghost-0", PeerURLs: []string{"https://127.0.0.1:1"}}
	etcd := e.newEtcd("dst", 3, joining(source, ghost))
	g.Expect(pair(g, etcd).Membership).To(BeNil(), "gardenlet writes no druid-stretch object")
	ties, tieSum := histogram(g, "druid_stretch_membership_tie_duration_seconds")
	e.startController(func(o *membershipctrl.ManagerOptions) { o.Resolver = sourceSidecars{Resolver: e.runner, urls: urls} })

	g.Eventually(func(g Gomega) {
		c := condition(g, etcd, v1alpha1.ConditionMembershipProgressing)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal("InvalidSpec"))
		g.Expect(c.Message).To(ContainSubstring("spec.etcd.bootstrapWithExistingCluster.members[3] (ghost-0"))
	}).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	p := pair(g, etcd)
	g.Expect(p.Membership).NotTo(BeNil(), "the status lives in an EtcdMembership the controller created")
	g.Expect(p.Membership.Spec.ExternalMembers).To(BeEmpty(), "nothing derived is written into it")
	g.Expect(p.Membership.OwnerReferences).To(ConsistOf(HaveField("UID", p.Etcd.UID)))
	g.Expect(changes(e.calls.snapshot())).To(BeEmpty(), "no member added to a cluster other than the one named")
	cli, err := source[0].Client()
	g.Expect(err).NotTo(HaveOccurred())
	list, err := cli.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(list.Members).To(HaveLen(3), "the source's member list is as it was")

	g.Expect(client.IgnoreNotFound(patchEtcd(ctx, etcd, func(x *v1alpha1.Etcd) { joining(source)(x) }))).To(Succeed())
	joined := append(names("ext", 0, 1, 2), names("dst", 0, 1)...)
	st := converged(g, etcd, current, 3*time.Minute, joined...)
	g.Expect(st.Members).To(ContainElement(SatisfyAll(HaveField("Name", "dst-etcd-main-2"), HaveField("Role", v1alpha1.MemberRoleLearner))),
		"the third destination member stays a learner while the source is kept")
	g.Expect(count(e.calls.snapshot())).To(Equal(map[string]int{"AddLearner": 3, "Promote": 2}))
	n, _ := histogram(g, "druid_stretch_membership_tie_duration_seconds")
	g.Expect(n).To(Equal(ties), "no tie while the source is kept: its three voters hold the quorum of five")

	// druid records the join; gardenlet unsets the field (EtcdMigrationComplete).
	g.Expect(patchStatus(ctx, etcd, func(x *v1alpha1.Etcd) {
		x.Status.BootstrapWithExistingCluster = &druidv1alpha1.BootstrapWithExistingClusterStatus{JoinedAt: metav1.Now()}
		for _, m := range source {
			x.Status.BootstrapWithExistingCluster.Members = append(x.Status.BootstrapWithExistingCluster.Members,
				druidv1alpha1.BootstrapJoinedMember{Name: m.Name, PeerURLs: []string{m.PeerURL}})
		}
	})).To(Succeed())
	g.Expect(patchEtcd(ctx, etcd, func(x *v1alpha1.Etcd) { x.Spec.Etcd.BootstrapWithExistingCluster = nil })).To(Succeed())
	st = converged(g, etcd, current, 3*time.Minute, names("dst", 0, 1, 2)...)
	g.Expect(st.RetiredMembers).To(ConsistOf(names("ext", 0, 1, 2)))
	g.Expect(count(e.calls.snapshot())).To(Equal(map[string]int{"AddLearner": 3, "Promote": 3, "MoveLeader": 1, "Remove": 3}))
	n, sum := histogram(g, "druid_stretch_membership_tie_duration_seconds")
	g.Expect(n-ties).To(BeNumerically("==", 1), "one tie, at the retirement")
	g.Expect(sum - tieSum).To(BeNumerically("<", 10))
	var removedVia []string
	for _, c := range changes(e.calls.snapshot()) {
		if c.Kind == "Remove" && strings.Contains(c.Path, "thenRemove=") {
			removedVia = append(removedVia, c.Pod)
		}
	}
	g.Expect(removedVia).To(HaveLen(1), "the learner's promotion made the tie and the first removal ended it, in one call")
	t.Logf("GEP-39 fields: joined as 2 voters + 1 learner, retired the source through one tie of %.2fs", sum-tieSum)
}

// patchEtcd writes a change of druid's fields of the Etcd, as gardenlet does.
func patchEtcd(ctx context.Context, etcd *v1alpha1.Etcd, mutate func(*v1alpha1.Etcd)) error {
	have := &v1alpha1.Etcd{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(etcd), have); err != nil {
		return err
	}
	want := have.DeepCopy()
	mutate(want)
	want.Spec.MembershipSpec = have.Spec.MembershipSpec
	return k8s.Patch(ctx, want, client.MergeFrom(have))
}

// patchStatus writes a change of druid's status of the Etcd, as druid does.
func patchStatus(ctx context.Context, etcd *v1alpha1.Etcd, mutate func(*v1alpha1.Etcd)) error {
	have := &v1alpha1.Etcd{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(etcd), have); err != nil {
		return err
	}
	want := have.DeepCopy()
	mutate(want)
	return k8s.Status().Patch(ctx, want, client.MergeFrom(have))
}
