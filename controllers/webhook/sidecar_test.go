package webhook

import (
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

func backupTLSEtcd() *v1alpha1.Etcd {
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot"}}
	e.Spec.Replicas = 3
	e.Spec.Backup.TLS = &druidv1alpha1.TLSConfig{
		TLSCASecretRef:     druidv1alpha1.SecretReference{SecretReference: corev1.SecretReference{Name: "ca-etcdbr"}},
		ServerTLSSecretRef: corev1.SecretReference{Name: "etcdbr-server"},
		ClientTLSSecretRef: corev1.SecretReference{Name: "etcdbr-client"},
	}
	return e
}

// TestInjectSidecar covers what the envtest cases do not: the client CA of
// --sidecar-client-ca-secret-name, volumes druid did not declare, and
// druid's runtime-component annotation.
func TestInjectSidecar(t *testing.T) {
	opts := Options{SidecarImage: "img", SidecarPort: 8090, SidecarAllowedClients: []string{"druid-stretch-controller"}}
	g := NewWithT(t)
	g.Expect(opts.validate()).To(Succeed())

	t.Run("client CA Secret of its own", func(t *testing.T) {
		g := NewWithT(t)
		o := opts
		o.SidecarClientCASecretName = "druid-stretch-client-ca"
		pod := &corev1.PodSpec{}
		g.Expect(injectSidecar(pod, backupTLSEtcd(), o)).To(Succeed())
		g.Expect(pod.Containers).To(HaveLen(1))
		g.Expect(pod.Containers[0].Args).To(ContainElement("--client-ca=/var/druid-stretch/ssl/client-ca/ca.crt"))
		g.Expect(pod.Volumes).To(ConsistOf(
			HaveField("Name", "backup-restore-server-tls"),
			And(HaveField("Name", "druid-stretch-client-ca"), HaveField("VolumeSource.Secret.SecretName", "druid-stretch-client-ca")),
		), "druid's backup-restore CA is not mounted then")
	})

	t.Run("volumes druid did not declare are added once", func(t *testing.T) {
		g := NewWithT(t)
		pod := &corev1.PodSpec{Volumes: []corev1.Volume{{Name: "backup-restore-ca", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "druids-own"}}}}}
		g.Expect(injectSidecar(pod, backupTLSEtcd(), opts)).To(Succeed())
		once := pod.DeepCopy()
		g.Expect(injectSidecar(pod, backupTLSEtcd(), opts)).To(Succeed())
		g.Expect(equality.Semantic.DeepEqual(pod, once)).To(BeTrue(), "a second injection changes nothing")
		g.Expect(pod.Volumes).To(HaveLen(2))
		g.Expect(pod.Volumes[0].Secret.SecretName).To(Equal("druids-own"), "druid's volume is left as druid declared it")
		g.Expect(pod.Volumes[1].Name).To(Equal("backup-restore-server-tls"))
		g.Expect(*pod.Volumes[1].Secret.DefaultMode).To(Equal(int32(0o640)))
	})

	t.Run("no client Service for externally managed members", func(t *testing.T) {
		g := NewWithT(t)
		e := backupTLSEtcd()
		e.Spec.Replicas = 1
		e.Spec.ExternallyManagedMemberAddresses = []string{"10.0.0.1"}
		e.Spec.Etcd.ClientPort = ptr.To[int32](12379)
		c, _ := sidecarContainer(e, opts)
		g.Expect(c.Args).To(ContainElement("--endpoints=http://etcd-main-local:12379"))
	})

	t.Run("a changed image replaces the sidecar in place", func(t *testing.T) {
		g := NewWithT(t)
		pod := &corev1.PodSpec{Containers: []corev1.Container{{Name: "etcd"}}}
		g.Expect(injectSidecar(pod, backupTLSEtcd(), opts)).To(Succeed())
		o := opts
		o.SidecarImage = "img:v2"
		g.Expect(injectSidecar(pod, backupTLSEtcd(), o)).To(Succeed())
		g.Expect(pod.Containers).To(HaveLen(2))
		g.Expect(pod.Containers[1].Image).To(Equal("img:v2"))
	})
}

func TestOptions(t *testing.T) {
	g := NewWithT(t)
	var o Options
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	o.AddFlags(fs)
	g.Expect(fs.Parse([]string{
		"--sidecar-image=registry.example/druid-stretch:v1",
		"--sidecar-image-pull-policy=Always",
		"--sidecar-client-ca-secret-name=stretch-ca",
		"--sidecar-resources-requests-cpu=20m",
		"--sidecar-resources-requests-memory=32Mi",
		"--sidecar-resources-limits-memory=128Mi",
	})).To(Succeed())
	g.Expect(o.validate()).To(Succeed())
	g.Expect(o.SidecarPort).To(Equal(DefaultSidecarPort))
	g.Expect(o.SidecarImagePullPolicy).To(Equal(corev1.PullAlways))
	g.Expect(o.SidecarResources.Requests.Cpu().Equal(resource.MustParse("20m"))).To(BeTrue())
	g.Expect(o.SidecarResources.Limits.Memory().Equal(resource.MustParse("128Mi"))).To(BeTrue())
	g.Expect(o.SidecarResources.Limits).NotTo(HaveKey(corev1.ResourceCPU))

	g.Expect(fs.Parse([]string{"--sidecar-resources-limits-cpu=lots"})).To(MatchError(ContainSubstring(`"lots" is not a Kubernetes quantity`)))

	for _, bad := range []struct {
		opts Options
		want string
	}{
		{Options{}, "--sidecar-image"},
		{Options{SidecarImage: "i", SidecarImagePullPolicy: "Sometimes"}, "--sidecar-image-pull-policy"},
		{Options{SidecarImage: "i", SidecarPort: 70000}, "--sidecar-port"},
		{Options{SidecarImage: "i", SidecarClientCASecretName: "Not_A_Name"}, "--sidecar-client-ca-secret-name"},
		{Options{SidecarImage: "i", SidecarResources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("-1")}}}, "is negative"},
	} {
		g.Expect(bad.opts.validate()).To(MatchError(ContainSubstring(bad.want)))
	}
}
