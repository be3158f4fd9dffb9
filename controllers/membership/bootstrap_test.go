package membership

import (
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

// TestNoBootstrapBesideAVolumeOfAnotherOrdinal: a status that druid's
// compaction controller dropped no longer says that the cluster existed.
// A volume that the StatefulSet made for an ordinal it no longer runs
// still does: no pod is admitted to start a new cluster while one exists.
func TestNoBootstrapBesideAVolumeOfAnotherOrdinal(t *testing.T) {
	g := NewWithT(t)
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot"}}
	e.Spec.Replicas, e.Spec.OrdinalStart = 3, ptr.To[int32](3)
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot"}}
	sts.Spec.Replicas, sts.Spec.Ordinals = ptr.To[int32](3), &appsv1.StatefulSetOrdinals{Start: 3}
	sts.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main"}}}
	pvc := func(name string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shoot"}}
	}
	volumes := []*corev1.PersistentVolumeClaim{pvc("etcd-main-etcd-main-3"), pvc("etcd-main-etcd-main-4"), pvc("other-etcd-main-0"), pvc("etcd-main-etcd-main-05")}
	build := func(extra ...*corev1.PersistentVolumeClaim) *Reconciler {
		b := fake.NewClientBuilder()
		for _, v := range append(volumes, extra...) {
			b = b.WithObjects(v)
		}
		return &Reconciler{reader: b.Build()}
	}

	r := build()
	vol, err := r.volumeOutside(t.Context(), sts, members.Ordinals{Start: 3, End: 6})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(vol).To(BeEmpty(), "volumes of the pods' own ordinals, another template's and a non-canonical ordinal do not count")

	r = build(pvc("etcd-main-etcd-main-0"))
	started, _, err := r.bootstrap(t.Context(), e, sts, nil)
	g.Expect(started).To(BeFalse())
	g.Expect(err).To(MatchError(And(ContainSubstring("not bootstrapping"), ContainSubstring("etcd-main-etcd-main-0"), ContainSubstring("[3, 6)"))))
}
