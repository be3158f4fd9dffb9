package site

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/testing/extendedcrd"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/test/chart"
)

// TestPlainEtcdOnRealSites: a plain druid Etcd comes up, backs up, heals a
// deleted pod and restores, the same with and without druid-stretch
// installed; with druid-stretch, an Etcd that opts in gets the sidecar in
// every pod and its membership reported through it.
func TestPlainEtcdOnRealSites(t *testing.T) {
	testbin.Need(t)
	if os.Geteuid() != 0 {
		t.Fatal("a real site needs root: its pods get network namespaces and chroots")
	}
	for _, tc := range []struct {
		name    string
		stretch bool
	}{
		{"without druid-stretch", false},
		{"with druid-stretch", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The two sites share nothing (ports are free ones, each pod
			// network is namespaces of its own), and most of their time is
			// backup-restore waiting on its timeouts.
			t.Parallel()
			s := startSite(t, tc.stretch)
			t.Run("a plain Etcd is druid's alone", func(t *testing.T) { plainEtcdLifecycle(t, s) })
			if tc.stretch {
				var a *v1alpha1.Etcd
				t.Run("an Etcd that opts in gets the sidecar", func(t *testing.T) { a = optedInEtcd(t, s) })
				if a == nil {
					return
				}
				t.Run("a second Etcd stretches its cluster", func(t *testing.T) { stretchedEtcd(t, s, a) })
			}
		})
	}
}

// startSite starts a site for the test, logging to a file that is named
// when the test fails, and stops it when the test ends.
func startSite(t *testing.T, stretch bool) *Site {
	t.Helper()
	dir, err := os.MkdirTemp("", "druid-stretch-site-")
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "site.log"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := Start(ctx, Options{Dir: dir, DruidStretch: stretch, Logger: ctrlzap.New(ctrlzap.WriteTo(logFile))})
	if err != nil {
		t.Fatalf("starting the site (logs in %s): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stopping the site: %v", err)
		}
		_ = logFile.Close()
		leaveSiteFolder(t, "the site", dir)
	})
	return s
}

// plainEtcdLifecycle: testdata/etcd-main.yaml (three members, Local store)
// reaches Ready as druid reports it, with pods running exactly druid's two
// containers; written keys land in a full snapshot in the Local store; a
// deleted pod comes back as the same member with its data; a new Etcd
// restored from the store holds the keys.
func plainEtcdLifecycle(t *testing.T, s *Site) {
	g := NewWithT(t)
	ctx := testContext(t, siteTestDeadline)
	ns := createNamespace(t, s, "shoot--plain")
	e := applyEtcd(t, s, ns, nil)
	waitEtcdReady(t, s, e, 3)

	pods := etcdPods(t, s, e)
	g.Expect(pods).To(HaveLen(3))
	for _, p := range pods {
		g.Expect(containerNames(p)).To(ConsistOf("etcd", "backup-restore"),
			"pod %s: druid's containers only, no druid-stretch sidecar for an Etcd without an extension field", p.Name)
	}

	cli := etcdClient(t, s, e)
	members, err := cli.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(memberNames(members)).To(ConsistOf("etcd-main-0", "etcd-main-1", "etcd-main-2"))
	want := map[string]string{}
	var rev int64
	for i := range 10 {
		k, v := fmt.Sprintf("/site/key-%d", i), fmt.Sprintf("value-%d", i)
		resp, err := cli.Put(ctx, k, v)
		g.Expect(err).NotTo(HaveOccurred())
		want[k], rev = v, resp.Header.Revision
	}

	// backup-restore's leader takes a full snapshot on request (druid's
	// EtcdOpsTask asks the same endpoint); it lands in the Local store.
	triggerFullSnapshot(t, s, e)
	store := filepath.Join(s.HostPathRoot, "etc", "gardener", "local-backupbuckets", "backups", "etcd-main")
	g.Expect(fullSnapshots(t, store)).To(ContainElement(BeNumerically(">=", rev)),
		"a full snapshot in %s holds revision %d", store, rev)

	// A deleted pod comes back, from druid's StatefulSet, as the same
	// member with its data (its PVC outlives it). Its containers end within
	// seconds of SIGTERM, and the node deletes its object then, as
	// kubelet does, not when the grace period has passed: the StatefulSet
	// replaces it long before 120 s.
	victim := pods[1]
	before := memberID(members, victim.Name)
	g.Expect(s.Client.Delete(ctx, &victim, client.GracePeriodSeconds(120))).To(Succeed())
	g.Eventually(func(g Gomega) {
		var p corev1.Pod
		err := s.Client.Get(ctx, client.ObjectKeyFromObject(&victim), &p)
		if err == nil {
			g.Expect(p.UID).NotTo(Equal(victim.UID), "the deleted pod's object is gone")
		} else {
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
		}
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())
	g.Eventually(func(g Gomega) {
		var p corev1.Pod
		g.Expect(s.Client.Get(ctx, client.ObjectKeyFromObject(&victim), &p)).To(Succeed())
		g.Expect(p.UID).NotTo(Equal(victim.UID))
		g.Expect(podReady(&p)).To(BeTrue(), "pod %s ready", p.Name)
	}).WithTimeout(4 * time.Minute).WithPolling(time.Second).Should(Succeed())
	waitEtcdReady(t, s, e, 3)
	members, err = cli.MemberList(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(memberID(members, victim.Name)).To(Equal(before), "the pod came back as the same member")
	g.Expect(readAll(t, s, e, victim.Name)).To(Equal(want), "the pod's member holds the data from before its deletion")

	// Disaster recovery: the cluster is gone, a new Etcd on the same store
	// is restored by backup-restore from the snapshots.
	g.Expect(s.Client.Delete(ctx, e)).To(Succeed())
	g.Eventually(func() int { return len(etcdPods(t, s, e)) }).WithTimeout(2 * time.Minute).Should(BeZero())
	restored := applyEtcd(t, s, ns, func(o *unstructured.Unstructured) {
		o.SetName("etcd-restored")
		g.Expect(unstructured.SetNestedField(o.Object, int64(1), "spec", "replicas")).To(Succeed())
	})
	waitEtcdReady(t, s, restored, 1)
	g.Expect(readAll(t, s, restored, "etcd-restored-0")).To(Equal(want), "the restored Etcd holds every key written before the snapshot")
}

// optedInEtcd: an Etcd with the smallest extension (ordinalStart: 0, the
// druid default made explicit) runs on real druid with the sidecar the
// webhook injects; its pods start once druid-stretch admitted them (a new
// cluster: every pod waits with no data), druid reports it Ready and
// druid-stretch reports its membership, observed through the sidecars. It
// returns the Etcd once it is converged, nil when the test failed.
func optedInEtcd(t *testing.T, s *Site) *v1alpha1.Etcd {
	g := NewWithT(t)
	ctx := testContext(t, siteTestDeadline)
	ns := createNamespace(t, s, "shoot--stretch", stretchedNamespace)
	e := applyStretchedEtcd(t, s, ns, v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](0)}, func(o *unstructured.Unstructured) {
		g.Expect(unstructured.SetNestedField(o.Object, "etcd-stretch", "spec", "backup", "store", "prefix")).To(Succeed())
	})
	waitEtcdReady(t, s, e, 3)
	for _, p := range etcdPods(t, s, e) {
		g.Expect(containerNames(p)).To(ConsistOf("etcd", "backup-restore", webhook.SidecarContainerName), "pod %s", p.Name)
		g.Expect(podReady(&p)).To(BeTrue(), "pod %s", p.Name)
	}
	g.Eventually(func(g Gomega) {
		m := membershipStatus(ctx, g, s, e)
		g.Expect(apimeta.IsStatusConditionTrue(m.Conditions, v1alpha1.ConditionMembershipConverged)).To(BeTrue(), "conditions: %+v", m.Conditions)
		var names []string
		for _, om := range m.Members {
			if om.Votes() {
				names = append(names, om.Name)
			}
		}
		g.Expect(names).To(ConsistOf("etcd-main-0", "etcd-main-1", "etcd-main-2"))
	}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
	g.Expect(eventReasons(t, s, e)).To(ContainElement(v1alpha1.ReasonBootstrapping), "druid-stretch admitted the new cluster's pods")
	return e
}

// createNamespace creates namespace name with the Secrets of a new shoot's
// TLS, whose certificates also name the Etcds of the namespaces also
// (Etcds that join the same cluster, in namespaces joinNamespace creates).
func createNamespace(t *testing.T, s *Site, name string, also ...string) string {
	t.Helper()
	shoot, err := NewShootTLS(append([]string{name}, also...))
	if err != nil {
		t.Fatal(err)
	}
	return createNamespaceWith(t, s, name, shoot)
}

// joinNamespace creates namespace name with the Secrets of the shoot's TLS
// of namespace of, which createNamespace made naming name too.
func joinNamespace(t *testing.T, s *Site, name, of string) string {
	t.Helper()
	shoot := s.ShootTLSOf(of)
	if shoot == nil {
		t.Fatalf("no shoot's TLS in namespace %s", of)
	}
	return createNamespaceWith(t, s, name, shoot)
}

func createNamespaceWith(t *testing.T, s *Site, name string, shoot *ShootTLS) string {
	t.Helper()
	ctx := context.Background()
	if err := s.CreateNamespace(ctx, name, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.InstallShootTLS(ctx, shoot, name); err != nil {
		t.Fatal(err)
	}
	return name
}

// applyStretchedEtcd opts the Etcd of EtcdMainManifest in ns into
// druid-stretch with an EtcdMembership of spec, then creates the Etcd,
// edited by edit, with druid's own type.
func applyStretchedEtcd(t *testing.T, s *Site, ns string, spec v1alpha1.MembershipSpec, edit func(*unstructured.Unstructured)) *v1alpha1.Etcd {
	t.Helper()
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: MoveEtcdName}}
	if err := s.Client.Create(context.Background(), stretchv1alpha1.For(e, spec)); err != nil {
		t.Fatalf("creating the EtcdMembership %s/%s: %v", ns, e.Name, err)
	}
	return applyEtcd(t, s, ns, edit)
}

// installExtendedEtcdCRD puts the extended Etcd CRD of earlier releases in
// place of druid's, as installing such a release did.
func installExtendedEtcdCRD(t *testing.T, s *Site) {
	t.Helper()
	o := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(extendedcrd.Manifest(), &o.Object); err != nil {
		t.Fatal(err)
	}
	if err := chart.InstallCRDs(context.Background(), s.Client, []*unstructured.Unstructured{o}); err != nil {
		t.Fatal(err)
	}
}

// membershipStatus reads status.membership of e's EtcdMembership, where
// druid-stretch reports it, and fails g while there is none.
func membershipStatus(ctx context.Context, g Gomega, s *Site, e *v1alpha1.Etcd) *v1alpha1.MembershipStatus {
	p, err := etcdview.Get(ctx, s.Client, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Membership).NotTo(BeNil(), "the EtcdMembership")
	m := p.Membership.Status.Membership
	g.Expect(m).NotTo(BeNil(), "status.membership of the EtcdMembership")
	return m
}

// applyEtcd creates the Etcd of EtcdMainManifest in ns, edited by edit,
// and returns it.
func applyEtcd(t *testing.T, s *Site, ns string, edit func(*unstructured.Unstructured)) *v1alpha1.Etcd {
	t.Helper()
	key, err := s.CreateEtcd(context.Background(), ns, func(o *unstructured.Unstructured) error {
		if edit != nil {
			edit(o)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
}

// waitEtcdReady waits until druid reports the Etcd Ready with replicas
// ready members.
func waitEtcdReady(t *testing.T, s *Site, e *v1alpha1.Etcd, replicas int32) {
	t.Helper()
	if err := s.WaitEtcdReady(context.Background(), client.ObjectKeyFromObject(e), replicas, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// etcdPods are the Etcd's pods, by name.
func etcdPods(t *testing.T, s *Site, e *v1alpha1.Etcd) []corev1.Pod {
	t.Helper()
	pods, err := s.EtcdPods(context.Background(), client.ObjectKeyFromObject(e))
	if err != nil {
		t.Fatal(err)
	}
	return pods
}

func containerNames(p corev1.Pod) []string {
	var names []string
	for _, c := range p.Spec.Containers {
		names = append(names, c.Name)
	}
	return names
}

func podReady(p *corev1.Pod) bool { return PodReady(p) }

// podAddr is a pod's DNS name and port in the site, as druid names it
// (<pod>.<etcd>-peer.<namespace>.svc).
func podAddr(e *v1alpha1.Etcd, pod string, port int) string {
	return net.JoinHostPort(fmt.Sprintf("%s.%s.%s.svc", pod, druidv1alpha1.GetPeerServiceName(e.ObjectMeta), e.Namespace), strconv.Itoa(port))
}

// etcdClientOf is an etcd client of the given pods' members, dialing
// through the pod network.
func etcdClientOf(t *testing.T, s *Site, e *v1alpha1.Etcd, pods ...string) *clientv3.Client {
	t.Helper()
	var eps []string
	for _, p := range pods {
		eps = append(eps, "https://"+podAddr(e, p, 2379))
	}
	return etcdClientVia(t, s, eps...)
}

func etcdClient(t *testing.T, s *Site, e *v1alpha1.Etcd) *clientv3.Client {
	var pods []string
	for _, p := range etcdPods(t, s, e) {
		pods = append(pods, p.Name)
	}
	return etcdClientOf(t, s, e, pods...)
}

// readAll reads every /site/ key from pod's member alone, serializable:
// what that member holds, not what a quorum says.
func readAll(t *testing.T, s *Site, e *v1alpha1.Etcd, pod string) map[string]string {
	t.Helper()
	resp, err := etcdClientOf(t, s, e, pod).Get(context.Background(), "/site/", clientv3.WithPrefix(), clientv3.WithSerializable())
	if err != nil {
		t.Fatalf("reading from %s: %v", pod, err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}

func memberNames(resp *clientv3.MemberListResponse) []string {
	var names []string
	for _, m := range resp.Members {
		names = append(names, m.Name)
	}
	return names
}

func memberID(resp *clientv3.MemberListResponse, name string) uint64 {
	for _, m := range resp.Members {
		if m.Name == name {
			return m.ID
		}
	}
	return 0
}

// triggerFullSnapshot asks backup-restore for a full snapshot on each pod
// until the leading one (the only one that snapshots) takes it.
func triggerFullSnapshot(t *testing.T, s *Site, e *v1alpha1.Etcd) {
	t.Helper()
	if d := s.TriggerSnapshot(t.Context(), client.ObjectKeyFromObject(e), "full"); d.Err != nil {
		t.Fatal(d.Err)
	}
}

// fullSnapshots are the last revisions of the full snapshots under store:
// backup-restore names them Full-<first revision>-<last revision>-<time>.
func fullSnapshots(t *testing.T, store string) []int64 {
	t.Helper()
	var revs []int64
	err := filepath.WalkDir(store, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasPrefix(d.Name(), "Full-") {
			return nil
		}
		fields := strings.Split(d.Name(), "-")
		if len(fields) < 3 {
			return fmt.Errorf("snapshot %s: unexpected name", p)
		}
		rev, err := strconv.ParseInt(fields[2], 10, 64)
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", p, err)
		}
		revs = append(revs, rev)
		return nil
	})
	if err != nil {
		t.Fatalf("listing the Local store %s: %v", store, err)
	}
	return revs
}
