package chart

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// rbacFixture is the chart's RBAC applied to the API server, a namespace
// with an Etcd opted in by its EtcdMembership and the objects around it, and
// clients acting as the chart's ServiceAccount.
type rbacFixture struct {
	releaseNS, etcdNS string
	// rendered is the chart the RBAC came from.
	rendered *Rendered
	saUser   string
	saGroups []string
	// sa and saWatch act as the ServiceAccount; saCfg is their config.
	saCfg   *rest.Config
	sa      client.Client
	saWatch client.WithWatch
	etcd    *v1alpha1.Etcd
	// membership carries the Etcd's ordinal start.
	membership *stretchv1alpha1.EtcdMembership
	sts        *appsv1.StatefulSet
	pod        *corev1.Pod
	secret     *corev1.Secret
}

// newRBACFixture applies the chart's ServiceAccount, Roles, ClusterRoles and
// bindings (rendered with values) and waits until the API server authorizes
// with them. An end-to-end test of the controller under the chart's identity
// starts here and runs the controller with f.saCfg.
func newRBACFixture(t *testing.T, vals map[string]any) *rbacFixture {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	f := &rbacFixture{releaseNS: newNamespace(t, "rbac-release"), etcdNS: newNamespace(t, "rbac-shoot")}
	r := render(t, "stretch-rbac", f.releaseNS, vals)
	f.rendered = r
	rbac := r.RBACObjects()
	t.Cleanup(func() {
		if err := Delete(ctx, admin, rbac); err != nil {
			t.Errorf("cleaning up RBAC: %v", err)
		}
	})
	g.Expect(Create(ctx, admin, rbac)).To(Succeed())

	saNS, saName, err := r.ServiceAccount()
	g.Expect(err).NotTo(HaveOccurred())
	f.saCfg = ImpersonateServiceAccount(adminCfg, saNS, saName)
	f.saUser = f.saCfg.Impersonate.UserName
	f.saGroups = f.saCfg.Impersonate.Groups
	f.saWatch, err = client.NewWithWatch(f.saCfg, client.Options{Scheme: admin.Scheme()})
	g.Expect(err).NotTo(HaveOccurred())
	f.sa = f.saWatch

	f.etcd = newEtcd(f.etcdNS, "etcd-main")
	g.Expect(admin.Create(ctx, f.etcd)).To(Succeed())
	f.membership = stretchv1alpha1.For(f.etcd, v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](3)})
	g.Expect(admin.Create(ctx, f.membership)).To(Succeed())
	f.sts = &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.etcdNS, Name: "etcd-main"},
		Spec: appsv1.StatefulSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "etcd"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "etcd"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "etcd"}}},
			},
		},
	}
	g.Expect(admin.Create(ctx, f.sts)).To(Succeed())
	f.pod = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.etcdNS, Name: "etcd-main-3", Labels: map[string]string{"app": "etcd"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd", Image: "etcd"}}},
	}
	g.Expect(admin.Create(ctx, f.pod)).To(Succeed())
	f.secret = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.etcdNS, Name: "etcd-backup-server-tls"},
		Data:       map[string][]byte{"tls.key": []byte("not a key")},
	}
	g.Expect(admin.Create(ctx, f.secret)).To(Succeed())

	// The RBAC authorizer learns new bindings through an informer.
	g.Eventually(func() error {
		return f.sa.Get(ctx, client.ObjectKeyFromObject(f.etcd), &v1alpha1.Etcd{})
	}).WithTimeout(10 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	return f
}

// newEtcd is the smallest Etcd druid's CRD accepts.
func newEtcd(namespace, name string) *v1alpha1.Etcd {
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	e.Spec.Replicas = 3
	e.Spec.Labels = map[string]string{"app": "etcd"}
	return e
}

// TestRBACControllerPath: acting as the chart's ServiceAccount, through the
// real kube-apiserver, the controller's and webhooks' API calls succeed:
// list, watch and get Etcds and EtcdMemberships and read the pair, patch an
// EtcdMembership's status, create an EtcdMembership and patch its spec (the
// adoption of an Etcd's inline fields), patch and update the status of an
// Etcd stored under the extended Etcd CRD of an earlier release, record
// Events on Etcds (events.k8s.io), win leader election on a Lease in the
// release namespace, recording it as a core Event there, and read, watch and
// patch the pod-window annotation of druid's StatefulSets.
func TestRBACControllerPath(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newRBACFixture(t, values(t, ``))
	key := client.ObjectKeyFromObject(f.etcd)

	var list v1alpha1.EtcdList
	g.Expect(f.sa.List(ctx, &list)).To(Succeed(), "list Etcds in every namespace")
	g.Expect(list.Items).To(ContainElement(HaveField("ObjectMeta.Name", f.etcd.Name)))
	expectWatchSees(g, ctx, f.saWatch, &v1alpha1.EtcdList{}, f.etcdNS, f.etcd.Name)
	var memberships stretchv1alpha1.EtcdMembershipList
	g.Expect(f.sa.List(ctx, &memberships)).To(Succeed(), "list EtcdMemberships in every namespace")
	g.Expect(memberships.Items).To(ContainElement(HaveField("ObjectMeta.Name", f.membership.Name)))
	expectWatchSees(g, ctx, f.saWatch, &stretchv1alpha1.EtcdMembershipList{}, f.etcdNS, f.membership.Name)

	// The pair, as the controller and the StatefulSet webhook read it.
	p, err := etcdview.Get(ctx, f.sa, key)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Source).To(Equal(stretchv1alpha1.SpecFromEtcdMembership))
	g.Expect(p.View.Spec.GetOrdinalStart()).To(Equal(int32(3)))

	// status.membership goes into the EtcdMembership by patch
	// (etcdview.WriteStatus).
	m := p.Membership.DeepCopy()
	m.Status.Membership = &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseConverged, ObservedGeneration: p.View.Generation}
	g.Expect(f.sa.Status().Patch(ctx, m, client.MergeFrom(p.Membership))).To(Succeed())
	storedMembership := &stretchv1alpha1.EtcdMembership{}
	g.Expect(admin.Get(ctx, key, storedMembership)).To(Succeed())
	g.Expect(storedMembership.Status.Membership).NotTo(BeNil())
	g.Expect(storedMembership.Status.Membership.Phase).To(Equal(v1alpha1.MembershipPhaseConverged))
	g.Expect(storedMembership.Spec).To(Equal(f.membership.Spec), "status writes leave the spec alone")

	// An Etcd that still carries the fields inline gets them copied into an
	// EtcdMembership the controller creates, later patches guarded by
	// resourceVersion (etcdview.Adopt).
	adopted := stretchv1alpha1.For(newEtcd(f.etcdNS, "etcd-adopted"), v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](3)})
	g.Expect(f.sa.Create(ctx, adopted)).To(Succeed())
	copied := adopted.DeepCopy()
	copied.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyKeep)
	g.Expect(f.sa.Patch(ctx, copied, client.MergeFromWithOptions(adopted, client.MergeFromWithOptimisticLock{}))).To(Succeed())
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(adopted), adopted)).To(Succeed())
	g.Expect(adopted.Spec.GetExternalMembersPolicy()).To(Equal(v1alpha1.ExternalMembersPolicyKeep))

	// Where the Etcd itself carries status.membership (stored under the
	// extended Etcd CRD of an earlier release), the controller writes it
	// there too: by patch and by update.
	withExtendedEtcdCRD(t)
	etcd := &v1alpha1.Etcd{}
	g.Expect(f.sa.Get(ctx, key, etcd)).To(Succeed())
	before := etcd.DeepCopy()
	etcd.Status.Membership = &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhasePending, ObservedGeneration: etcd.Generation}
	g.Expect(f.sa.Status().Patch(ctx, etcd, client.MergeFrom(before))).To(Succeed())
	etcd.Status.Membership.Phase = v1alpha1.MembershipPhaseConverged
	g.Expect(f.sa.Status().Update(ctx, etcd)).To(Succeed())
	stored := &v1alpha1.Etcd{}
	g.Expect(admin.Get(ctx, key, stored)).To(Succeed())
	g.Expect(stored.Status.Membership).NotTo(BeNil())
	g.Expect(stored.Status.Membership.Phase).To(Equal(v1alpha1.MembershipPhaseConverged))
	g.Expect(stored.Spec).To(Equal(f.etcd.Spec), "status writes leave the spec alone")

	// Events on the Etcd, events.k8s.io API: created, then patched into a
	// series, as client-go's events recorder does.
	cs, err := kubernetes.NewForConfig(f.saCfg)
	g.Expect(err).NotTo(HaveOccurred())
	ref := corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Etcd", Namespace: f.etcdNS, Name: f.etcd.Name, UID: stored.UID}
	ev1, err := cs.EventsV1().Events(f.etcdNS).Create(ctx, &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", f.etcd.Name, time.Now().UnixNano())},
		EventTime:  metav1.NowMicro(), ReportingController: "druid-stretch.io/controller", ReportingInstance: "druid-stretch-0",
		Action: "Promote", Reason: "Promoting", Regarding: ref, Type: corev1.EventTypeNormal, Note: "promoting etcd-main-3",
	}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = cs.EventsV1().Events(f.etcdNS).Patch(ctx, ev1.Name, types.MergePatchType, []byte(`{"series":{"count":2,"lastObservedTime":"`+metav1.NowMicro().Format(metav1.RFC3339Micro)+`"}}`), metav1.PatchOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	// Leader election exactly as the controller's manager does it: a Lease
	// lock in the release namespace, released on exit, and the new leader
	// recorded as a core Event on the Lease (created, then patched).
	expectLeadership(g, ctx, cs, f.releaseNS)
	leaseRef := corev1.ObjectReference{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Namespace: f.releaseNS, Name: "druid-stretch-leader"}
	ev, err := cs.CoreV1().Events(f.releaseNS).Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: "druid-stretch-leader-"},
		InvolvedObject: leaseRef, Type: corev1.EventTypeNormal, Reason: "LeaderElection", Message: "druid-stretch-0 became leader",
		Source: corev1.EventSource{Component: "druid-stretch"}, Count: 1, FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(),
	}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = cs.CoreV1().Events(f.releaseNS).Patch(ctx, ev.Name, types.StrategicMergePatchType, []byte(`{"count":2}`), metav1.PatchOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	// druid's StatefulSet: read through the cache, pod window patched.
	var stsList appsv1.StatefulSetList
	g.Expect(f.sa.List(ctx, &stsList)).To(Succeed())
	expectWatchSees(g, ctx, f.saWatch, &appsv1.StatefulSetList{}, f.etcdNS, f.sts.Name)
	sts := &appsv1.StatefulSet{}
	g.Expect(f.sa.Get(ctx, client.ObjectKeyFromObject(f.sts), sts)).To(Succeed())
	stsBefore := sts.DeepCopy()
	sts.Annotations = map[string]string{"druid-stretch.druid.gardener.cloud/pod-window": "[3, 6)"}
	g.Expect(f.sa.Patch(ctx, sts, client.MergeFrom(stsBefore))).To(Succeed())
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(f.sts), sts)).To(Succeed())
	g.Expect(sts.Annotations).To(HaveKeyWithValue("druid-stretch.druid.gardener.cloud/pod-window", "[3, 6)"))
}

// TestRBACDenied: the same identity is refused what the controller must not
// do, and the refused requests change nothing.
func TestRBACDenied(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newRBACFixture(t, values(t, ``))
	cs, err := kubernetes.NewForConfig(f.saCfg)
	g.Expect(err).NotTo(HaveOccurred())

	etcdBefore, stsBefore, podBefore := &v1alpha1.Etcd{}, &appsv1.StatefulSet{}, &corev1.Pod{}
	membershipBefore := &stretchv1alpha1.EtcdMembership{}
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(f.etcd), etcdBefore)).To(Succeed())
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(f.membership), membershipBefore)).To(Succeed())
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(f.sts), stsBefore)).To(Succeed())
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(f.pod), podBefore)).To(Succeed())

	denied := []struct {
		what string
		do   func() error
	}{
		{"read a Secret beside the Etcd", func() error { return f.sa.Get(ctx, client.ObjectKeyFromObject(f.secret), &corev1.Secret{}) }},
		{"list Secrets", func() error { return f.sa.List(ctx, &corev1.SecretList{}) }},
		{"read its own webhook certificate Secret", func() error {
			return f.sa.Get(ctx, client.ObjectKey{Namespace: f.releaseNS, Name: f.rendered.fullname() + "-webhook-tls"}, &corev1.Secret{})
		}},
		{"delete an Etcd", func() error { return f.sa.Delete(ctx, etcdBefore.DeepCopy()) }},
		{"create an Etcd", func() error { return f.sa.Create(ctx, newEtcd(f.etcdNS, "etcd-events")) }},
		{"patch an Etcd", func() error {
			return f.sa.Patch(ctx, etcdBefore.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":5}}`)))
		}},
		{"update an Etcd's spec", func() error {
			e := etcdBefore.DeepCopy()
			e.Spec.Replicas = 5
			return f.sa.Update(ctx, e)
		}},
		// The controller creates and patches EtcdMemberships; it never
		// deletes one (an Etcd's goes with it, by its owner reference), nor
		// updates one wholesale, which could drop a user's edit.
		{"delete an EtcdMembership", func() error { return f.sa.Delete(ctx, membershipBefore.DeepCopy()) }},
		{"update an EtcdMembership", func() error {
			m := membershipBefore.DeepCopy()
			m.Spec.OrdinalStart = ptr.To[int32](6)
			return f.sa.Update(ctx, m)
		}},
		{"update an EtcdMembership's status", func() error {
			m := membershipBefore.DeepCopy()
			m.Status.Membership = &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseBlocked}
			return f.sa.Status().Update(ctx, m)
		}},
		{"update a Pod", func() error {
			p := podBefore.DeepCopy()
			p.Labels["druid-stretch.io/touched"] = "true"
			return f.sa.Update(ctx, p)
		}},
		{"delete a Pod", func() error { return f.sa.Delete(ctx, podBefore.DeepCopy()) }},
		{"read a Pod", func() error { return f.sa.Get(ctx, client.ObjectKeyFromObject(f.pod), &corev1.Pod{}) }},
		{"update a StatefulSet", func() error {
			s := stsBefore.DeepCopy()
			s.Spec.Replicas = ptr.To[int32](5)
			return f.sa.Update(ctx, s)
		}},
		{"scale a StatefulSet", func() error {
			return f.sa.SubResource("scale").Patch(ctx, stsBefore.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":5}}`)))
		}},
		{"delete a StatefulSet", func() error { return f.sa.Delete(ctx, stsBefore.DeepCopy()) }},
		// The member lease bridge creates and patches druid's member leases
		// anywhere; it never deletes one, nor updates one wholesale.
		{"delete a Lease outside the release namespace", func() error {
			return cs.CoordinationV1().Leases(f.etcdNS).Delete(ctx, "etcd-main-0", metav1.DeleteOptions{})
		}},
		{"update a Lease outside the release namespace", func() error {
			_, err := cs.CoordinationV1().Leases(f.etcdNS).Update(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main-0"}}, metav1.UpdateOptions{})
			return err
		}},
		{"write a core Event beside the Etcd", func() error {
			_, err := cs.CoreV1().Events(f.etcdNS).Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{GenerateName: "etcd-main-"},
				InvolvedObject: corev1.ObjectReference{Kind: "Etcd", Namespace: f.etcdNS, Name: f.etcd.Name},
			}, metav1.CreateOptions{})
			return err
		}},
		{"read the kube-system Namespace", func() error {
			return f.sa.Get(ctx, client.ObjectKey{Name: "kube-system"}, &corev1.Namespace{})
		}},
		{"read a ConfigMap", func() error {
			return f.sa.Get(ctx, client.ObjectKey{Namespace: f.etcdNS, Name: "etcd-bootstrap"}, &corev1.ConfigMap{})
		}},
	}
	for _, d := range denied {
		err := d.do()
		g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%s: want Forbidden, got %v", d.what, err)
		g.Expect(err.Error()).To(ContainSubstring(f.saUser), "%s: the refusal names the identity", d.what)
	}

	etcdAfter, stsAfter, podAfter := &v1alpha1.Etcd{}, &appsv1.StatefulSet{}, &corev1.Pod{}
	membershipAfter := &stretchv1alpha1.EtcdMembership{}
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(f.etcd), etcdAfter)).To(Succeed())
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(f.membership), membershipAfter)).To(Succeed())
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(f.sts), stsAfter)).To(Succeed())
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(f.pod), podAfter)).To(Succeed())
	g.Expect(etcdAfter.ResourceVersion).To(Equal(etcdBefore.ResourceVersion), "the Etcd is untouched")
	g.Expect(membershipAfter.ResourceVersion).To(Equal(membershipBefore.ResourceVersion), "the EtcdMembership is untouched")
	g.Expect(stsAfter.ResourceVersion).To(Equal(stsBefore.ResourceVersion), "the StatefulSet is untouched")
	g.Expect(podAfter.ResourceVersion).To(Equal(podBefore.ResourceVersion), "the Pod is untouched")
	var etcds v1alpha1.EtcdList
	g.Expect(admin.List(ctx, &etcds, client.InNamespace(f.etcdNS))).To(Succeed())
	g.Expect(etcds.Items).To(HaveLen(1), "no Etcd was created")
}

// TestRBACMatrix asks the API server's authorizer, for every verb on the
// resources around an Etcd, whether the chart's ServiceAccount may: the
// allowed set is exactly the controller's needs.
func TestRBACMatrix(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newRBACFixture(t, values(t, ``))

	verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	type res struct{ group, resource, subresource, namespace string }
	druid, stretch := druidv1alpha1.GroupName, stretchv1alpha1.GroupVersion.Group
	cases := []struct {
		res
		allowed []string
	}{
		{res{druid, "etcds", "", f.etcdNS}, []string{"get", "list", "watch"}},
		{res{druid, "etcds", "", ""}, []string{"get", "list", "watch"}},
		{res{druid, "etcds", "status", f.etcdNS}, []string{"get", "patch", "update"}},
		{res{stretch, "etcdmemberships", "", f.etcdNS}, []string{"get", "list", "watch", "create", "patch"}},
		{res{stretch, "etcdmemberships", "", ""}, []string{"get", "list", "watch", "create", "patch"}},
		{res{stretch, "etcdmemberships", "status", f.etcdNS}, []string{"get", "patch"}},
		{res{druid, "etcdcopybackupstasks", "", f.etcdNS}, nil},
		{res{druid, "etcdopstasks", "", f.etcdNS}, nil},
		{res{"", "events", "", f.releaseNS}, []string{"create", "patch"}},
		{res{"", "events", "", f.etcdNS}, nil},
		{res{"events.k8s.io", "events", "", f.etcdNS}, []string{"create", "patch"}},
		{res{"apps", "statefulsets", "", f.etcdNS}, []string{"get", "list", "watch", "patch"}},
		{res{"apps", "statefulsets", "scale", f.etcdNS}, nil},
		{res{"apps", "statefulsets", "status", f.etcdNS}, nil},
		// The election lease in the release namespace; druid's member
		// leases everywhere (the member lease bridge).
		{res{"coordination.k8s.io", "leases", "", f.releaseNS}, []string{"get", "list", "watch", "create", "update", "patch"}},
		{res{"coordination.k8s.io", "leases", "", f.etcdNS}, []string{"get", "list", "watch", "create", "patch"}},
		// The slice that publishes external members' in-cluster peer names.
		{res{"discovery.k8s.io", "endpointslices", "", f.etcdNS}, []string{"get", "list", "watch", "create", "update", "delete"}},
		{res{"", "endpoints", "", f.etcdNS}, nil},
		{res{"", "secrets", "", f.etcdNS}, nil},
		{res{"", "secrets", "", f.releaseNS}, nil},
		{res{"", "pods", "", f.etcdNS}, nil},
		{res{"", "pods", "exec", f.etcdNS}, nil},
		{res{"", "pods", "eviction", f.etcdNS}, nil},
		{res{"", "configmaps", "", f.etcdNS}, nil},
		{res{"", "namespaces", "", ""}, nil},
		{res{"", "services", "", f.etcdNS}, nil},
		// Read before a bootstrap: a volume of another ordinal may hold
		// the data of a cluster that existed.
		{res{"", "persistentvolumeclaims", "", f.etcdNS}, []string{"get", "list"}},
		{res{"", "serviceaccounts", "token", f.releaseNS}, nil},
		{res{"apps", "deployments", "", f.releaseNS}, nil},
		{res{"policy", "poddisruptionbudgets", "", f.etcdNS}, nil},
		{res{"apiextensions.k8s.io", "customresourcedefinitions", "", ""}, nil},
		{res{"admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", ""}, nil},
		{res{"admissionregistration.k8s.io", "validatingwebhookconfigurations", "", ""}, nil},
		{res{"rbac.authorization.k8s.io", "clusterroles", "", ""}, nil},
		{res{"rbac.authorization.k8s.io", "rolebindings", "", f.releaseNS}, nil},
	}
	var wrong []string
	checked := 0
	for _, c := range cases {
		for _, verb := range verbs {
			allowed := canI(g, ctx, f, authorizationv1.ResourceAttributes{
				Namespace: c.namespace, Verb: verb, Group: c.group, Resource: c.resource, Subresource: c.subresource,
			})
			checked++
			if want := slices.Contains(c.allowed, verb); allowed != want {
				wrong = append(wrong, fmt.Sprintf("%s %s/%s/%s in %q: allowed=%v, want %v", verb, c.group, c.resource, c.subresource, c.namespace, allowed, want))
			}
		}
	}
	// Verbs that widen privileges.
	for _, a := range []authorizationv1.ResourceAttributes{
		{Verb: "impersonate", Resource: "users"},
		{Verb: "impersonate", Resource: "serviceaccounts", Namespace: f.releaseNS},
		{Verb: "escalate", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"},
		{Verb: "bind", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"},
		{Verb: "approve", Group: "certificates.k8s.io", Resource: "signers"},
	} {
		checked++
		if canI(g, ctx, f, a) {
			wrong = append(wrong, fmt.Sprintf("%s %s/%s: allowed", a.Verb, a.Group, a.Resource))
		}
	}
	g.Expect(wrong).To(BeEmpty(), "\n"+strings.Join(wrong, "\n"))
	t.Logf("%d access checks, all as expected", checked)
}

// canI asks the authorizer whether the fixture's ServiceAccount may act.
func canI(g *WithT, ctx context.Context, f *rbacFixture, attrs authorizationv1.ResourceAttributes) bool {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: f.saUser, Groups: f.saGroups, ResourceAttributes: &attrs,
	}}
	g.ExpectWithOffset(1, admin.Create(ctx, sar)).To(Succeed())
	return sar.Status.Allowed
}

// expectWatchSees opens a watch on list's kind in namespace as the
// ServiceAccount and waits for the object's ADDED event.
func expectWatchSees(g *WithT, ctx context.Context, c client.WithWatch, list client.ObjectList, namespace, name string) {
	w, err := c.Watch(ctx, list, client.InNamespace(namespace))
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred(), "watch %T", list)
	defer w.Stop()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			g.ExpectWithOffset(1, ok).To(BeTrue(), "watch closed before %s/%s arrived", namespace, name)
			g.ExpectWithOffset(1, ev.Type).NotTo(Equal(watch.Error), "watch error: %v", ev.Object)
			if o, ok := ev.Object.(client.Object); ok && ev.Type == watch.Added && o.GetName() == name {
				return
			}
		case <-deadline:
			g.ExpectWithOffset(1, "no ADDED event").To(BeEmpty(), "watch %T for %s/%s", list, namespace, name)
			return
		}
	}
}

// expectLeadership wins leader election with client-go's Lease lock, as
// controller-runtime's manager does with --leader-elect, and releases it.
func expectLeadership(g *WithT, ctx context.Context, cs kubernetes.Interface, namespace string) {
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, namespace, "druid-stretch-leader", cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: "druid-stretch-test"})
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	leCtx, stop := context.WithCancel(ctx)
	defer stop()
	led := make(chan struct{})
	done := make(chan struct{})
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(led) },
			OnStoppedLeading: func() {},
		},
	})
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	go func() { defer close(done); le.Run(leCtx) }()
	select {
	case <-led:
	case <-time.After(15 * time.Second):
		g.ExpectWithOffset(1, "not leading").To(BeEmpty(), "leader election in %s", namespace)
	}
	// The elector renews once right after it acquired the lock; stopping
	// while that renewal is in flight leaves it a stale record, and its
	// release then conflicts. The next renewal comes a retry period later.
	g.EventuallyWithOffset(1, func(g Gomega) {
		l := &coordinationv1.Lease{}
		g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "druid-stretch-leader"}, l)).To(Succeed())
		g.Expect(l.Spec.RenewTime).NotTo(BeNil())
		g.Expect(l.Spec.AcquireTime).NotTo(BeNil())
		g.Expect(l.Spec.RenewTime.Time.After(l.Spec.AcquireTime.Time)).To(BeTrue(), "renewed after acquiring")
	}).WithTimeout(10 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	stop()
	<-done
	lease := &coordinationv1.Lease{}
	g.ExpectWithOffset(1, admin.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "druid-stretch-leader"}, lease)).To(Succeed())
	g.ExpectWithOffset(1, ptr.Deref(lease.Spec.HolderIdentity, "")).To(BeEmpty(), "the lease was released on exit")
}

// TestImpersonatingKubeconfig: a process started with the kubeconfig that
// ImpersonatingKubeconfig writes (the controller binary in an end-to-end
// test) is the chart's ServiceAccount to the API server, and gets its RBAC.
func TestImpersonatingKubeconfig(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newRBACFixture(t, values(t, ``))
	ns, name, err := f.rendered.ServiceAccount()
	g.Expect(err).NotTo(HaveOccurred())
	data, err := ImpersonatingKubeconfig(adminCfg, ns, name)
	g.Expect(err).NotTo(HaveOccurred())
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	g.Expect(err).NotTo(HaveOccurred())
	cs, err := kubernetes.NewForConfig(cfg)
	g.Expect(err).NotTo(HaveOccurred())
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(review.Status.UserInfo.Username).To(Equal(ServiceAccountUser(ns, name)))
	g.Expect(review.Status.UserInfo.Groups).To(ContainElement("system:serviceaccounts:" + ns))
	_, err = cs.CoreV1().Secrets(f.etcdNS).Get(ctx, f.secret.Name, metav1.GetOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "got %v", err)
}
