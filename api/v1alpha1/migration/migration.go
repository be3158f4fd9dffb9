// Package migration is the gardenlet side of a live move of an etcd cluster
// from one Kubernetes cluster (the source) to another (the destination): the
// Etcd spec fields each step sets, the status predicates each step waits on,
// and Phase, which reads the state of the move from the two Etcd objects
// alone. It only sets fields and reads status; the membership controllers in
// the two clusters do the work, one safe step at a time. The functions are
// pure, so gardenlet can call them from its own flow, and the druid-stretch
// orchestration (internal/livemove) and CLI call the same ones.
//
// The move, for an Etcd with N replicas in the source:
//
//  1. prepare-source: the source lists the destination's N members as
//     external members, policy Keep (PrepareSource). Wait: the source's
//     membership converged (Converged).
//  2. join-destination: the destination Etcd (same name, a distinct ordinal
//     range or member name prefix) gets replicas 1, the source's members as
//     external members, policy Keep (JoinDestination). Its controller adds
//     its first member as a learner and promotes it: 3+1. Wait:
//     DestinationJoined.
//  3. switch-clients: the caller switches the source site's clients to the
//     destination (gardenlet: once the destination's kube-apiserver serves
//     on the destination's members, the shoot's API endpoint to it, then
//     the source's kube-apiserver stopped). Nothing in the Etcds changes;
//     the source's clients then never see a member removed or leadership
//     moved, and the destination's see the one leader transfer, which the
//     members' client gates hold them through.
//  4. retire-source: the destination gets replicas N, policy Retire
//     (RetireSource). Its controller interleaves removals of source members
//     with additions of its own, moving leadership once, so that the tie (no
//     side holds a majority) lasts one removal. Wait: SourceRetired. A
//     caller that must keep source members for clients it could not switch
//     yet holds them (RetireSource with hold > 0) and waits for SourceHeld
//     instead (the destination's N members vote beside the held ones),
//     then calls ReleaseSource and waits for SourceRetired.
//  5. finish: the source gets replicas 0 (FinishSource; wait Converged), then
//     no external members (ForgetExternalMembers), and so does the
//     destination (FinishDestination; wait Converged).
//
// Abort is allowed until the destination holds the majority (CanAbort): the
// destination gets replicas 0, policy Keep (AbortDestination); its controller
// removes its members and deletes its retirement records, so the source's
// controller adds back any source member already retired. Wait: Aborted's
// first half (SourceRestored), then the source forgets the destination's
// members (ForgetExternalMembers; wait Aborted).
package migration

import (
	"errors"
	"fmt"
	"slices"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

// Step is one step of a live move.
type Step string

// The steps, in the order of a move; abort replaces the steps after
// join-destination.
const (
	StepPrepareSource   Step = "prepare-source"
	StepJoinDestination Step = "join-destination"
	StepSwitchClients   Step = "switch-clients"
	StepRetireSource    Step = "retire-source"
	StepFinish          Step = "finish"
	StepAbort           Step = "abort"
)

// Steps are the steps of a move in order.
var Steps = []Step{StepPrepareSource, StepJoinDestination, StepRetireSource, StepFinish}

// Addresses gives the URLs under which the other cluster reaches the member
// memberName of e's pod podName: peer URLs, client URLs and sidecar URL. They
// depend on the environment (ingress, DNS, a load balancer per member), so
// the caller supplies them. The Name of the answer is ignored.
type Addresses func(e *v1alpha1.Etcd, memberName, podName string) (v1alpha1.ExternalMember, error)

// ExternalMembers lists e's local members (its ordinal range) as the other
// cluster's Etcd lists them in spec.externalMembers.
func ExternalMembers(e *v1alpha1.Etcd, addr Addresses) ([]v1alpha1.ExternalMember, error) {
	if addr == nil {
		return nil, errors.New("migration: no Addresses function to give the members' URLs")
	}
	r := members.LocalOrdinals(e)
	out := make([]v1alpha1.ExternalMember, 0, r.End-r.Start)
	for o := r.Start; o < r.End; o++ {
		name, pod := members.MemberName(e, o), members.PodName(e, o)
		m, err := addr(e, name, pod)
		if err != nil {
			return nil, fmt.Errorf("migration: addresses of member %s (pod %s/%s): %w", name, e.Namespace, pod, err)
		}
		if len(m.PeerURLs) == 0 {
			return nil, fmt.Errorf("migration: member %s (pod %s/%s) has no peer URL", name, e.Namespace, pod)
		}
		m.Name = name
		m.PeerURLs = slices.Clone(m.PeerURLs)
		m.ClientURLs = slices.Clone(m.ClientURLs)
		out = append(out, m)
	}
	return out, nil
}

// Advertise makes e's local members advertise the peer URLs under which the
// other cluster reaches them (addr): for each member of e's ordinal range,
// the URLs addr gives that are not druid's in-cluster one. druid
// advertises the in-cluster URL first and these after it; the members of
// the other cluster dial them, since the in-cluster name means another pod
// (or none) there. The entries of the ordinals druid admits in its own
// spec.etcd.additionalAdvertisePeerURLs (0..spec.replicas-1) go there; the
// others, a range that starts at spec.ordinalStart beyond them, into
// druid-stretch's spec.additionalAdvertisePeerURLs, which an Etcd written
// with druid's own CRD does not carry (the EtcdMembership does). Both
// depend on spec.replicas, so call it again whenever that changes.
func Advertise(e *v1alpha1.Etcd, addr Addresses) error {
	if addr == nil {
		return errors.New("migration: no Addresses function to give the members' URLs")
	}
	r := members.LocalOrdinals(e)
	var out []druidv1alpha1.MemberPeerURLs
	for o := r.Start; o < r.End; o++ {
		name, pod := members.MemberName(e, o), members.PodName(e, o)
		m, err := addr(e, name, pod)
		if err != nil {
			return fmt.Errorf("migration: addresses of member %s (pod %s/%s): %w", name, e.Namespace, pod, err)
		}
		inCluster := members.InClusterPeerURL(e, pod)
		var urls []string
		for _, u := range m.PeerURLs {
			if u != inCluster && !slices.Contains(urls, u) {
				urls = append(urls, u)
			}
		}
		if len(urls) > 0 {
			out = append(out, druidv1alpha1.MemberPeerURLs{MemberName: name, URLs: urls})
		}
	}
	setAdvertised(e, out)
	return nil
}

// setAdvertised writes the entries of e's local members: those druid
// admits into druid's field, the others into druid-stretch's.
func setAdvertised(e *v1alpha1.Etcd, entries []druidv1alpha1.MemberPeerURLs) {
	var druids []druidv1alpha1.MemberPeerURLs
	var own []v1alpha1.MemberPeerURLs
	for _, a := range entries {
		if o, ok := members.NameOrdinal(e, a.MemberName); ok && o < int64(e.Spec.Replicas) {
			druids = append(druids, a)
			continue
		}
		own = append(own, v1alpha1.MemberPeerURLs{MemberName: a.MemberName, URLs: slices.Clone(a.URLs)})
	}
	e.Spec.Etcd.AdditionalAdvertisePeerURLs = druids
	e.Spec.AdditionalAdvertisePeerURLs = own
}

// advertised are the entries of both fields, druid's first.
func advertised(e *v1alpha1.Etcd) []druidv1alpha1.MemberPeerURLs {
	out := slices.Clone(e.Spec.Etcd.AdditionalAdvertisePeerURLs)
	for _, a := range e.Spec.AdditionalAdvertisePeerURLs {
		out = append(out, druidv1alpha1.MemberPeerURLs{MemberName: a.MemberName, URLs: slices.Clone(a.URLs)})
	}
	return out
}

// NewDestination is the destination Etcd for a move of src: the same name,
// namespace and druid spec, with the final replica count N, local members
// on the ordinals [ordinalStart, ordinalStart+N), and no extension fields
// set yet (JoinDestination sets them). The ordinal ranges of source and
// destination must not overlap, so that member names stay unique; a
// different spec.memberNamePrefix achieves the same.
func NewDestination(src *v1alpha1.Etcd, ordinalStart int32) *v1alpha1.Etcd {
	dst := destinationOf(src)
	dst.Spec.OrdinalStart = &ordinalStart
	return dst
}

// destinationOf is an Etcd of src's name, namespace, labels, annotations
// and druid spec, without status or druid-stretch's fields.
func destinationOf(src *v1alpha1.Etcd) *v1alpha1.Etcd {
	dst := &v1alpha1.Etcd{
		TypeMeta: src.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: src.Name, Namespace: src.Namespace,
			Labels: src.Labels, Annotations: src.Annotations,
		},
	}
	dst.ObjectMeta = *dst.ObjectMeta.DeepCopy()
	dst.Spec.EtcdSpec = *src.Spec.EtcdSpec.DeepCopy()
	return dst
}

// CheckNames refuses a destination whose member names meet the source's:
// both lists of external members would then name one member twice.
func CheckNames(src, dst *v1alpha1.Etcd) error {
	srcNames := members.LocalMemberNames(src)
	for _, n := range members.LocalMemberNames(dst) {
		if slices.Contains(srcNames, n) {
			return fmt.Errorf("migration: destination member %s has the name of a source member; give the destination a distinct spec.ordinalStart (the source uses [%d, %d)) or spec.memberNamePrefix",
				n, members.LocalOrdinals(src).Start, members.LocalOrdinals(src).End)
		}
	}
	return nil
}

func policy(p v1alpha1.ExternalMembersPolicy) *v1alpha1.ExternalMembersPolicy { return &p }

// PrepareSource lists the destination's members as external members of the
// source, policy Keep: the source's controller then knows them as external
// (not unmanaged) and never adds or removes them.
func PrepareSource(src *v1alpha1.Etcd, destinationMembers []v1alpha1.ExternalMember) {
	src.Spec.ExternalMembers = slices.Clone(destinationMembers)
	src.Spec.ExternalMembersPolicy = policy(v1alpha1.ExternalMembersPolicyKeep)
}

// JoinDestination makes the destination a one-voter part of the source's
// etcd cluster: replicas 1, the source's members as external members,
// policy Keep. A destination that WarmDestination warmed keeps its
// replicas and learners: it has one voter too.
func JoinDestination(dst *v1alpha1.Etcd, sourceMembers []v1alpha1.ExternalMember) {
	if dst.Spec.GetLearnerReplicas() == 0 {
		dst.Spec.Replicas = 1
	}
	dst.Spec.ExternalMembers = slices.Clone(sourceMembers)
	dst.Spec.ExternalMembersPolicy = policy(v1alpha1.ExternalMembersPolicyKeep)
}

// WarmDestination gives the joined destination its final replica count,
// all but its first member as learners (spec.learnerReplicas), policy
// Keep: they join and catch up while the source's clients are switched,
// and vote only once RetireSource lets them. The destination keeps one
// vote, so the source keeps the majority and a cut between the clusters
// stalls nothing at the source, exactly as after JoinDestination.
func WarmDestination(dst *v1alpha1.Etcd, replicas int32) {
	if replicas <= 1 {
		return
	}
	learners := replicas - 1
	dst.Spec.Replicas = replicas
	dst.Spec.LearnerReplicas = &learners
}

// RetireSource gives the destination its final replica count and the policy
// Retire: its controller moves every vote to its own members and removes the
// source's.
//
// hold is how many source members stay voting until ReleaseSource: a
// caller whose source site still has clients it cannot switch before the
// retirement (its kube-apiserver, on the source's client Service) keeps
// that many members for them. A move that switches the clients first
// (step switch-clients) holds none. It takes effect only when the policy
// turns to Retire here; run again after ReleaseSource, RetireSource never
// holds members back again.
func RetireSource(dst *v1alpha1.Etcd, replicas, hold int32) {
	if dst.Spec.GetExternalMembersPolicy() != v1alpha1.ExternalMembersPolicyRetire {
		dst.Spec.RetainedExternalMembers = nil
		if hold > 0 {
			dst.Spec.RetainedExternalMembers = &hold
		}
	}
	dst.Spec.Replicas = replicas
	dst.Spec.LearnerReplicas = nil
	dst.Spec.ExternalMembersPolicy = policy(v1alpha1.ExternalMembersPolicyRetire)
}

// RequestDruidReconcile asks etcd-druid to reconcile e's spec: druid as a
// Gardener seed runs it (--enable-etcd-spec-auto-reconcile=false) acts on
// a spec change, such as a step's new replicas, only when the Etcd carries
// druid's operation annotation, which it removes once done. gardenlet sets
// it with every spec it writes; so must whoever drives these steps.
func RequestDruidReconcile(e *v1alpha1.Etcd) {
	if e.Annotations == nil {
		e.Annotations = map[string]string{}
	}
	e.Annotations[druidv1alpha1.DruidOperationAnnotation] = druidv1alpha1.DruidOperationReconcile
}

// ReleaseSource lets the destination's controller remove the source
// members RetireSource held back: the clients they served are switched.
func ReleaseSource(dst *v1alpha1.Etcd) {
	dst.Spec.RetainedExternalMembers = nil
}

// FinishSource scales the source to zero; its members are gone from etcd
// already, so this only stops its pods. Its external members stay listed
// until its controller has seen the change, so it can still observe the
// cluster (through them) and report convergence.
func FinishSource(src *v1alpha1.Etcd) {
	src.Spec.Replicas = 0
	keepAdvertisedInRange(src)
}

// keepAdvertisedInRange drops the additional peer URLs of members outside
// e's ordinal range and puts the others into the field that admits them at
// e's spec.replicas: druid's validation refuses an entry for a member the
// Etcd does not run, so scaling down must drop it.
func keepAdvertisedInRange(e *v1alpha1.Etcd) {
	r := members.LocalOrdinals(e)
	setAdvertised(e, slices.DeleteFunc(advertised(e), func(a druidv1alpha1.MemberPeerURLs) bool {
		o, ok := members.Ordinal(e, a.MemberName)
		return !ok || !r.Contains(o)
	}))
}

// ForgetExternalMembers drops the external members, policy Keep: the last
// change of the finish (source and destination) and of an abort (source).
func ForgetExternalMembers(e *v1alpha1.Etcd) {
	e.Spec.ExternalMembers = nil
	e.Spec.ExternalMembersPolicy = policy(v1alpha1.ExternalMembersPolicyKeep)
}

// FinishDestination makes the destination an ordinary Etcd again.
func FinishDestination(dst *v1alpha1.Etcd) { ForgetExternalMembers(dst) }

// AbortDestination scales the destination to zero, policy Keep: its
// controller removes its own members and deletes its retirement records, so
// that the source's controller adds back the source members it retired.
func AbortDestination(dst *v1alpha1.Etcd) {
	dst.Spec.Replicas = 0
	dst.Spec.LearnerReplicas = nil
	dst.Spec.ExternalMembersPolicy = policy(v1alpha1.ExternalMembersPolicyKeep)
	keepAdvertisedInRange(dst)
}

// Converged reports whether e's controller has planned from e's current
// spec and found nothing left to do.
func Converged(e *v1alpha1.Etcd) bool {
	if e == nil || e.Status.Membership == nil {
		return false
	}
	ms := e.Status.Membership
	if ms.ObservedGeneration != e.Generation {
		return false
	}
	c := meta.FindStatusCondition(ms.Conditions, v1alpha1.ConditionMembershipConverged)
	return c != nil && c.Status == metav1.ConditionTrue && (c.ObservedGeneration == 0 || c.ObservedGeneration == e.Generation)
}

// observed are e's observed members (none before the first observation).
func observed(e *v1alpha1.Etcd) []v1alpha1.ObservedMember {
	if e == nil || e.Status.Membership == nil {
		return nil
	}
	return e.Status.Membership.Members
}

// localVoters counts e's own members that vote, and all its own members.
func localVoters(e *v1alpha1.Etcd) (voters, all int) {
	for _, m := range observed(e) {
		if members.IsOwn(e, m) {
			all++
			if m.Votes() {
				voters++
			}
		}
	}
	return voters, all
}

// DestinationJoined reports whether the destination's members (replicas 1
// at this step) all vote, as its converged controller observed; once
// WarmDestination warmed it, whether its first member votes and the
// others are learners.
func DestinationJoined(dst *v1alpha1.Etcd) bool {
	if !Converged(dst) || dst.Spec.Replicas < 1 {
		return false
	}
	v, all := localVoters(dst)
	learners := int(dst.Spec.GetLearnerReplicas())
	return v >= int(dst.Spec.Replicas)-learners && all-v <= learners
}

// SourceHeld reports whether the destination's controller, under policy
// Retire with source members held back (spec.retainedExternalMembers),
// converged: its N members vote beside the held source members only.
func SourceHeld(dst *v1alpha1.Etcd) bool {
	held := dst.Spec.GetRetainedExternalMembers()
	if held == 0 || !Converged(dst) || dst.Spec.GetExternalMembersPolicy() != v1alpha1.ExternalMembersPolicyRetire {
		return false
	}
	v, all := localVoters(dst)
	return v == all && v == int(dst.Spec.Replicas) && len(observed(dst))-all <= held
}

// SourceRetired reports whether the destination's controller, under policy
// Retire, converged: its N members vote and no external member is left.
func SourceRetired(dst *v1alpha1.Etcd) bool {
	if !Converged(dst) || dst.Spec.GetExternalMembersPolicy() != v1alpha1.ExternalMembersPolicyRetire {
		return false
	}
	v, all := localVoters(dst)
	if v != all || v != int(dst.Spec.Replicas) {
		return false
	}
	for _, m := range observed(dst) {
		if _, ext := dst.Spec.ExternalMember(m.Name); ext || m.Origin == v1alpha1.MemberOriginExternal {
			return false
		}
	}
	return true
}

// SourceRestored reports whether, after an abort, the source's controller
// observed its replicas members as voters and nothing else: every
// destination member is gone and every retired source member is back.
func SourceRestored(src *v1alpha1.Etcd) bool {
	if !Converged(src) {
		return false
	}
	v, all := localVoters(src)
	return v == all && v == int(src.Spec.Replicas) && len(observed(src)) == v
}

// Voters counts the voters of the source and of the destination, from the
// more recent of the two observations (the destination's controller knows
// the source's members as external and vice versa). ok is false when
// neither controller has observed the cluster yet.
func Voters(src, dst *v1alpha1.Etcd) (source, destination int, ok bool) {
	view, mine := freshest(src, dst)
	if view == nil {
		return 0, 0, false
	}
	for _, m := range observed(view) {
		if !m.Votes() || m.Origin == v1alpha1.MemberOriginUnmanaged {
			continue
		}
		if local := members.IsOwn(view, m); local == mine {
			source++
		} else {
			destination++
		}
	}
	return source, destination, true
}

// freshest returns the Etcd with the more recent membership observation,
// and whether it is the source.
func freshest(src, dst *v1alpha1.Etcd) (*v1alpha1.Etcd, bool) {
	at := func(e *v1alpha1.Etcd) (metav1.Time, bool) {
		if e == nil || e.Status.Membership == nil || len(e.Status.Membership.Members) == 0 {
			return metav1.Time{}, false
		}
		if t := e.Status.Membership.ObservedTime; t != nil {
			return *t, true
		}
		return metav1.Time{}, true
	}
	st, sok := at(src)
	dt, dok := at(dst)
	switch {
	case dok && (!sok || !dt.Before(&st)):
		return dst, false
	case sok:
		return src, true
	}
	return nil, false
}

// CanAbort says whether the move may still be aborted: until the
// destination holds the majority of the voters. The error names the voter
// counts otherwise.
func CanAbort(src, dst *v1alpha1.Etcd) error {
	switch p := Phase(src, dst); p {
	case PhaseSourceRetired, PhaseFinishing, PhaseCompleted:
		return fmt.Errorf("migration: cannot abort in phase %s: the source's members are retired", p)
	case PhaseInconsistent:
		return fmt.Errorf("migration: cannot abort: %s", Explain(src, dst))
	}
	s, d, ok := Voters(src, dst)
	if ok && 2*d > s+d {
		return fmt.Errorf("migration: cannot abort: the destination holds the majority (%d of %d voters; the source has %d); finish the move instead", d, s+d, s)
	}
	return nil
}
