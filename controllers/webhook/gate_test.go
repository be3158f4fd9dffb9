package webhook

import (
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/clientgate"
)

// With a client gate backend port, the sidecar of a plain-HTTP Etcd serves
// etcd's client port through its gate and reaches its own member past it;
// an Etcd with client TLS gets no gate (the gate would need etcd's server
// certificate), and without the option nothing changes.
func TestClientGateFlags(t *testing.T) {
	g := NewWithT(t)
	o := Options{SidecarImage: "registry.example/druid-stretch:test", ClientGateBackendPort: 12379}
	g.Expect(o.validate()).To(Succeed())

	plain := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-events", Namespace: "ns"},
		Spec: v1alpha1.EtcdSpec{EtcdSpec: druidv1alpha1.EtcdSpec{Replicas: 3}}}
	// druid's etcd container of an Etcd with client TLS mounts its server
	// certificate's volume.
	etcd := &corev1.Container{Name: containerEtcd, VolumeMounts: []corev1.VolumeMount{{Name: "etcd-server-tls", MountPath: "/var/etcd/ssl/server", ReadOnly: true}}}
	sc, _ := sidecarContainer(plain, o)
	before := append([]string(nil), sc.Args...)
	g.Expect(gateClients(&sc, etcd, plain, o)).To(Succeed())
	g.Expect(sc.Args).To(ContainElements(
		"--endpoints=http://127.0.0.1:12379,http://etcd-events-client:2379",
		"--client-gate-address=:2379",
		"--client-gate-backend=http://127.0.0.1:12379",
	))
	g.Expect(sc.Args).NotTo(ContainElement("--endpoints=http://etcd-events-local:2379,http://etcd-events-client:2379"))
	g.Expect(sc.Args).To(HaveLen(len(before) + 2))

	tlsEtcd := plain.DeepCopy()
	ref := druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca"}}
	tlsEtcd.Spec.Etcd.ClientUrlTLS = &druidv1alpha1.TLSConfig{TLSCASecretRef: ref,
		ServerTLSSecretRef: corev1.SecretReference{Name: "server"}, ClientTLSSecretRef: corev1.SecretReference{Name: "client"}}
	sc, _ = sidecarContainer(tlsEtcd, o)
	before = append([]string(nil), sc.Args...)
	g.Expect(gateClients(&sc, etcd, tlsEtcd, o)).To(Succeed())
	g.Expect(sc.Args).To(ContainElements(
		"--endpoints=https://etcd-events-local:12379,https://etcd-events-client:2379",
		"--client-gate-address=:2379",
		"--client-gate-backend=https://etcd-events-local:12379",
		"--client-gate-cert=/var/etcd/ssl/server/tls.crt",
		"--client-gate-key=/var/etcd/ssl/server/tls.key",
		"--client-gate-client-ca=/var/etcd/ssl/ca/ca.crt",
		"--cacert=/var/etcd/ssl/ca/ca.crt",
	), "the gate serves as etcd does: etcd's server certificate, client certificates of etcd's CA")
	g.Expect(sc.Args).To(HaveLen(len(before) + 5))
	g.Expect(sc.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "etcd-server-tls", MountPath: "/var/etcd/ssl/server", ReadOnly: true}))

	sc, _ = sidecarContainer(tlsEtcd, o)
	err := gateClients(&sc, &corev1.Container{Name: containerEtcd}, tlsEtcd, o)
	g.Expect(err).To(MatchError(And(ContainSubstring("/var/etcd/ssl/server"), ContainSubstring("serverTLSSecretRef server"))))

	o.ClientGateBackendPort = 0
	sc, _ = sidecarContainer(plain, o)
	before = append([]string(nil), sc.Args...)
	g.Expect(gateClients(&sc, etcd, plain, o)).To(Succeed())
	g.Expect(sc.Args).To(Equal(before), "no gate without the option")

	for _, bad := range []Options{
		{SidecarImage: "i", ClientGateBackendPort: 70000},
		{SidecarImage: "i", ClientGateBackendPort: DefaultSidecarPort},
		{SidecarImage: "i", ClientGateBackendPort: -1},
	} {
		g.Expect(bad.validate()).To(MatchError(ContainSubstring("--client-gate-backend-port")))
	}
}

// The pod template carries the advertised URLs of the members its
// StatefulSet may run. Entries that differ only by the pod's name are one
// entry with $(POD_NAME), so adding the entries of new members as the
// destination grows changes no template and restarts no pod; entries that
// do not fit that pattern are listed one by one. An entry of a member the
// Etcd does not run (the source's, in a live move) is refused, naming it:
// druid's CEL rules refuse it too. The destination's ordinals 3..5 are
// beyond what druid's own field admits, so its entries are the
// EtcdMembership's (spec.additionalAdvertisePeerURLs).
func TestMemberFlagsKeepOwnAdvertisedURLs(t *testing.T) {
	g := NewWithT(t)
	start := int32(3)
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "ns"},
		Spec: v1alpha1.EtcdSpec{MembershipSpec: v1alpha1.MembershipSpec{OrdinalStart: &start,
			AdditionalAdvertisePeerURLs: []v1alpha1.MemberPeerURLs{
				{MemberName: "etcd-main-3", URLs: []string{"http://etcd-main-3.ns.site-b.test:2380"}},
			}}, EtcdSpec: druidv1alpha1.EtcdSpec{Replicas: 1}}}
	flags := func() []string {
		f, err := memberFlags(e)
		g.Expect(err).NotTo(HaveOccurred())
		return f
	}
	const templated = "--additional-peer-urls=$(POD_NAME)=http://$(POD_NAME).ns.site-b.test:2380"
	one := flags()
	g.Expect(one).To(ContainElement(templated))

	e.Spec.Replicas = 3
	e.Spec.AdditionalAdvertisePeerURLs = append(e.Spec.AdditionalAdvertisePeerURLs,
		v1alpha1.MemberPeerURLs{MemberName: "etcd-main-4", URLs: []string{"http://etcd-main-4.ns.site-b.test:2380"}},
		v1alpha1.MemberPeerURLs{MemberName: "etcd-main-5", URLs: []string{"http://etcd-main-5.ns.site-b.test:2380"}})
	g.Expect(flags()).To(Equal(one), "growing from 1 to 3 members changes no flag of the template")

	e.Spec.AdditionalAdvertisePeerURLs[1].URLs = []string{"http://other-host.ns.site-b.test:2380"}
	g.Expect(flags()).To(ContainElement("--additional-peer-urls=" +
		"etcd-main-3=http://etcd-main-3.ns.site-b.test:2380,etcd-main-4=http://other-host.ns.site-b.test:2380,etcd-main-5=http://etcd-main-5.ns.site-b.test:2380"))

	e.Spec.AdditionalAdvertisePeerURLs = e.Spec.AdditionalAdvertisePeerURLs[:1]
	g.Expect(flags()).To(ContainElement("--additional-peer-urls=etcd-main-3=http://etcd-main-3.ns.site-b.test:2380"),
		"members of the window without an entry: each entry is listed")

	e.Spec.AdditionalAdvertisePeerURLs = append(e.Spec.AdditionalAdvertisePeerURLs,
		v1alpha1.MemberPeerURLs{MemberName: "etcd-main-0", URLs: []string{"http://etcd-main-0.ns.site-a.test:2380"}})
	_, err := memberFlags(e)
	g.Expect(err).To(MatchError(ContainSubstring("spec.additionalAdvertisePeerURLs[1].memberName")))
	g.Expect(err).To(MatchError(ContainSubstring("names no local member")))
}

// With EtcdMaxLearners above 1 (the controller's --max-learners), the
// sidecar of a managed Etcd serves etcd's max-learners in the configuration
// etcd-wrapper starts etcd with; at 1 (etcd's default) the template stays
// as it was, so no pod rolls for it.
func TestEtcdMaxLearnersFlag(t *testing.T) {
	g := NewWithT(t)
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "ns"},
		Spec: v1alpha1.EtcdSpec{EtcdSpec: druidv1alpha1.EtcdSpec{Replicas: 3}}}
	pod := func(o Options) *corev1.PodSpec {
		sc, _ := sidecarContainer(e, o)
		return &corev1.PodSpec{Containers: []corev1.Container{
			{Name: containerEtcd, Args: []string{"start-etcd", backupRestoreHostPortFlag + "etcd-main-local:8080"},
				VolumeMounts: []corev1.VolumeMount{{Name: "etcd-main", MountPath: mountEtcdData}}},
			{Name: containerBackupRestore, VolumeMounts: []corev1.VolumeMount{{Name: "etcd-config-file", MountPath: mountEtcdConfig}}},
			sc,
		}}
	}
	args := func(o Options) []string {
		p := pod(o)
		g.Expect(interposeSidecar(p, e, o)).To(Succeed())
		return container(p, SidecarContainerName).Args
	}
	o := Options{SidecarImage: "registry.example/druid-stretch:test", SidecarPort: DefaultSidecarPort}
	one := args(o)
	g.Expect(one).NotTo(ContainElement(HavePrefix("--etcd-max-learners")))
	o.EtcdMaxLearners = 1
	g.Expect(args(o)).To(Equal(one), "etcd's default changes nothing")
	o.EtcdMaxLearners = 3
	g.Expect(args(o)).To(Equal(append(one, "--etcd-max-learners=3")))
	o.EtcdMaxLearners = -1
	g.Expect(o.validate()).To(MatchError(ContainSubstring("--max-learners")))
}

// druid's etcd container stops only after the sidecar drained its client
// gate: its preStop hook sleeps EtcdStopDelay, which is longer than the
// drain's bound. A longer sleep and a hook of another kind are kept, and
// admitting the result again changes nothing.
func TestEtcdStopWaitsForTheGateDrain(t *testing.T) {
	g := NewWithT(t)
	g.Expect(EtcdStopDelay).To(BeNumerically(">", clientgate.StopDrainTimeout))
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "ns"},
		Spec: v1alpha1.EtcdSpec{EtcdSpec: druidv1alpha1.EtcdSpec{Replicas: 3}}}
	o := Options{SidecarImage: "registry.example/druid-stretch:test", SidecarPort: DefaultSidecarPort}
	admit := func(hook *corev1.LifecycleHandler) *corev1.PodSpec {
		sc, _ := sidecarContainer(e, o)
		etcd := corev1.Container{Name: containerEtcd, Args: []string{"start-etcd", backupRestoreHostPortFlag + "etcd-main-local:8080"},
			VolumeMounts: []corev1.VolumeMount{{Name: "etcd-main", MountPath: mountEtcdData}}}
		if hook != nil {
			etcd.Lifecycle = &corev1.Lifecycle{PreStop: hook}
		}
		p := &corev1.PodSpec{Containers: []corev1.Container{etcd,
			{Name: containerBackupRestore, VolumeMounts: []corev1.VolumeMount{{Name: "etcd-config-file", MountPath: mountEtcdConfig}}},
			sc,
		}}
		g.Expect(interposeSidecar(p, e, o)).To(Succeed())
		return p
	}
	preStop := func(p *corev1.PodSpec, name string) *corev1.LifecycleHandler {
		c := container(p, name)
		if c.Lifecycle == nil {
			return nil
		}
		return c.Lifecycle.PreStop
	}
	sleep := func(s int64) *corev1.LifecycleHandler {
		return &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: s}}
	}

	p := admit(nil)
	g.Expect(preStop(p, containerEtcd)).To(Equal(sleep(int64(EtcdStopDelay / time.Second))))
	g.Expect(preStop(p, SidecarContainerName)).To(BeNil(), "the sidecar starts its drain at once")
	g.Expect(preStop(p, containerBackupRestore)).To(BeNil())
	etcd := container(p, containerEtcd).DeepCopy()
	delayEtcdStop(container(p, containerEtcd))
	g.Expect(container(p, containerEtcd)).To(Equal(etcd), "a second admission changes nothing")

	g.Expect(preStop(admit(sleep(1)), containerEtcd)).To(Equal(sleep(int64(EtcdStopDelay/time.Second))), "a shorter sleep is raised")
	g.Expect(preStop(admit(sleep(20)), containerEtcd)).To(Equal(sleep(20)), "a longer sleep is kept")
	http := &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/drain", Port: intstr.FromInt32(9095)}}
	g.Expect(preStop(admit(http.DeepCopy()), containerEtcd)).To(Equal(http), "a hook of another kind is kept")
}
