package membership

import (
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/peerurls"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestSamePlanFromEitherPeerURLShape builds one destination of a move
// twice: its three members' load-balancer peer URLs once in druid v0.38.1's
// spec.etcd.additionalAdvertisePeerURLs, once in druid#1438's
// spec.etcd.additionalAdvertisedURLs (read from the Etcd's JSON, since the
// pinned druid API has no Go type for it). The controller's desired
// members and the planner's steps through the first member's join are the
// same, with and without a memberNamePrefix. A reader that loses #1438's
// field plans otherwise, so the comparison can fail.
func TestSamePlanFromEitherPeerURLShape(t *testing.T) {
	for _, prefix := range []*string{nil, ptr.To("seed-b")} {
		t.Run("memberNamePrefix "+ptr.Deref(prefix, "unset"), func(t *testing.T) {
			g := NewWithT(t)
			old, next := destination(prefix), destination(prefix)
			var entries []peerurls.MemberURLs
			for o := range int64(3) {
				name := members.MemberName(old, o)
				old.Spec.Etcd.AdditionalAdvertisePeerURLs = append(old.Spec.Etcd.AdditionalAdvertisePeerURLs,
					druidv1alpha1.MemberPeerURLs{MemberName: name, URLs: loadBalancer(o)})
				entries = append(entries, peerurls.MemberURLs{Name: name, URLs: loadBalancer(o)})
			}
			stored := storedWithPR1438(t, next, false, entries)

			fromV0381 := planJoin(t, DNSResolver{}, old)
			fromPR1438 := planJoin(t, DNSResolver{EtcdJSON: func(*v1alpha1.Etcd) ([]byte, error) { return stored, nil }}, next)
			g.Expect(fromPR1438).To(Equal(fromV0381))
			g.Expect(fromV0381.steps[0].Kind).To(Equal(planner.AddLearner))
			g.Expect(fromV0381.steps[0].PeerURLs).To(Equal(append([]string{members.InClusterPeerURL(old, "etcd-main-0")}, loadBalancer(0)...)),
				"the member is added with druid's in-cluster URL and its load balancer's")

			lost := planJoin(t, DNSResolver{EtcdJSON: func(e *v1alpha1.Etcd) ([]byte, error) { return json.Marshal(e) }}, next)
			g.Expect(lost).NotTo(Equal(fromV0381), "the Etcd's Go type drops druid#1438's field: read from it, the load balancers' URLs are lost")

			// overrideDefaultURL, which v0.38.1 cannot say: the members are
			// added with their load balancers' URLs only.
			stored = storedWithPR1438(t, next, true, entries)
			override := planJoin(t, DNSResolver{EtcdJSON: func(*v1alpha1.Etcd) ([]byte, error) { return stored, nil }}, next)
			for i, w := range override.add {
				g.Expect(w.PeerURLs).To(Equal(loadBalancer(int64(i))))
			}
			g.Expect(override.steps[0].PeerURLs).To(Equal(loadBalancer(0)))
		})
	}
}

// destination is the Etcd of a live move's destination: three members of
// its own, the source's three listed as external, to be retired.
func destination(prefix *string) *v1alpha1.Etcd {
	e := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot--p--s"}}
	e.Spec.Replicas = 3
	e.Spec.MemberNamePrefix = prefix
	e.Spec.Etcd.PeerUrlTLS = &druidv1alpha1.PeerTLSConfig{}
	e.Spec.ExternalMembersPolicy = ptr.To(v1alpha1.ExternalMembersPolicyRetire)
	for o := range 3 {
		i := strconv.Itoa(o)
		e.Spec.ExternalMembers = append(e.Spec.ExternalMembers, v1alpha1.ExternalMember{
			Name: "seed-a-etcd-main-" + i, PeerURLs: []string{"https://etcd-main-" + i + ".seed-a.example:2380"}})
	}
	return e
}

func loadBalancer(ordinal int64) []string {
	return []string{"https://etcd-main-" + strconv.FormatInt(ordinal, 10) + ".seed-b.example:2380"}
}

// storedWithPR1438 is e's JSON with druid#1438's field set, as an Etcd
// stored under a druid CRD that has it reads. The keys are spelled out, not
// taken from package peerurls' mirror types, so that a mirror that strays
// from druid#1438's shape fails the test.
func storedWithPR1438(t *testing.T, e *v1alpha1.Etcd, override bool, entries []peerurls.MemberURLs) []byte {
	t.Helper()
	g := NewWithT(t)
	raw, err := json.Marshal(e)
	g.Expect(err).NotTo(HaveOccurred())
	var obj map[string]any
	g.Expect(json.Unmarshal(raw, &obj)).To(Succeed())
	members := []any{}
	for _, m := range entries {
		members = append(members, map[string]any{"name": m.Name, "urls": m.URLs})
	}
	obj["spec"].(map[string]any)["etcd"].(map[string]any)["additionalAdvertisedURLs"] = map[string]any{
		"peerURLs": map[string]any{"overrideDefaultURL": override, "members": members}}
	out, err := json.Marshal(obj)
	g.Expect(err).NotTo(HaveOccurred())
	return out
}

// joinPlan is what the controller decided along the first member's join:
// the desired members, then the planner's step at each observation.
type joinPlan struct {
	add, learners []planner.Want
	keep, remove  []string
	steps         []planner.Step
}

// planJoin runs the controller's desired-member computation (target) and
// the planner over three observations: the source's three voters; the
// first step's learner added, not started; the learner started and caught
// up.
func planJoin(t *testing.T, resolver Resolver, e *v1alpha1.Etcd) joinPlan {
	t.Helper()
	g := NewWithT(t)
	r := &Reconciler{resolver: resolver}
	voters := []planner.Member{}
	for i, x := range e.Spec.ExternalMembers {
		voters = append(voters, planner.Member{ID: "a" + strconv.Itoa(i), Name: x.Name, PeerURLs: x.PeerURLs,
			Leader: i == 0, Healthy: true, CaughtUp: true, HealthyFor: time.Minute})
	}
	var out joinPlan
	observed := voters
	for round := range 3 {
		switch round {
		case 1:
			observed = slices.Concat(voters, []planner.Member{{ID: "b0", PeerURLs: out.steps[0].PeerURLs, Learner: true, Unstarted: true, NoProgressFor: time.Second}})
		case 2:
			observed = slices.Concat(voters, []planner.Member{{ID: "b0", Name: out.steps[0].Member, PeerURLs: out.steps[0].PeerURLs, Learner: true,
				Healthy: true, CaughtUp: true, HealthyFor: 10 * time.Second}})
		}
		obs := &sidecarcluster.Observation{List: &sidecar.MemberList{}}
		for _, m := range observed {
			obs.List.Members = append(obs.List.Members, sidecar.Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, IsLearner: m.Learner, IsLeader: m.Leader, Healthy: m.Healthy})
		}
		tgt, err := r.target(e, members.LocalOrdinals(e), obs)
		g.Expect(err).NotTo(HaveOccurred())
		out.add, out.learners, out.keep, out.remove = tgt.Add, tgt.Learners, tgt.Keep, tgt.Remove
		in := planner.Observed{}
		for _, m := range observed {
			if m.Name != "" { // an unstarted learner's side is its Want's
				m.Side = tgt.Side(m.Name)
			}
			in.Members = append(in.Members, m)
		}
		step := planner.Next(in, planner.Desired{Add: tgt.Add, Learners: tgt.Learners, Keep: tgt.Keep, Remove: tgt.Remove}, planner.DefaultPolicy())
		out.steps = append(out.steps, step)
	}
	return out
}
