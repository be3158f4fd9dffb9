package webhook_test

import (
	"context"
	"strings"
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/diff"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// etcdWithTLS is an Etcd as gardenlet writes one: client, peer and
// backup-restore TLS, three replicas, no extension field yet.
func etcdWithTLS(namespace string) *v1alpha1.Etcd {
	secret := func(name string) corev1.SecretReference { return corev1.SecretReference{Name: name} }
	tlsConfig := func(ca, server, client string) druidv1alpha1.TLSConfig {
		return druidv1alpha1.TLSConfig{
			TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: secret(ca), DataKey: ptr.To("bundle.crt")},
			ServerTLSSecretRef: secret(server),
			ClientTLSSecretRef: secret(client),
		}
	}
	clientTLS := tlsConfig("ca-etcd", "etcd-server", "etcd-client")
	backupTLS := tlsConfig("ca-etcdbr", "etcdbr-server", "etcdbr-client")
	backupTLS.TLSCASecretRef.DataKey = nil // druid's default key, ca.crt
	return &v1alpha1.Etcd{
		ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: namespace},
		Spec: v1alpha1.EtcdSpec{EtcdSpec: druidv1alpha1.EtcdSpec{
			MemberNamePrefix: ptr.To("seed-b"),
			Labels:           map[string]string{"app": "etcd-statefulset", "role": "main"},
			Replicas:         3,
			Etcd: druidv1alpha1.EtcdConfig{
				ClientUrlTLS: &clientTLS,
				PeerUrlTLS: &druidv1alpha1.PeerTLSConfig{TLSConfig: druidv1alpha1.TLSConfig{
					TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: secret("ca-etcd-peer")},
					ServerTLSSecretRef: secret("etcd-peer-server"),
				}},
			},
			Backup: druidv1alpha1.BackupSpec{TLS: &backupTLS},
		}},
	}
}

// plainEtcd is an Etcd without any TLS, opted into plain-HTTP sidecars
// for tests.
func plainEtcd(namespace string) *v1alpha1.Etcd {
	return &v1alpha1.Etcd{
		ObjectMeta: metav1.ObjectMeta{Name: "etcd-events", Namespace: namespace,
			Annotations: map[string]string{v1alpha1.InsecurePlainHTTPSidecarAnnotation: "true"}},
		Spec: v1alpha1.EtcdSpec{EtcdSpec: druidv1alpha1.EtcdSpec{
			Labels:   map[string]string{"app": "etcd-statefulset", "role": "events"},
			Replicas: 3,
		}},
	}
}

// druidStatefulSet is the StatefulSet druid builds for e (its labels, owner
// reference, containers, ports and TLS volumes), before any webhook.
func druidStatefulSet(e *v1alpha1.Etcd) *appsv1.StatefulSet {
	labels := druidv1alpha1.GetDefaultLabels(e.ObjectMeta)
	stsLabels := map[string]string{
		druidv1alpha1.LabelComponentKey: "etcd-statefulset",
		druidv1alpha1.LabelAppNameKey:   e.Name,
	}
	for k, v := range labels {
		stsLabels[k] = v
	}
	podLabels := map[string]string{}
	for k, v := range stsLabels {
		podLabels[k] = v
	}
	for k, v := range e.Spec.Labels {
		podLabels[k] = v
	}
	secretVolume := func(name, secret string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret, DefaultMode: ptr.To[int32](0o640)}}}
	}
	volumes := []corev1.Volume{{Name: "etcd-config-file", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: druidv1alpha1.GetConfigMapName(e.ObjectMeta)},
		Items:                []corev1.KeyToPath{{Key: "etcd.conf.yaml", Path: "etcd.conf.yaml"}},
		DefaultMode:          ptr.To[int32](0o640),
	}}}}
	var etcdMounts, brMounts []corev1.VolumeMount
	if t := e.Spec.Etcd.ClientUrlTLS; t != nil {
		volumes = append(volumes, secretVolume("etcd-ca", t.TLSCASecretRef.Name), secretVolume("etcd-server-tls", t.ServerTLSSecretRef.Name), secretVolume("etcd-client-tls", t.ClientTLSSecretRef.Name))
		etcdMounts = append(etcdMounts, corev1.VolumeMount{Name: "etcd-ca", MountPath: "/var/etcd/ssl/ca"}, corev1.VolumeMount{Name: "etcd-server-tls", MountPath: "/var/etcd/ssl/server"}, corev1.VolumeMount{Name: "etcd-client-tls", MountPath: "/var/etcd/ssl/client"})
		brMounts = append(brMounts, corev1.VolumeMount{Name: "etcd-ca", MountPath: "/var/etcd/ssl/ca"}, corev1.VolumeMount{Name: "etcd-client-tls", MountPath: "/var/etcd/ssl/client"})
	}
	if t := e.Spec.Backup.TLS; t != nil {
		volumes = append(volumes, secretVolume("backup-restore-ca", t.TLSCASecretRef.Name), secretVolume("backup-restore-server-tls", t.ServerTLSSecretRef.Name), secretVolume("backup-restore-client-tls", t.ClientTLSSecretRef.Name))
		etcdMounts = append(etcdMounts, corev1.VolumeMount{Name: "backup-restore-ca", MountPath: "/var/etcdbr/ssl/ca"})
		brMounts = append(brMounts, corev1.VolumeMount{Name: "backup-restore-server-tls", MountPath: "/var/etcdbr/ssl/server"})
	}
	backupPort := ptr.Deref(e.Spec.Backup.Port, 8080)
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{
			Name: e.Name, Namespace: e.Namespace, Labels: stsLabels,
			OwnerReferences: []metav1.OwnerReference{druidv1alpha1.GetAsOwnerReference(e.ObjectMeta)},
		},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(e.Spec.Replicas),
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			ServiceName:         druidv1alpha1.GetPeerServiceName(e.ObjectMeta),
			PodManagementPolicy: appsv1.ParallelPodManagement,
			UpdateStrategy:      appsv1.StatefulSetUpdateStrategy{Type: appsv1.RollingUpdateStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels,
					Annotations: map[string]string{"checksum/etcd-configmap": "2f1d4ca1"}},
				Spec: corev1.PodSpec{
					HostAliases:           []corev1.HostAlias{{IP: "127.0.0.1", Hostnames: []string{e.Name + "-local"}}},
					ShareProcessNamespace: ptr.To(true),
					Containers: []corev1.Container{
						{
							Name: "etcd", Image: "europe-docker.pkg.dev/gardener-project/public/gardener/etcd-wrapper:v0.6.0",
							Args: []string{"start-etcd", "--backup-restore-host-port=" + e.Name + "-local:8080"},
							Ports: []corev1.ContainerPort{
								{Name: "server", ContainerPort: 2380, Protocol: corev1.ProtocolTCP},
								{Name: "client", ContainerPort: 2379, Protocol: corev1.ProtocolTCP},
							},
							VolumeMounts: append([]corev1.VolumeMount{{Name: e.Name, MountPath: "/var/etcd/data"}}, etcdMounts...),
						},
						{
							Name: "backup-restore", Image: "europe-docker.pkg.dev/gardener-project/public/gardener/etcdbrctl:v0.33.0",
							Args:         []string{"server", "--server-port=8080"},
							Env:          []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}}},
							Ports:        []corev1.ContainerPort{{Name: "server", ContainerPort: backupPort, Protocol: corev1.ProtocolTCP}},
							VolumeMounts: append([]corev1.VolumeMount{{Name: e.Name, MountPath: "/var/etcd/data"}, {Name: "etcd-config-file", MountPath: "/var/etcd/config/"}}, brMounts...),
						},
					},
					SecurityContext: &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532), RunAsNonRoot: ptr.To(true), FSGroup: ptr.To[int64](65532)},
					Volumes:         volumes,
				},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: e.Name},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Gi")}},
				},
			}},
		},
	}
}

// twinOf is sts under another name and without druid's labels, so the
// webhook's object selector skips it: the API server stores it exactly as
// it stores an unmutated StatefulSet, defaults and all.
func twinOf(sts *appsv1.StatefulSet) *appsv1.StatefulSet {
	twin := sts.DeepCopy()
	twin.Name += "-twin"
	twin.Labels = map[string]string{"twin-of": sts.Name}
	return twin
}

// createBoth stores sts and its twin on k8s and returns what the server
// stored.
func createBoth(t *testing.T, sts *appsv1.StatefulSet) (stored, twin *appsv1.StatefulSet) {
	t.Helper()
	return createBothIn(t, k8s, sts)
}

// createBothIn is createBoth on the API server of c.
func createBothIn(t *testing.T, c client.Client, sts *appsv1.StatefulSet) (stored, twin *appsv1.StatefulSet) {
	t.Helper()
	g := NewWithT(t)
	twin = twinOf(sts)
	g.Expect(c.Create(t.Context(), twin)).To(Succeed())
	g.Expect(c.Create(t.Context(), sts.DeepCopy())).To(Succeed())
	stored = &appsv1.StatefulSet{}
	g.Expect(c.Get(t.Context(), client.ObjectKeyFromObject(sts), stored)).To(Succeed())
	g.Expect(c.Get(t.Context(), client.ObjectKeyFromObject(twin), twin)).To(Succeed())
	return stored, twin
}

// createEtcd creates e, a view, as a user of druid's own Etcd CRD does:
// its EtcdMembership with druid-stretch's fields first (when e sets any),
// so that the StatefulSet webhook sees them before druid acts on the Etcd,
// then the Etcd in druid's form. e is returned as created, its fields
// back in place.
func createEtcd(t *testing.T, e *v1alpha1.Etcd) *v1alpha1.Etcd {
	t.Helper()
	NewWithT(t).Expect(etcdview.Create(t.Context(), k8s, e)).To(Succeed())
	return e
}

// changeEtcd applies change to the view of e's pair as stored and writes
// each part back where it lives (etcdview.Apply); it returns the view
// written. Status is the caller's: see setMembershipStatus.
func changeEtcd(t *testing.T, e *v1alpha1.Etcd, change func(*v1alpha1.Etcd)) *v1alpha1.Etcd {
	t.Helper()
	g := NewWithT(t)
	p, err := etcdview.Get(t.Context(), k8s, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	want := p.View.DeepCopy()
	change(want)
	g.Expect(etcdview.Apply(t.Context(), k8s, p, want)).To(Succeed())
	return want
}

// setMembershipStatus writes st as status.membership of e's EtcdMembership,
// where the membership controller reports it, and into e, the view the
// test plans with.
func setMembershipStatus(t *testing.T, e *v1alpha1.Etcd, st *v1alpha1.MembershipStatus) {
	t.Helper()
	g := NewWithT(t)
	m, err := etcdview.GetMembership(t.Context(), k8s, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m).NotTo(BeNil(), "the EtcdMembership of %s", e.Name)
	m.Status.Membership = st.DeepCopy()
	g.Expect(k8s.Status().Update(t.Context(), m)).To(Succeed())
	e.Status.Membership = st.DeepCopy()
}

// expectSpec compares two StatefulSet specs semantically, printing a diff.
func expectSpec(t *testing.T, got, want appsv1.StatefulSetSpec) {
	t.Helper()
	if !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("stored spec differs from the expected one (- want, + got):\n%s", diff.Diff(want, got))
	}
}

// podNameEnv is the POD_NAME variable the sidecar and its init container
// get, as druid gives it to backup-restore.
var podNameEnv = corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}}

// tlsSidecar is the sidecar expected in etcdWithTLS's pods in namespace ns,
// written out flag by flag from druid's layout of the TLS Secrets and the
// member's in-cluster URLs.
func tlsSidecar(ns string) corev1.Container {
	return corev1.Container{
		Name:            "druid-stretch-sidecar",
		Image:           "registry.example/druid-stretch:test",
		ImagePullPolicy: corev1.PullIfNotPresent,
		Args: []string{
			"sidecar",
			"--listen-address=:8090",
			"--cacert=/var/etcd/ssl/ca/bundle.crt",
			"--cert=/var/etcd/ssl/client/tls.crt",
			"--key=/var/etcd/ssl/client/tls.key",
			"--insecure-transport=false",
			"--insecure-skip-tls-verify=false",
			"--endpoints=https://etcd-main-local:2379,https://etcd-main-client:2379",
			"--server-cert=/var/etcdbr/ssl/server/tls.crt",
			"--server-key=/var/etcdbr/ssl/server/tls.key",
			"--client-ca=/var/etcdbr/ssl/ca/ca.crt",
			"--allowed-client=druid-stretch-controller",
			"--etcd-config=/var/etcd/config/etcd.conf.yaml",
			"--member-name=seed-b-$(POD_NAME)",
			"--member-peer-urls=https://$(POD_NAME).etcd-main-peer." + ns + ".svc:2380",
			"--member-client-urls=https://$(POD_NAME).etcd-main-peer." + ns + ".svc:2379",
		},
		Env:   []corev1.EnvVar{podNameEnv},
		Ports: []corev1.ContainerPort{{Name: "stretch-sidecar", ContainerPort: 8090, Protocol: corev1.ProtocolTCP}},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("20m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "etcd-ca", MountPath: "/var/etcd/ssl/ca", ReadOnly: true},
			{Name: "etcd-client-tls", MountPath: "/var/etcd/ssl/client", ReadOnly: true},
			{Name: "backup-restore-server-tls", MountPath: "/var/etcdbr/ssl/server", ReadOnly: true},
			{Name: "backup-restore-ca", MountPath: "/var/etcdbr/ssl/ca", ReadOnly: true},
			{Name: "etcd-config-file", MountPath: "/var/etcd/config", ReadOnly: true},
			{Name: "etcd-main", MountPath: "/var/etcd/data"},
		},
		LivenessProbe: &corev1.Probe{
			ProbeHandler:   corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8090), Scheme: corev1.URISchemeHTTPS}},
			TimeoutSeconds: 1, PeriodSeconds: 10, SuccessThreshold: 1, FailureThreshold: 3,
		},
		// Pod Security's restricted profile, written out.
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		TerminationMessagePath:   "/dev/termination-log",
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
}

// plainSidecar is the sidecar expected in plainEtcd's pods in namespace ns:
// plaintext towards etcd and plain HTTP served, as backup-restore runs
// without TLS.
func plainSidecar(ns string) corev1.Container {
	c := tlsSidecar(ns)
	c.Args = []string{
		"sidecar",
		"--listen-address=:8090",
		"--insecure-transport=true",
		"--endpoints=http://etcd-events-local:2379,http://etcd-events-client:2379",
		"--insecure-http",
		"--etcd-config=/var/etcd/config/etcd.conf.yaml",
		"--member-name=$(POD_NAME)",
		"--member-peer-urls=http://$(POD_NAME).etcd-events-peer." + ns + ".svc:2380",
		"--member-client-urls=http://$(POD_NAME).etcd-events-peer." + ns + ".svc:2379",
	}
	c.VolumeMounts = []corev1.VolumeMount{
		{Name: "etcd-config-file", MountPath: "/var/etcd/config", ReadOnly: true},
		{Name: "etcd-events", MountPath: "/var/etcd/data"},
	}
	c.LivenessProbe.HTTPGet.Scheme = corev1.URISchemeHTTP
	return c
}

// withWindow is spec put on the pod window [start, start+replicas) with
// sidecar appended and the member started through it: what the webhook is
// expected to store. etcd-wrapper asks the sidecar (etcd-name-local:8090)
// instead of backup-restore, and backup-restore reads the configuration
// the init container writes.
func withWindow(spec appsv1.StatefulSetSpec, start, replicas int32, sidecar corev1.Container) appsv1.StatefulSetSpec {
	out := *spec.DeepCopy()
	// druid's ConfigMap checksum would roll the pods at every replicas
	// change of a move.
	delete(out.Template.Annotations, "checksum/etcd-configmap")
	out.Replicas = ptr.To(replicas)
	out.Ordinals = nil
	if start != 0 {
		out.Ordinals = &appsv1.StatefulSetOrdinals{Start: start}
	}
	pod := &out.Template.Spec
	etcdName := pod.HostAliases[0].Hostnames[0] // <etcd>-local
	pod.Containers[0].Args[1] = "--backup-restore-host-port=" + etcdName + ":8090"
	pod.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 6}}}
	br := &pod.Containers[1]
	br.Env = append(br.Env, corev1.EnvVar{Name: "ETCD_CONF", Value: "/var/druid-stretch/backup-restore/etcd.conf.yaml"})
	br.VolumeMounts = append(br.VolumeMounts, corev1.VolumeMount{Name: "druid-stretch-backup-restore-config", MountPath: "/var/druid-stretch/backup-restore", ReadOnly: true})
	pod.Containers = append(pod.Containers, sidecar)
	var memberFlags []string
	for _, a := range sidecar.Args {
		if strings.HasPrefix(a, "--member-") {
			memberFlags = append(memberFlags, a)
		}
	}
	pod.InitContainers = append(pod.InitContainers, corev1.Container{
		Name:            "druid-stretch-backup-restore-config",
		Image:           sidecar.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Args: append([]string{"backup-restore-config", "--etcd-config=/var/etcd/config/etcd.conf.yaml",
			"--output=/var/druid-stretch/backup-restore/etcd.conf.yaml"}, memberFlags...),
		Env: []corev1.EnvVar{podNameEnv},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "etcd-config-file", MountPath: "/var/etcd/config", ReadOnly: true},
			{Name: "druid-stretch-backup-restore-config", MountPath: "/var/druid-stretch/backup-restore"},
		},
		SecurityContext:          sidecar.SecurityContext,
		TerminationMessagePath:   "/dev/termination-log",
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	})
	pod.Volumes = append(pod.Volumes, corev1.Volume{Name: "druid-stretch-backup-restore-config", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	return out
}

// The same StatefulSet comes of an Etcd whether druid-stretch's fields are
// in its EtcdMembership (druid's own Etcd CRD, as on a seed) or inline in
// the Etcd (the extended Etcd CRD of earlier releases, until an upgrade has
// the controller copy them into the EtcdMembership).
func TestStatefulSetOfExtendedEtcd(t *testing.T) {
	for _, form := range []struct {
		name   string
		server func(t *testing.T) client.Client
		create func(ctx context.Context, c client.Client, e *v1alpha1.Etcd) error
	}{
		{"EtcdMembership", func(*testing.T) client.Client { return k8s }, etcdview.Create},
		{"inline under the extended Etcd CRD", extended.client, func(ctx context.Context, c client.Client, e *v1alpha1.Etcd) error {
			return c.Create(ctx, e)
		}},
	} {
		for _, tc := range []struct {
			name      string
			etcd      func(ns string) *v1alpha1.Etcd
			wantStart int32
			sidecar   func(ns string) corev1.Container
		}{
			{
				name: "ordinal start with druid's TLS",
				etcd: func(ns string) *v1alpha1.Etcd {
					e := etcdWithTLS(ns)
					e.Spec.OrdinalStart = ptr.To[int32](3)
					return e
				},
				wantStart: 3,
				sidecar:   tlsSidecar,
			},
			{
				name: "external members without TLS, ordinal start unset",
				etcd: func(ns string) *v1alpha1.Etcd {
					e := plainEtcd(ns)
					e.Spec.ExternalMembers = []v1alpha1.ExternalMember{{Name: "seed-a-etcd-events-0", PeerURLs: []string{"http://etcd-events-0.seed-a.example:2380"}}}
					return e
				},
				wantStart: 0,
				sidecar:   plainSidecar,
			},
		} {
			t.Run(form.name+"/"+tc.name, func(t *testing.T) {
				g := NewWithT(t)
				c := form.server(t)
				e := tc.etcd(namespaceIn(t, c))
				g.Expect(form.create(t.Context(), c, e)).To(Succeed())
				before := webhookRequests(t, webhook.StatefulSetMutatorPath)
				stored, twin := createBothIn(t, c, druidStatefulSet(e))
				g.Expect(webhookRequests(t, webhook.StatefulSetMutatorPath)).To(Equal(before+1), "the webhook admitted the StatefulSet, not its twin")

				expectSpec(t, stored.Spec, withWindow(twin.Spec, tc.wantStart, 3, tc.sidecar(e.Namespace)))
				g.Expect(webhook.StartsThroughSidecar(stored)).To(BeTrue(), "its pods start their members once admitted")
				g.Expect(webhook.StartsThroughSidecar(twin)).To(BeFalse(), "druid's own pods start theirs on their own")

				// druid applies its own StatefulSet again (it rebuilds it on every
				// reconcile): the stored object does not change, not even its
				// resourceVersion.
				again := druidStatefulSet(e)
				again.ResourceVersion = stored.ResourceVersion
				g.Expect(c.Update(t.Context(), again)).To(Succeed())
				g.Expect(again.ResourceVersion).To(Equal(stored.ResourceVersion), "re-admitting druid's StatefulSet was a no-op")
				// And an update of the already mutated object keeps one sidecar.
				stored.Labels["touched"] = "yes"
				g.Expect(c.Update(t.Context(), stored)).To(Succeed())
				expectSpec(t, stored.Spec, withWindow(twin.Spec, tc.wantStart, 3, tc.sidecar(e.Namespace)))
				g.Expect(webhookRequests(t, webhook.StatefulSetMutatorPath)).To(Equal(before + 3))
			})
		}
	}
}

func TestStatefulSetFollowsThePodWindow(t *testing.T) {
	g := NewWithT(t)
	e := etcdWithTLS(newNamespace(t))
	e.Spec.OrdinalStart = ptr.To[int32](3)
	e = createEtcd(t, e)
	stored, twin := createBoth(t, druidStatefulSet(e))
	g.Expect(stored.Annotations).To(HaveKeyWithValue(webhook.PodWindowAnnotation, "[3, 6)"))

	// observe records members as the membership controller does.
	observe := func(names ...string) {
		t.Helper()
		st := &v1alpha1.MembershipStatus{Phase: v1alpha1.MembershipPhaseReconfiguring}
		for i, n := range names {
			st.Members = append(st.Members, v1alpha1.ObservedMember{ID: string(rune('a' + i)), Name: n, Role: v1alpha1.MemberRoleVoter})
		}
		setMembershipStatus(t, e, st)
	}
	get := func() *appsv1.StatefulSet {
		sts := &appsv1.StatefulSet{}
		g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(e), sts)).To(Succeed())
		return sts
	}

	// A move from 0-2 to 3-5 half done: members 1 and 2 are still voters,
	// so their pods stay although the range says 3-5. druid applies its
	// StatefulSet (as on every spec change) and the webhook widens it.
	observe("seed-b-etcd-main-1", "seed-b-etcd-main-2", "seed-b-etcd-main-3", "seed-b-etcd-main-4")
	again := druidStatefulSet(e)
	again.ResourceVersion = get().ResourceVersion
	g.Expect(k8s.Update(t.Context(), again)).To(Succeed())
	expectSpec(t, again.Spec, withWindow(twin.Spec, 1, 5, tlsSidecar(e.Namespace)))
	g.Expect(again.Annotations).To(HaveKeyWithValue(webhook.PodWindowAnnotation, "[1, 6)"))
	changed, err := webhook.SyncPodWindow(t.Context(), k8s, e, members.PodWindow(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changed).To(BeFalse(), "the window is in place")
	g.Expect(get().ResourceVersion).To(Equal(again.ResourceVersion))

	// Member 1 removed: its pod may go, member 2's stays. druid does not
	// write the StatefulSet on a status change; SyncPodWindow has it
	// admitted again.
	observe("seed-b-etcd-main-2", "seed-b-etcd-main-3", "seed-b-etcd-main-4", "seed-b-etcd-main-5")
	changed, err = webhook.SyncPodWindow(t.Context(), k8s, e, members.PodWindow(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changed).To(BeTrue())
	sts := get()
	expectSpec(t, sts.Spec, withWindow(twin.Spec, 2, 4, tlsSidecar(e.Namespace)))
	g.Expect(sts.Annotations).To(HaveKeyWithValue(webhook.PodWindowAnnotation, "[2, 6)"))

	// The move is done: the range alone.
	observe("seed-b-etcd-main-3", "seed-b-etcd-main-4", "seed-b-etcd-main-5", "seed-a-etcd-main-0")
	changed, err = webhook.SyncPodWindow(t.Context(), k8s, e, members.PodWindow(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changed).To(BeTrue())
	expectSpec(t, get().Spec, withWindow(twin.Spec, 3, 3, tlsSidecar(e.Namespace)))

	// Not the Etcd's StatefulSet (another Etcd of the same name's UID): left alone.
	other := e.DeepCopy()
	other.UID = "8a1a4d58-3c55-4bf8-9d0c-2e6f1d1b7f00"
	other.Status.Membership = nil
	other.Spec.OrdinalStart = ptr.To[int32](9)
	changed, err = webhook.SyncPodWindow(t.Context(), k8s, other, members.PodWindow(other))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changed).To(BeFalse())
}

// TestDroppedStatusStopsNoPod: status.membership can go while a move runs
// (the EtcdMembership recreated, by hand or by a writer that knows only its
// spec, starts without one; under the extended Etcd CRD druid's compaction
// controller replaced the Etcd's whole status), and druid writes its
// StatefulSet on every spec change. A write admitted after such a drop
// keeps every pod the StatefulSet runs: the pods of the old ordinals still
// hold voters. Only the window the membership controller derives from
// etcd's member list (SyncPodWindow) stops them.
func TestDroppedStatusStopsNoPod(t *testing.T) {
	g := NewWithT(t)
	e := etcdWithTLS(newNamespace(t))
	e.Spec.OrdinalStart = ptr.To[int32](0) // opted in, on druid's ordinals
	e = createEtcd(t, e)
	_, twin := createBoth(t, druidStatefulSet(e))
	get := func() *appsv1.StatefulSet {
		sts := &appsv1.StatefulSet{}
		g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(e), sts)).To(Succeed())
		return sts
	}
	apply := func() *appsv1.StatefulSet { // as druid does on a spec change
		again := druidStatefulSet(e)
		again.ResourceVersion = get().ResourceVersion
		g.Expect(k8s.Update(t.Context(), again)).To(Succeed())
		return get()
	}

	// A move from 0-2 to 3-5 begins: the status lists the voters 0-2.
	st := &v1alpha1.MembershipStatus{}
	for _, n := range []string{"seed-b-etcd-main-0", "seed-b-etcd-main-1", "seed-b-etcd-main-2"} {
		st.Members = append(st.Members, v1alpha1.ObservedMember{ID: n, Name: n, Role: v1alpha1.MemberRoleVoter, Origin: v1alpha1.MemberOriginLocal})
	}
	setMembershipStatus(t, e, st)
	e = changeEtcd(t, e, func(v *v1alpha1.Etcd) { v.Spec.OrdinalStart = ptr.To[int32](3) })
	expectSpec(t, apply().Spec, withWindow(twin.Spec, 0, 6, tlsSidecar(e.Namespace)))

	// The status goes; druid applies its StatefulSet again. The status
	// alone would say [3, 6).
	setMembershipStatus(t, e, nil)
	g.Expect(members.PodWindow(e)).To(Equal(members.Ordinals{Start: 3, End: 6}))
	sts := apply()
	expectSpec(t, sts.Spec, withWindow(twin.Spec, 0, 6, tlsSidecar(e.Namespace)))
	g.Expect(sts.Annotations).To(HaveKeyWithValue(webhook.PodWindowAnnotation, "[0, 6)"))

	// The controller saw members 0 and 1 removed: the window it derived
	// from etcd's member list lets their pods go, and a later druid write
	// keeps that window.
	changed, err := webhook.SyncPodWindow(t.Context(), k8s, e, members.Ordinals{Start: 2, End: 6})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(changed).To(BeTrue())
	expectSpec(t, get().Spec, withWindow(twin.Spec, 2, 4, tlsSidecar(e.Namespace)))
	expectSpec(t, apply().Spec, withWindow(twin.Spec, 2, 4, tlsSidecar(e.Namespace)))

	// A hand-written annotation that is no window changes nothing.
	before := get()
	bad := before.DeepCopy()
	bad.Annotations[webhook.PodWindowAnnotation] = "[0, x)"
	g.Expect(k8s.Update(t.Context(), bad)).To(Succeed())
	expectSpec(t, get().Spec, before.Spec)
}

// TestLostExtensionFieldsKeepTheStatefulSet: druid-stretch's fields are
// gone from an Etcd whose pods run its sidecar on its pod window (its
// EtcdMembership was deleted on purpose, which admission otherwise
// refuses; under the extended Etcd CRD, druid's own CRD coming back pruned
// them). druid's next write of the
// StatefulSet is refused with a message that names the cause, and the
// stored StatefulSet is unchanged: no pod restarts without its sidecar, no
// pod outside druid's ordinals stops.
// NamespaceMayOptIn: a namespace opts in an Etcd without fields only where
// that changes nothing that runs.
func TestNamespaceMayOptIn(t *testing.T) {
	e := &v1alpha1.Etcd{}
	e.Spec.Replicas = 3
	onWindow := func(w string) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{webhook.PodWindowAnnotation: w}}}
	}
	for _, tc := range []struct {
		name string
		sts  *appsv1.StatefulSet
		want bool
	}{
		{"no StatefulSet yet", nil, true},
		{"druid's StatefulSet, never on a pod window", &appsv1.StatefulSet{}, true},
		{"on druid's own ordinals", onWindow("[0, 3)"), true},
		{"moved to other ordinals", onWindow("[3, 6)"), false},
		{"in the middle of a move", onWindow("[0, 4)"), false},
		{"replicas changed since", onWindow("[0, 2)"), false},
		{"a window that does not parse", onWindow("0-3"), false},
	} {
		if got := webhook.NamespaceMayOptIn(tc.sts, e); got != tc.want {
			t.Errorf("%s: NamespaceMayOptIn = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestLostExtensionFieldsKeepTheStatefulSet(t *testing.T) {
	// In a namespace whose Etcds the webhook manages without an
	// EtcdMembership alike: fields lost from an Etcd druid-stretch managed
	// are lost state, not a new Etcd to put on ordinals from 0.
	for _, tc := range []struct {
		name      string
		namespace func(*testing.T) string
	}{{"a namespace of its own", newNamespace}, {"a managed namespace", managedNamespace}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := etcdWithTLS(tc.namespace(t))
			e.Spec.OrdinalStart = ptr.To[int32](3)
			e = createEtcd(t, e)
			createBoth(t, druidStatefulSet(e))
			before := &appsv1.StatefulSet{}
			g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(e), before)).To(Succeed())

			e = dropFieldsOnPurpose(t, e)
			again := druidStatefulSet(e)
			again.ResourceVersion = before.ResourceVersion
			err := k8s.Update(t.Context(), again)
			g.Expect(err).To(MatchError(And(
				ContainSubstring("nor an EtcdMembership of its name carries druid-stretch's fields"),
				ContainSubstring("pod window [3, 6)"),
				ContainSubstring(webhook.PodWindowAnnotation))))
			after := &appsv1.StatefulSet{}
			g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(e), after)).To(Succeed())
			g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "nothing was written")
			expectSpec(t, after.Spec, before.Spec)
			if tc.name == "a managed namespace" {
				return // its Etcds are druid-stretch's: there is no handing back
			}

			// Handing the StatefulSet back to druid on purpose: the
			// annotation removed by hand (a change of metadata only),
			// druid's write goes through and puts the pods on druid's
			// ordinals without the sidecar.
			delete(after.Annotations, webhook.PodWindowAnnotation)
			g.Expect(k8s.Update(t.Context(), after)).To(Succeed())
			again = druidStatefulSet(e)
			again.ResourceVersion = after.ResourceVersion
			g.Expect(k8s.Update(t.Context(), again)).To(Succeed())
			g.Expect(again.Spec.Ordinals).To(BeNil())
			g.Expect(again.Spec.Template.Spec.Containers).To(HaveLen(len(druidStatefulSet(e).Spec.Template.Spec.Containers)), "no sidecar")
		})
	}
}

func TestStatefulSetsTheWebhookLeavesAlone(t *testing.T) {
	ns := newNamespace(t)
	otherOwner := druidStatefulSet(plainEtcd(ns))
	otherOwner.Name = "unowned"
	otherOwner.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "0c4a2b4e-1d3f-4f7a-9a51-5d2b7f0f4c11"}}

	goneOwner := druidStatefulSet(plainEtcd(ns))
	goneOwner.Name = "owner-gone"
	goneOwner.OwnerReferences[0].Name = "no-such-etcd"
	goneOwner.OwnerReferences[0].UID = "6f1f2c1e-8e9b-4d55-a7f0-3b8e2c6d9a10"

	for _, tc := range []struct {
		name string
		sts  func() *appsv1.StatefulSet
	}{
		{"owned by an Etcd without extension fields", func() *appsv1.StatefulSet {
			return druidStatefulSet(createEtcd(t, etcdWithTLS(ns)))
		}},
		{"owned by an Etcd whose EtcdMembership sets no field", func() *appsv1.StatefulSet {
			e := etcdWithTLS(ns)
			e.Name = "etcd-empty-membership"
			NewWithT(t).Expect(k8s.Create(t.Context(), stretchv1alpha1.For(e, v1alpha1.MembershipSpec{}))).To(Succeed())
			return druidStatefulSet(createEtcd(t, e))
		}},
		{"owned by something else", func() *appsv1.StatefulSet { return otherOwner }},
		{"owner Etcd gone", func() *appsv1.StatefulSet { return goneOwner }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			before := webhookRequests(t, webhook.StatefulSetMutatorPath)
			stored, twin := createBoth(t, tc.sts())
			g.Expect(webhookRequests(t, webhook.StatefulSetMutatorPath)).To(Equal(before+1), "the webhook was asked")
			expectSpec(t, stored.Spec, twin.Spec)
			g.Expect(webhook.StartsThroughSidecar(stored)).To(BeFalse())
			g.Expect(stored.Annotations).NotTo(HaveKey(webhook.PodWindowAnnotation))
			g.Expect(stored.Spec.Template.Spec.Containers).To(HaveLen(2))
			g.Expect(stored.Spec.Ordinals).To(BeNil())
		})
	}
}

// TestEtcdOfAManagedNamespaceGetsTheSidecar: in a namespace the webhook's
// ManagedNamespaces selector matches, an Etcd with no EtcdMembership (as
// gardenlet creates one) gets the sidecar in its first StatefulSet, on
// druid's own ordinals. The webhook writes nothing else: the EtcdMembership
// is the controller's to create. In the other namespaces such an Etcd
// stays druid's alone (TestStatefulSetsTheWebhookLeavesAlone, run with the
// same selector).
func TestEtcdOfAManagedNamespaceGetsTheSidecar(t *testing.T) {
	g := NewWithT(t)
	e := createEtcd(t, etcdWithTLS(managedNamespace(t)))
	stored, twin := createBoth(t, druidStatefulSet(e))
	expectSpec(t, stored.Spec, withWindow(twin.Spec, 0, 3, tlsSidecar(e.Namespace)))
	err := k8s.Get(t.Context(), client.ObjectKeyFromObject(e), &stretchv1alpha1.EtcdMembership{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the webhook created no EtcdMembership: %v", err)
}

func TestSidecarPortClashIsRefused(t *testing.T) {
	g := NewWithT(t)
	e := etcdWithTLS(newNamespace(t))
	e.Spec.OrdinalStart = ptr.To[int32](3)
	e.Spec.Backup.Port = ptr.To[int32](8090) // backup-restore on the sidecar's port
	e = createEtcd(t, e)

	sts := druidStatefulSet(e)
	err := k8s.Create(t.Context(), sts)
	g.Expect(err).To(HaveOccurred())
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a webhook denial: %v", err)
	g.Expect(err.Error()).To(And(ContainSubstring("8090"), ContainSubstring("--sidecar-port"), ContainSubstring("backup-restore")))
	err = k8s.Get(t.Context(), client.ObjectKeyFromObject(sts), &appsv1.StatefulSet{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "nothing stored: %v", err)
}

// TestGEP39DestinationKeepsItsTemplateWhenTheBootstrapGoes: a GEP-39
// destination, opted in by druid's own bootstrapWithExistingCluster alone,
// gets the sidecar; backup-restore reaches the cluster through the Etcd's
// own client Service only (druid appends the source's client endpoints),
// so gardenlet unsetting the field changes no pod template and restarts no
// destination pod while the source's members are being removed.
func TestGEP39DestinationKeepsItsTemplateWhenTheBootstrapGoes(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	e := etcdWithTLS(ns)
	e.Name = "etcd-gep39"
	src := []druidv1alpha1.BootstrapExistingMember{
		{Name: "etcd-main-0", PeerURLs: []string{"https://etcd-main-0.seed-a.example:2380"}},
		{Name: "etcd-main-1", PeerURLs: []string{"https://etcd-main-1.seed-a.example:2380"}},
		{Name: "etcd-main-2", PeerURLs: []string{"https://etcd-main-2.seed-a.example:2380"}},
	}
	e.Spec.Etcd.BootstrapWithExistingCluster = &druidv1alpha1.BootstrapWithExistingCluster{Members: src, ClientEndpoints: []string{"https://etcd-main-client.seed-a.example:2379"}}
	createEtcd(t, e)
	own := "--service-endpoints=https://etcd-gep39-client:2379"
	druids := func(bootstrap bool) *appsv1.StatefulSet {
		sts := druidStatefulSet(e)
		flag := own
		if bootstrap {
			flag += ",https://etcd-main-client.seed-a.example:2379"
		}
		br := &sts.Spec.Template.Spec.Containers[1]
		br.Args = append(br.Args, flag)
		return sts
	}
	g.Expect(k8s.Create(t.Context(), druids(true))).To(Succeed())
	before := &appsv1.StatefulSet{}
	g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(e), before)).To(Succeed())
	g.Expect(before.Spec.Template.Spec.Containers).To(ContainElement(HaveField("Name", webhook.SidecarContainerName)), "druid's own fields opt it in")
	g.Expect(before.Spec.Template.Spec.Containers[1].Args).To(ContainElement(own))
	g.Expect(before.Spec.Template.Spec.Containers[1].Args).NotTo(ContainElement(ContainSubstring("seed-a")), "backup-restore does not reach the source")

	// druid records the join, gardenlet unsets the field, druid writes its
	// StatefulSet again.
	stored := &v1alpha1.Etcd{}
	g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(e), stored)).To(Succeed())
	stored.Status.BootstrapWithExistingCluster = &druidv1alpha1.BootstrapWithExistingClusterStatus{JoinedAt: metav1.Now()}
	for _, m := range src {
		stored.Status.BootstrapWithExistingCluster.Members = append(stored.Status.BootstrapWithExistingCluster.Members, druidv1alpha1.BootstrapJoinedMember(m))
	}
	g.Expect(k8s.Status().Update(t.Context(), stored)).To(Succeed())
	changeEtcd(t, e, func(x *v1alpha1.Etcd) { x.Spec.Etcd.BootstrapWithExistingCluster = nil })
	again := druids(false)
	again.ResourceVersion = before.ResourceVersion
	g.Expect(k8s.Update(t.Context(), again)).To(Succeed())
	after := &appsv1.StatefulSet{}
	g.Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(e), after)).To(Succeed())
	expectSpec(t, after.Spec, before.Spec)
	g.Expect(after.Generation).To(Equal(before.Generation), "no rollout")
	m, err := etcdview.GetMembership(t.Context(), k8s, client.ObjectKeyFromObject(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m).To(BeNil(), "nothing derived was written into an EtcdMembership")
}
