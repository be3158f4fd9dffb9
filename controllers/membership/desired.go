package membership

import (
	"crypto/tls"
	"fmt"
	"slices"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/peerurls"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// Resolver tells where a local member of an Etcd is reached: its advertised
// peer URLs (what the controller adds it with) and the base URL of its
// sidecar. Production uses DNSResolver; tests and the demo the pod runner.
type Resolver interface {
	// PeerURLs are the advertised peer URLs of e's member memberName, which
	// runs in the pod podName.
	PeerURLs(e *v1alpha1.Etcd, memberName, podName string) ([]string, error)
	// SidecarURL is the base URL of that member's sidecar.
	SidecarURL(e *v1alpha1.Etcd, memberName, podName string) (string, error)
}

// DNSResolver follows druid's DNS conventions: a pod is
// <pod>.<etcd>-peer.<namespace>.svc behind druid's headless peer service.
type DNSResolver struct {
	// SidecarPort is the sidecar's port (default 8090).
	SidecarPort int32
	// SidecarScheme is https (the default) or http.
	SidecarScheme string
	// EtcdJSON, when set, gives an Etcd's JSON as stored, so that druid#1438's
	// spec.etcd.additionalAdvertisedURLs, which the Etcd's Go type drops, is
	// read too (peerurls.ReadJSON). Unset, the Go type's field is read,
	// druid v0.38.1's spec.etcd.additionalAdvertisePeerURLs.
	EtcdJSON func(e *v1alpha1.Etcd) ([]byte, error)
}

// PeerURLs are druid's: <scheme>://<pod>.<etcd>-peer.<namespace>.svc:<serverPort|2380>,
// https when peer TLS is on, and the member's additional peer URLs after it,
// or those alone where druid#1438's overrideDefaultURL says so. Additional
// peer URLs that package peerurls refuses are an error: a member added
// with URLs other than those it advertises would not start.
func (d DNSResolver) PeerURLs(e *v1alpha1.Etcd, memberName, podName string) ([]string, error) {
	advertised, err := d.advertised(e)
	if err != nil {
		return nil, err
	}
	return advertised.PeerURLs(e, memberName, podName), nil
}

// advertised reads e's additional peer URLs, from its stored JSON where
// EtcdJSON gives it.
func (d DNSResolver) advertised(e *v1alpha1.Etcd) (peerurls.Advertised, error) {
	var advertised peerurls.Advertised
	var errs field.ErrorList
	if d.EtcdJSON == nil {
		advertised, errs = peerurls.Read(e)
	} else {
		raw, err := d.EtcdJSON(e)
		if err != nil {
			return peerurls.Advertised{}, fmt.Errorf("reading Etcd %s/%s as stored: %w", e.Namespace, e.Name, err)
		}
		advertised, errs = peerurls.ReadJSON(e, raw)
	}
	if len(errs) > 0 {
		return peerurls.Advertised{}, fmt.Errorf("the additional peer URLs of Etcd %s/%s: %w", e.Namespace, e.Name, errs.ToAggregate())
	}
	return advertised, nil
}

// SidecarURL is https://<pod>.<etcd>-peer.<namespace>.svc:<SidecarPort>.
func (d DNSResolver) SidecarURL(e *v1alpha1.Etcd, _, podName string) (string, error) {
	port, scheme := d.SidecarPort, d.SidecarScheme
	if port == 0 {
		port = webhook.DefaultSidecarPort
	}
	if scheme == "" {
		scheme = "https"
	}
	return fmt.Sprintf("%s://%s.%s.%s.svc:%d", scheme, podName, druidv1alpha1.GetPeerServiceName(e.ObjectMeta), e.Namespace, port), nil
}

// Sides of the planner: the local members against the external ones, so
// that a move between two clusters passes through one tie only; and, in a
// move of the pod window (a new ordinalStart, members moved between groups
// of nodes), the members of the window against those of the old ordinals,
// so that such a move too passes through one tie, with leadership moved
// before it and the tie ended by the removal in the same sidecar call.
const (
	sideLocal     = "local"
	sideExternal  = "external"
	sideUnmanaged = "unmanaged"
	// sideLeaving holds e's own members whose ordinals are outside its pod
	// window: local by origin, departing by plan.
	sideLeaving = "leaving"
)

// reach is how the controller reaches the cluster of one Etcd before it has
// observed it: the sidecars of the pods that may run (members.KeptWindow:
// those the StatefulSet runs, whatever the status says) and of the external
// members, ordered by what status.membership last saw; t is their client
// TLS (r.sidecarTLS).
func (r *Reconciler) reach(e *v1alpha1.Etcd, running members.Ordinals, t *tls.Config) ([]sidecarcluster.Endpoint, sidecarcluster.Hint, error) {
	var eps []sidecarcluster.Endpoint
	w := members.KeptWindow(e, running)
	for o := w.Start; o < w.End; o++ {
		name, pod := members.MemberName(e, o), members.PodName(e, o)
		url, err := r.resolver.SidecarURL(e, name, pod)
		if err != nil {
			return nil, sidecarcluster.Hint{}, fmt.Errorf("resolving the sidecar of %s: %w", name, err)
		}
		eps = append(eps, sidecarcluster.Endpoint{Member: name, URL: url, TLS: t})
	}
	retire := e.Spec.GetExternalMembersPolicy() == v1alpha1.ExternalMembersPolicyRetire
	var hint sidecarcluster.Hint
	for _, x := range e.Spec.ExternalMembers {
		if x.SidecarURL != "" {
			eps = append(eps, sidecarcluster.Endpoint{Member: x.Name, URL: x.SidecarURL, TLS: t})
		}
		if retire {
			hint.Departing = append(hint.Departing, x.Name)
		}
	}
	if st := e.Status.Membership; st != nil {
		for _, m := range st.Members {
			if m.Healthy && m.Votes() {
				hint.Healthy = append(hint.Healthy, m.Name)
			}
			if m.Role == v1alpha1.MemberRoleLearner {
				hint.Learners = append(hint.Learners, m.Name)
			}
			if m.Role == v1alpha1.MemberRoleLeader && m.Healthy {
				hint.Leader = m.Name
			}
			if o, ok := members.Ordinal(e, m.Name); ok && !members.LocalOrdinals(e).Contains(o) {
				hint.Departing = append(hint.Departing, m.Name)
			}
		}
		// A leader transfer made after the members above were observed
		// names the leader they do not show yet.
		if ls := st.LastStep; ls != nil && ls.Kind == v1alpha1.StepMoveLeader && ls.Outcome == v1alpha1.StepSucceeded &&
			ls.Member != "" && st.ObservedTime != nil && !ls.Time.Before(st.ObservedTime) {
			hint.Leader = ls.Member
		}
	}
	return eps, hint, nil
}

// target is what e asks for, given what was observed: its ordinal range as
// voters, but for the spec.learnerReplicas highest ordinals as learners
// only (one that votes already stays a voter: etcd cannot make a voter a
// learner again), its external members kept or retired, and its local
// members outside the range (a move of the range) departing.
func (r *Reconciler) target(e *v1alpha1.Etcd, running members.Ordinals, obs *sidecarcluster.Observation) (sidecarcluster.Target, error) {
	var t sidecarcluster.Target
	local := ordinals(members.LocalOrdinals(e))
	firstLearner := max(1, len(local)-int(e.Spec.GetLearnerReplicas()))
	for i, o := range local {
		name, pod := members.MemberName(e, o), members.PodName(e, o)
		urls, err := r.resolver.PeerURLs(e, name, pod)
		if err != nil {
			return t, fmt.Errorf("resolving the peer URLs of %s: %w", name, err)
		}
		if urls, err = apart(e, name, urls, obs); err != nil {
			return t, err
		}
		w := planner.Want{Name: name, PeerURLs: urls, Side: sideLocal}
		if i >= firstLearner && !votes(obs, name) {
			t.Learners = append(t.Learners, w)
		} else {
			t.Add = append(t.Add, w)
		}
	}
	retire := e.Spec.GetExternalMembersPolicy() == v1alpha1.ExternalMembersPolicyRetire
	retained := retainedExternal(e, obs)
	for _, x := range e.Spec.ExternalMembers {
		if retire && !retained[x.Name] {
			t.Remove = append(t.Remove, x.Name)
		} else {
			t.Keep = append(t.Keep, x.Name)
		}
	}
	for _, m := range obs.List.Members {
		if side(e, running, m.Name) == sideLeaving && !slices.Contains(t.Remove, m.Name) {
			t.Remove = append(t.Remove, m.Name)
		}
	}
	t.Side = func(name string) string { return side(e, running, name) }
	return t, nil
}

// votes tells whether the member name was observed as a voter.
func votes(obs *sidecarcluster.Observation, name string) bool {
	return slices.ContainsFunc(obs.List.Members, func(m sidecar.Member) bool { return m.Name == name && !m.IsLearner })
}

// retainedExternal names the external members that spec.retainedExternalMembers
// keeps voting under the Retire policy. While etcd has more listed external
// members than that, none is kept: they all depart, so the planner
// interleaves their removals with the local additions exactly as for a full
// retirement (n, n+1, n voters, one tie). Once only that many are left,
// those stay. Keeping named members from the start would instead make the
// target n+1 voters and let the planner add before it removes.
func retainedExternal(e *v1alpha1.Etcd, obs *sidecarcluster.Observation) map[string]bool {
	present := map[string]bool{}
	for _, x := range e.Spec.ExternalMembers {
		if slices.ContainsFunc(obs.List.Members, func(m sidecar.Member) bool {
			return m.Name == x.Name || slices.ContainsFunc(m.PeerURLs, func(u string) bool { return slices.Contains(x.PeerURLs, u) })
		}) {
			present[x.Name] = true
		}
	}
	if len(present) > e.Spec.GetRetainedExternalMembers() {
		return nil
	}
	return present
}

// side places a member name: local (an ordinal of e's ordinal range),
// leaving (one of e's own members whose ordinal is outside the range),
// external, or unmanaged. running is the ordinals e's StatefulSet runs.
//
// A name of e's form outside the range is e's own only when a fact says so
// (owned): a name alone proves nothing, since another Etcd or an operator
// may have added a member that happens to look like one of e's, and
// whatever is not e's is never removed (rule 7).
func side(e *v1alpha1.Etcd, running members.Ordinals, name string) string {
	if o, ok := members.Ordinal(e, name); ok {
		switch {
		case members.LocalOrdinals(e).Contains(o):
			return sideLocal
		case running.Contains(o) || ownedBefore(e, name):
			return sideLeaving
		}
		return sideUnmanaged
	}
	if _, ok := e.Spec.ExternalMember(name); ok {
		return sideExternal
	}
	return sideUnmanaged
}

// ownedBefore reports whether e's status shows name as e's own member: it
// was observed as a local member (in e's window then), or it is the member
// e's controller added last (a learner etcd knows only by its peer URLs
// until it starts). The status is a hint that others can drop (druid's
// compaction controller replaces the whole status); the durable fact is
// the pod: a member whose pod e's StatefulSet runs is e's (side).
func ownedBefore(e *v1alpha1.Etcd, name string) bool {
	st := e.Status.Membership
	if st == nil || name == "" {
		return false
	}
	if last := st.LastStep; last != nil && last.Kind == v1alpha1.StepAddLearner && last.Member == name {
		return true
	}
	return slices.ContainsFunc(st.Members, func(m v1alpha1.ObservedMember) bool {
		return m.Name == name && m.Origin == v1alpha1.MemberOriginLocal
	})
}

// origin is the status origin of an observed member; an unstarted learner
// (no name yet) is matched to a local member by its peer URLs.
func origin(e *v1alpha1.Etcd, running members.Ordinals, t sidecarcluster.Target, name string, peerURLs []string) v1alpha1.MemberOrigin {
	if name == "" {
		for _, w := range t.Own() {
			for _, u := range peerURLs {
				if slices.Contains(w.PeerURLs, u) {
					return v1alpha1.MemberOriginLocal
				}
			}
		}
		return v1alpha1.MemberOriginUnmanaged
	}
	switch side(e, running, name) {
	case sideLocal, sideLeaving:
		return v1alpha1.MemberOriginLocal
	case sideExternal:
		return v1alpha1.MemberOriginExternal
	}
	return v1alpha1.MemberOriginUnmanaged
}

func ordinals(o members.Ordinals) []int64 {
	var out []int64
	for i := o.Start; i < o.End; i++ {
		out = append(out, i)
	}
	return out
}
