package etcdview_test

import (
	"context"
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// TestNamespaceOptIn: which pairs the selector opts in, and that Adopt
// writes the opt-in down, creating the EtcdMembership or filling in an
// empty one (which only held status), and leaves the Etcd as it was.
func TestNamespaceOptIn(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, stretchv1alpha1.AddToScheme} {
		NewWithT(t).Expect(add(scheme)).To(Succeed())
	}
	shoot := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shoot--p--s", Labels: map[string]string{"gardener.cloud/role": "shoot"}}}
	garden := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "garden"}}
	etcdIn := func(ns string) *v1alpha1.Etcd {
		return &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: ns, UID: "5b0c7f0e-4c1e-4d8e-9f0a-2a3b4c5d6e7f"}}
	}
	optIn, err := etcdview.ParseNamespaceOptIn("gardener.cloud/role=shoot")
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	opted := v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](0)}

	for _, tc := range []struct {
		name       string
		optIn      etcdview.NamespaceOptIn
		etcd       *v1alpha1.Etcd
		membership *stretchv1alpha1.EtcdMembership
		getErr     error
		wantErr    string
		wantSource stretchv1alpha1.SpecSource
		// wantStored is the EtcdMembership's spec after Adopt (nil: none).
		wantStored *v1alpha1.MembershipSpec
	}{
		{name: "a shoot namespace's Etcd", optIn: optIn, etcd: etcdIn(shoot.Name),
			wantSource: stretchv1alpha1.SpecFromNamespace, wantStored: &opted},
		{name: "one whose EtcdMembership holds only status", optIn: optIn, etcd: etcdIn(shoot.Name),
			membership: stretchv1alpha1.For(etcdIn(shoot.Name), v1alpha1.MembershipSpec{}),
			wantSource: stretchv1alpha1.SpecFromNamespace, wantStored: &opted},
		{name: "one that has a spec of its own", optIn: optIn, etcd: etcdIn(shoot.Name),
			membership: stretchv1alpha1.For(etcdIn(shoot.Name), v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](3)}),
			wantSource: stretchv1alpha1.SpecFromEtcdMembership, wantStored: &v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](3)}},
		{name: "another namespace's", optIn: optIn, etcd: etcdIn(garden.Name), wantSource: stretchv1alpha1.SpecNone},
		{name: "a namespace that is gone", optIn: optIn, etcd: etcdIn("gone"), wantSource: stretchv1alpha1.SpecNone},
		{name: "no selector", etcd: etcdIn(shoot.Name), wantSource: stretchv1alpha1.SpecNone},
		{name: "a namespace that cannot be read", optIn: optIn, etcd: etcdIn(shoot.Name), getErr: errors.New("the API server is away"),
			wantErr: `reading the labels of namespace shoot--p--s (Etcds of namespaces matching "gardener.cloud/role=shoot" are managed): the API server is away`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(shoot, garden, tc.etcd.DeepCopy())
			if tc.membership != nil {
				b = b.WithObjects(tc.membership.DeepCopy())
			}
			b = b.WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if _, ok := obj.(*corev1.Namespace); ok && tc.getErr != nil {
					return tc.getErr
				}
				return c.Get(ctx, key, obj, opts...)
			}})
			c := b.Build()
			p, err := etcdview.Get(ctx, c, client.ObjectKeyFromObject(tc.etcd))
			g.Expect(err).NotTo(HaveOccurred())
			err = tc.optIn.Apply(ctx, c, p)
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(tc.wantErr))
				g.Expect(p.Source).To(Equal(stretchv1alpha1.SpecNone), "nothing decided on a guess")
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Source).To(Equal(tc.wantSource))
			g.Expect(p.View.UsesExtension()).To(Equal(tc.wantSource != stretchv1alpha1.SpecNone))

			_, err = etcdview.Adopt(ctx, c, p)
			g.Expect(err).NotTo(HaveOccurred())
			stored, err := etcdview.GetMembership(ctx, c, client.ObjectKeyFromObject(tc.etcd))
			g.Expect(err).NotTo(HaveOccurred())
			if tc.wantStored == nil {
				g.Expect(stored).To(BeNil())
			} else {
				g.Expect(stored).NotTo(BeNil())
				g.Expect(stored.Spec.MembershipSpec).To(Equal(*tc.wantStored))
				again, err := etcdview.Get(ctx, c, client.ObjectKeyFromObject(tc.etcd))
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(again.Source).To(Equal(stretchv1alpha1.SpecFromEtcdMembership), "managed without the selector from now on")
			}
			etcd := &v1alpha1.Etcd{}
			g.Expect(c.Get(ctx, client.ObjectKeyFromObject(tc.etcd), etcd)).To(Succeed())
			g.Expect(etcd.Spec).To(Equal(tc.etcd.Spec), "the Etcd is not written")
		})
	}
}

func TestNamespaceOptInFlag(t *testing.T) {
	g := NewWithT(t)
	var o etcdview.NamespaceOptIn
	g.Expect(o.Set("gardener.cloud/role=shoot")).To(Succeed())
	g.Expect(o.Enabled()).To(BeTrue())
	g.Expect(o.String()).To(Equal("gardener.cloud/role=shoot"))
	g.Expect(o.Set("")).To(Succeed())
	g.Expect(o.Enabled()).To(BeFalse(), "empty opts in nothing, not every namespace")
	g.Expect(o.Set("role in (shoot")).To(MatchError(ContainSubstring(`namespace selector "role in (shoot"`)))
}
