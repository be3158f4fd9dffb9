package webhook_test

import (
	"fmt"
	"strings"
	"testing"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/cli"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// trickyValues are values an operator may put into an annotation or field
// that ends up in a sidecar flag.
var trickyValues = []string{
	"seed-b-controller",
	`seed-b"controller`,
	`"seed-b-controller"`,
	"seed-a-controller,seed-b-controller",
	" seed-a-controller , seed-b-controller ",
	"seed-b=controller",
	"seed b controller",
	"münchen-controller",
	"",
	",",
	"seed-a-controller,,seed-b-controller",
	strings.Repeat("c", 253),
	strings.Repeat("c", 300),
	"seed-b\ncontroller",
	"seed-b\tcontroller",
	"seed-b\u00a0controller",
	"seed-b\u200bcontroller",
	"spiffe://cluster.local/ns/garden/sa/druid-stretch",
}

// The webhooks admit a value that flows into a sidecar's flag exactly when
// the sidecar's own flag parsing accepts it, and every pod template they
// admit parses as the sidecar's and its init container's command lines
// (a value the webhook let through that the sidecar refused would stop
// every member's sidecar at its start).
func TestAdmittedValuesParseAsSidecarFlags(t *testing.T) {
	ns := newNamespace(t)
	var n int
	// admitted creates the pair built by set and druid's StatefulSet of
	// it; it returns the stored StatefulSet, nil when a webhook or a CRD
	// refused either.
	admitted := func(t *testing.T, set func(*v1alpha1.Etcd)) *appsv1.StatefulSet {
		n++
		e := stretchedEtcd(ns)
		e.Name = fmt.Sprintf("etcd-flags-%d", n)
		set(e)
		if err := etcdview.Create(t.Context(), k8s, e); err != nil {
			return nil
		}
		sts := druidStatefulSet(e)
		if err := k8s.Create(t.Context(), sts); err != nil {
			return nil
		}
		stored := &appsv1.StatefulSet{}
		NewWithT(t).Expect(k8s.Get(t.Context(), client.ObjectKeyFromObject(sts), stored)).To(Succeed())
		return stored
	}
	// parses says whether the druid-stretch binary parses every container
	// it is the entrypoint of, with $(POD_NAME) expanded as the kubelet does.
	parses := func(g Gomega, sts *appsv1.StatefulSet) {
		pod := sts.Name + "-3"
		for _, c := range append(sts.Spec.Template.Spec.InitContainers, sts.Spec.Template.Spec.Containers...) {
			if c.Name != webhook.SidecarContainerName && c.Name != webhook.BackupRestoreConfigInitContainerName {
				continue
			}
			args := make([]string, len(c.Args))
			for i, a := range c.Args {
				args[i] = strings.ReplaceAll(a, "$(POD_NAME)", pod)
			}
			g.Expect(cli.ParseArgs(args)).To(Succeed(), "container %s: %q", c.Name, args)
		}
	}
	fields := []struct {
		name string
		// set puts value where the field lives.
		set func(e *v1alpha1.Etcd, value string)
		// flag is what the sidecar is given for value.
		flag func(e *v1alpha1.Etcd, value string) []string
	}{
		{
			name: "annotation " + v1alpha1.SidecarAllowedClientsAnnotation,
			set: func(e *v1alpha1.Etcd, v string) {
				e.Annotations = map[string]string{v1alpha1.SidecarAllowedClientsAnnotation: v}
			},
			flag: func(_ *v1alpha1.Etcd, v string) []string { return []string{"sidecar", "--allowed-client=" + v} },
		},
		{
			// druid's field, for a member of druid's own ordinals: druid's
			// CRD does not check the URL's form.
			name: "spec.etcd.additionalAdvertisePeerURLs[].urls[]",
			set: func(e *v1alpha1.Etcd, v string) {
				e.Spec.OrdinalStart = ptr.To[int32](0)
				e.Spec.Etcd.AdditionalAdvertisePeerURLs = []druidv1alpha1.MemberPeerURLs{{MemberName: memberOf(e, 1), URLs: []string{peerURL(v)}}}
			},
			flag: func(e *v1alpha1.Etcd, v string) []string {
				return []string{"sidecar", "--additional-peer-urls=" + memberOf(e, 1) + "=" + peerURL(v)}
			},
		},
	}
	for _, f := range fields {
		for _, v := range trickyValues {
			t.Run(fmt.Sprintf("%s %q", f.name, v), func(t *testing.T) {
				g := NewWithT(t)
				var e *v1alpha1.Etcd
				sts := admitted(t, func(x *v1alpha1.Etcd) { f.set(x, v); e = x })
				sidecarErr := cli.ParseArgs(f.flag(e, v))
				g.Expect(sts != nil).To(Equal(sidecarErr == nil), "the webhooks admit it exactly when the sidecar parses it (sidecar: %v)", sidecarErr)
				if sts != nil {
					parses(g, sts)
				}
			})
		}
	}
}

// memberOf is the member name of e's pod at ordinal o.
func memberOf(e *v1alpha1.Etcd, o int) string {
	return druidv1alpha1.GetMemberName(e.Spec.MemberNamePrefix, fmt.Sprintf("%s-%d", e.Name, o))
}

// peerURL makes a tricky value the host of an https:// peer URL.
func peerURL(v string) string { return "https://" + v + ".seed-b.example:2380" }
