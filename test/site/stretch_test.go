package site

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// stretchedNamespace is the namespace of the second Etcd of
// stretchedEtcd: the same shoot's TLS as the first one's.
const stretchedNamespace = "shoot--stretch-b"

// stretchedEtcd: a second Etcd, in another namespace, with its own member
// name prefix, lists a's members as external members and joins their etcd
// cluster, on real druid and real backup-restore. It checks what an
// operator would:
//   - the new pods start only once druid-stretch admitted them (etcd-wrapper
//     asks the sidecar), as learners druid-stretch's planner added;
//   - every membership change etcd went through is one step the planner
//     took (the member list polled throughout), and backup-restore never
//     added or promoted a member itself (its logs);
//   - a druid reconcile forced on both Etcds in the middle of the join
//     restarts no pod and changes nothing of its course;
//   - druid reports the new Etcd Ready, its members hold a's data, and both
//     controllers report five voters.
func stretchedEtcd(t *testing.T, s *Site, a *v1alpha1.Etcd) {
	g := NewWithT(t)
	ctx := testContext(t, siteTestDeadline)
	const prefix = "b"
	ns := joinNamespace(t, s, stretchedNamespace, a.Namespace)

	// a's data, written before anything else happens.
	want := map[string]string{}
	aCli := etcdClient(t, s, a)
	for i := range 5 {
		k, v := fmt.Sprintf("/site/stretch-%d", i), fmt.Sprintf("value-%d", i)
		_, err := aCli.Put(ctx, k, v)
		g.Expect(err).NotTo(HaveOccurred())
		want[k] = v
	}

	// Record every membership etcd goes through from here on.
	history := recordMembership(t, aCli)

	// a lists b's members as external (policy Keep), so a's controller
	// knows them and leaves them alone; then b is created listing a's.
	b := &v1alpha1.Etcd{}
	b.Namespace, b.Name = ns, "etcd-main"
	b.Spec.MemberNamePrefix = ptr.To(prefix)
	b.Spec.Replicas = 2
	patchEtcd(t, s, a, func(e *v1alpha1.Etcd) {
		e.Spec.ExternalMembers = externalMembersOf(b, 0, 2)
		e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyKeep)
	})
	b = applyStretchedEtcd(t, s, ns, v1alpha1.MembershipSpec{
		ExternalMembers:       externalMembersOf(a, 0, 3),
		ExternalMembersPolicy: ptr.To(v1alpha1.ExternalMembersPolicyKeep),
	}, func(o *unstructured.Unstructured) {
		g.Expect(unstructured.SetNestedField(o.Object, prefix, "spec", "memberNamePrefix")).To(Succeed())
		g.Expect(unstructured.SetNestedField(o.Object, int64(2), "spec", "replicas")).To(Succeed())
		g.Expect(unstructured.SetNestedField(o.Object, "etcd-stretch-b", "spec", "backup", "store", "prefix")).To(Succeed())
	})

	// In the middle of the join (the first learner added), druid is made
	// to reconcile both Etcds, as an operator's annotation does.
	g.Eventually(func() int { return len(history.Snapshot()) }).WithTimeout(3*time.Minute).WithPolling(time.Second).
		Should(BeNumerically(">=", 2), "b's first member is added as a learner")
	podsBefore := podUIDs(t, s, a, b)
	for _, e := range []*v1alpha1.Etcd{a, b} {
		patchEtcd(t, s, e, func(e *v1alpha1.Etcd) {
			if e.Annotations == nil {
				e.Annotations = map[string]string{}
			}
			e.Annotations[druidv1alpha1.GardenerOperationAnnotation] = druidv1alpha1.DruidOperationReconcile
		})
	}

	waitEtcdReady(t, s, b, 2)
	for _, e := range []*v1alpha1.Etcd{a, b} {
		g.Eventually(func(g Gomega) {
			var got v1alpha1.Etcd
			g.Expect(s.Client.Get(ctx, client.ObjectKeyFromObject(e), &got)).To(Succeed())
			g.Expect(got.Annotations).NotTo(HaveKey(druidv1alpha1.GardenerOperationAnnotation), "druid ran the reconcile it was asked for")
			m := membershipStatus(ctx, g, s, e)
			g.Expect(apimeta.IsStatusConditionTrue(m.Conditions, v1alpha1.ConditionMembershipConverged)).To(BeTrue(), "%s: %+v", e.Namespace, m.Conditions)
			g.Expect(m.Voters()).To(HaveLen(5))
		}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	}

	// The forced reconciles restarted nothing: the pods that ran then
	// still run, unrestarted.
	for key, uid := range podsBefore {
		var p corev1.Pod
		g.Expect(s.Client.Get(ctx, key, &p)).To(Succeed())
		g.Expect(p.UID).To(Equal(uid), "pod %s was not replaced", key)
		for _, c := range p.Status.ContainerStatuses {
			g.Expect(c.RestartCount).To(BeZero(), "container %s of pod %s did not restart", c.Name, key)
		}
	}

	// b's pods: druid's containers, the sidecar, and the init container
	// that keeps backup-restore out of membership.
	for _, p := range etcdPods(t, s, b) {
		g.Expect(containerNames(p)).To(ConsistOf("etcd", "backup-restore", webhook.SidecarContainerName), "pod %s", p.Name)
		g.Expect(p.Spec.InitContainers).To(ContainElement(HaveField("Name", webhook.BackupRestoreConfigInitContainerName)), "pod %s", p.Name)
		g.Expect(readAll(t, s, b, p.Name)).To(Equal(want), "member of pod %s holds a's data", p.Name)
	}

	// Every change of the member list was one planned step: a learner
	// added (with no name yet) for each of b's members, and each promoted
	// once, and nothing else. A learner is added once its pod waits for
	// it and promoted once ready (the planner's rules 2 and 3), so neither
	// order follows the ordinals: whichever pod starts first goes first.
	// Where the adds fall between the promotions depends on the learner
	// slots (the controller's --max-learners): with several both join
	// before the first promotion, with one each joins after the promotion
	// before it. One 100 ms poll may see two changes; the order a's first
	// member applied them in, from its etcd log, settles which came first.
	steps := history.TransitionsInApplyOrder(appliedConfChanges(t, s, a.Namespace, "etcd-main-0"))
	const add = "add learner (unnamed)"
	g.Expect(steps).NotTo(BeEmpty())
	g.Expect(steps[0]).To(Equal(add), "membership history: %v", history.Snapshot())
	g.Expect(slices.DeleteFunc(slices.Clone(steps), func(s string) bool { return s != add })).To(HaveLen(2), "membership history: %v", history.Snapshot())
	g.Expect(slices.DeleteFunc(slices.Clone(steps), func(s string) bool { return s == add })).To(ConsistOf(
		"promote "+prefix+"-etcd-main-0", "promote "+prefix+"-etcd-main-1",
	), "membership history: %v", history.Snapshot())

	// backup-restore of b's pods took no membership action: it sized the
	// cluster at one member, so neither its scale-up path nor its
	// promotion ran.
	// It reaches its leader election only after its own checks of etcd,
	// which back off while the learner starts, so its log is read until
	// it gets there.
	for _, p := range etcdPods(t, s, b) {
		var log string
		g.Eventually(func() string {
			log = containerLogs(t, s, p, "backup-restore")
			return log
		}).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(ContainSubstring("Starting leaderElection"), "backup-restore of %s ran its leader election, where it would promote", p.Name)
		for _, action := range []string{
			"Checking whether etcd cluster is marked for scale-up", // its scale-up path
			"to cluster as a learner",                              // its learner add
			"Attempting to promote member",                         // its promotion
			"Removing the",                                         // its remove-and-re-add
			"Updating member peer URL",                             // its peer URL rewrite
		} {
			g.Expect(log).NotTo(ContainSubstring(action), "backup-restore of %s acted on membership", p.Name)
		}
	}
	g.Expect(eventReasons(t, s, b)).To(ContainElement("MemberAdmitted"))
}

// externalMembersOf are e's members at ordinals [from, to) as the other
// Etcd lists them: in-cluster URLs, which resolve in the whole site.
func externalMembersOf(e *v1alpha1.Etcd, from, to int) []v1alpha1.ExternalMember {
	var out []v1alpha1.ExternalMember
	for i := from; i < to; i++ {
		pod := fmt.Sprintf("%s-%d", e.Name, i)
		out = append(out, v1alpha1.ExternalMember{
			Name:       druidv1alpha1.GetMemberName(e.Spec.MemberNamePrefix, pod),
			PeerURLs:   []string{"https://" + podAddr(e, pod, 2380)},
			ClientURLs: []string{"https://" + podAddr(e, pod, 2379)},
			SidecarURL: "https://" + podAddr(e, pod, int(webhook.DefaultSidecarPort)),
		})
	}
	return out
}

// patchEtcd changes e as the migration adapter does: mutate edits the
// view of the Etcd and its EtcdMembership, and each part is written back
// where it lives, read again on a conflict.
func patchEtcd(t *testing.T, s *Site, e *v1alpha1.Etcd, mutate func(*v1alpha1.Etcd)) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		p, err := etcdview.Get(ctx, s.Client, client.ObjectKeyFromObject(e))
		if err != nil {
			return err
		}
		want := p.View.DeepCopy()
		mutate(want)
		return etcdview.Apply(ctx, s.Client, p, want)
	})
	if err != nil {
		t.Fatalf("patching Etcd %s/%s: %v", e.Namespace, e.Name, err)
	}
}

// podUIDs are the UIDs of the Etcds' pods that run now.
func podUIDs(t *testing.T, s *Site, es ...*v1alpha1.Etcd) map[client.ObjectKey]types.UID {
	out := map[client.ObjectKey]types.UID{}
	for _, e := range es {
		for _, p := range etcdPods(t, s, e) {
			out[client.ObjectKeyFromObject(&p)] = p.UID
		}
	}
	return out
}

// eventReasons are the reasons of the Events about e.
func eventReasons(t *testing.T, s *Site, e *v1alpha1.Etcd) []string {
	t.Helper()
	out, err := reasonsSince(context.Background(), s, e, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// recordMembership records cli's member list until the test ends.
func recordMembership(t *testing.T, cli *clientv3.Client) *MembershipHistory {
	h := RecordMembership(cli)
	t.Cleanup(h.Stop)
	return h
}
