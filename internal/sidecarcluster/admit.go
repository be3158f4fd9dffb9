package sidecarcluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/etcdconfig"
	"github.com/druid-stretch/druid-stretch/internal/peerurl"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// A member of an Etcd druid-stretch manages starts only once admitted (the
// sidecar's join.go): etcd-wrapper asks its sidecar for initialisation, and
// the sidecar answers once the controller has said with which initial
// cluster the member starts. The controller says so in two cases:
//
//   - a learner the planner added, whose etcd has not started (etcd names a
//     member once it starts): its pod gets state "existing" and the cluster
//     as observed, so it joins the cluster it was added to and nothing else;
//   - a new Etcd (no external member, no member ever observed) whose every
//     pod waits with no data: all of them get state "new" and the initial
//     cluster of their own URLs, as druid would bootstrap it.
//
// A pod with etcd data needs no admission: etcd restarts from its log.

// Joiner is a local pod whose member may wait for an admission.
type Joiner struct {
	// Member is its member name.
	Member string
	// PeerURLs are the peer URLs the planner adds it with.
	PeerURLs []string
	// Sidecar is its sidecar's URL.
	Sidecar string
	// TLS, when set, replaces Config.TLS towards that sidecar (see
	// Endpoint.TLS).
	TLS *tls.Config
}

// Admit admits every joiner whose member obs shows as a learner that has not
// started yet and whose sidecar waits for an admission, or holds one to a
// membership that has changed since. It returns the members admitted, and
// notes in obs.Configured how long each such learner's etcd has run with
// its configuration. A
// sidecar that is not etcd-wrapper's server (no admission to give: the
// member starts on its own) or does not answer yet is skipped; the next
// reconcile asks again.
func (c *Cluster) Admit(ctx context.Context, obs *Observation, joiners []Joiner) (admitted []string, err error) {
	var errs []error
	for _, j := range joiners {
		m := unstartedLearner(obs, j.PeerURLs)
		if m == nil {
			continue
		}
		if m.ConnectedForSeconds > 0 {
			// Its etcd runs (the raft transport of the member that answered
			// has it connected) and has not published its name yet: it
			// started from its admission, and no new one could change how
			// it joined. Its sidecar is not asked: a pod busy starting etcd
			// may accept the connection and not answer for seconds, which
			// held the whole reconcile, its promotion included.
			continue
		}
		ok, err := c.admitLearner(ctx, obs, j, m)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			admitted = append(admitted, j.Member)
		}
	}
	return admitted, errors.Join(errs...)
}

// admitLearner admits joiner j as the unstarted learner m of obs, if its
// sidecar waits for that. Each call is bounded like a member list: a pod
// that does not answer within it is asked again on the next reconcile.
func (c *Cluster) admitLearner(ctx context.Context, obs *Observation, j Joiner, m *sidecar.Member) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ObserveTimeout)
	defer cancel()
	cl := c.client(j.Sidecar, j.TLS)
	st, err := cl.Join(ctx)
	if err != nil {
		if notJoining(err) {
			return false, nil
		}
		return false, fmt.Errorf("asking the sidecar of %s whether it waits: %w", j.Member, err)
	}
	if err := sameMember(cl, j, st); err != nil {
		return false, err
	}
	if st.ConfiguredForSeconds > 0 {
		if obs.Configured == nil {
			obs.Configured = map[string]time.Duration{}
		}
		obs.Configured[strings.ToLower(m.ID)] = time.Duration(st.ConfiguredForSeconds * float64(time.Second))
	}
	a := sidecar.Admission{State: etcdconfig.StateExisting, InitialCluster: initialCluster(obs, m.ID, j.Member), MemberID: m.ID, Member: j.Member}
	if st.HasData {
		return false, nil // starts already, from its own log
	}
	if old := st.Admission; old != nil && old.MemberID == m.ID && old.State == a.State && sameInitialCluster(old.InitialCluster, a.InitialCluster) {
		return false, nil // admitted as this very learner, to the membership as it is now
	}
	// An admission to a membership that changed since (another learner
	// added or a member removed before this one started) is renewed: etcd
	// refuses to join when its initial cluster does not list exactly the
	// cluster's members, and etcd-wrapper asks again.
	if _, err := cl.Admit(ctx, a); err != nil {
		if sidecar.IsReason(err, sidecar.ReasonHasData) {
			return false, nil // its etcd has data now: it no longer waits
		}
		return false, fmt.Errorf("admitting %s as learner %s: %w", j.Member, m.ID, err)
	}
	return true, nil
}

// PodsWaiting asks the sidecars of joiners, members not in the cluster
// yet, whether their pods run, all at once and each bounded like a member
// list. It returns, by member name, why a pod cannot start its member yet
// ("" when it can): a sidecar that answers for the member runs in its pod,
// whose member then starts once admitted (or on its own, where the sidecar
// does not serve etcd-wrapper); one that does not answer is in a pod that
// is not created, scheduled or started yet, and a learner added for it
// could not start until it is; one that answers for another member is
// another pod's, reached under a name both seeds' pods share.
func (c *Cluster) PodsWaiting(ctx context.Context, joiners []Joiner) map[string]string {
	out := make(map[string]string, len(joiners))
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for _, j := range joiners {
		wg.Go(func() {
			jctx, cancel := context.WithTimeout(ctx, c.cfg.ObserveTimeout)
			defer cancel()
			why := ""
			cl := c.client(j.Sidecar, j.TLS)
			switch st, err := cl.Join(jctx); {
			case err != nil && !notJoining(err):
				why = fmt.Sprintf("its pod's sidecar does not answer yet (%v)", err)
			case err == nil:
				// An answer for another member says nothing of this
				// one's pod (see sameMember).
				if err := sameMember(cl, j, st); err != nil {
					why = err.Error()
				}
			}
			mu.Lock()
			out[j.Member] = why
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// Bootstrap admits every joiner with state "new" and the initial cluster of
// their own peer URLs, when every one of them answers and none has etcd data
// or an admission other than that bootstrap (a bootstrap interrupted
// half-way is finished with the same initial cluster). Call it only for an
// Etcd that has no external member and never had a member observed: it
// starts a new etcd cluster. It reports whether it admitted the members;
// when not, why.
func (c *Cluster) Bootstrap(ctx context.Context, joiners []Joiner) (bool, string, error) {
	if len(joiners) == 0 {
		return false, "no pod to bootstrap", nil
	}
	type waiting struct {
		cl     *sidecar.Client
		st     *sidecar.JoinStatus
		member string
	}
	var (
		all   []waiting
		peers []etcdconfig.Member
	)
	for _, j := range joiners {
		cl := c.client(j.Sidecar, j.TLS)
		jctx, cancel := context.WithTimeout(ctx, c.cfg.ObserveTimeout)
		st, err := cl.Join(jctx)
		cancel()
		if err == nil {
			if err := sameMember(cl, j, st); err != nil {
				return false, err.Error(), nil
			}
		}
		switch {
		case err != nil && notJoining(err):
			return false, fmt.Sprintf("the sidecar of %s does not serve etcd-wrapper (it starts its member on its own)", j.Member), nil
		case err != nil:
			return false, fmt.Sprintf("the sidecar of %s does not answer yet: %v", j.Member, err), nil
		case st.HasData:
			return false, fmt.Sprintf("%s has etcd data: the cluster exists; it is not bootstrapped again", j.Member), nil
		case st.Admission != nil && st.Admission.State != etcdconfig.StateNew:
			return false, fmt.Sprintf("%s was admitted to join an existing cluster", j.Member), nil
		}
		all = append(all, waiting{cl, st, j.Member})
		peers = append(peers, etcdconfig.Member{Name: st.Member, PeerURLs: st.PeerURLs})
	}
	a := sidecar.Admission{State: etcdconfig.StateNew, InitialCluster: etcdconfig.FormatInitialCluster(peers)}
	for _, w := range all {
		if w.st.Admission != nil && w.st.Admission.InitialCluster != a.InitialCluster {
			return false, "", fmt.Errorf("%s was admitted to bootstrap with the initial cluster %q, the pods now say %q; refusing to bootstrap two clusters", w.st.Member, w.st.Admission.InitialCluster, a.InitialCluster)
		}
	}
	for _, w := range all {
		if w.st.Admission != nil {
			continue
		}
		own := a
		own.Member = w.member
		if _, err := w.cl.Admit(ctx, own); err != nil {
			return false, "", fmt.Errorf("admitting %s to bootstrap: %w", w.st.Member, err)
		}
	}
	return true, a.InitialCluster, nil
}

// sameMember checks that the sidecar cl reached for joiner j answers for
// j's member. Both seeds of a GEP-39 move run the Etcd under one name and
// namespace, so a pod's in-cluster name is also a pod's name in the other
// seed; a DNS answer or a kept connection from when the name led to the
// other pod reaches the wrong sidecar. Whatever it answers says nothing of
// j's pod: the connection is dropped, so that the next reconcile dials the
// name afresh, and the error names both members.
func sameMember(cl *sidecar.Client, j Joiner, st *sidecar.JoinStatus) error {
	if st.Member == j.Member {
		return nil
	}
	cl.CloseIdleConnections()
	return fmt.Errorf("the sidecar at %s answers for member %q, not for %s: the address leads to another pod (a name two pods share, or a connection kept from when it did); nothing is admitted, and the next reconcile dials it afresh", j.Sidecar, st.Member, j.Member)
}

// unstartedLearner is the learner of obs with exactly these peer URLs that
// has no name yet (etcd names a member once it starts), nil if none.
func unstartedLearner(obs *Observation, peerURLs []string) *sidecar.Member {
	for i := range obs.List.Members {
		m := &obs.List.Members[i]
		if m.IsLearner && m.Name == "" && sameURLs(m.PeerURLs, peerURLs) {
			return m
		}
	}
	return nil
}

// initialCluster is etcd's initial-cluster for a member joining obs's
// cluster as the learner id: every member with its peer URLs, the joining
// one under its own name. etcd compares only the peer URLs of the others,
// so a member that has no name yet is listed under its ID.
func initialCluster(obs *Observation, id, name string) string {
	var ms []etcdconfig.Member
	for _, m := range obs.List.Members {
		n := m.Name
		switch {
		case m.ID == id:
			n = name
		case n == "":
			n = m.ID
		}
		ms = append(ms, etcdconfig.Member{Name: n, PeerURLs: m.PeerURLs})
	}
	return etcdconfig.FormatInitialCluster(ms)
}

// sameInitialCluster tells whether two initial clusters list the same
// peer URLs, in any order. Names do not count: etcd matches the other
// members by their peer URLs alone, and a learner listed under its ID
// while it had not started gets its name later.
func sameInitialCluster(a, b string) bool {
	urls := func(ic string) []string {
		var out []string
		for _, e := range strings.Split(ic, ",") {
			_, u, _ := strings.Cut(e, "=")
			out = append(out, u)
		}
		return out
	}
	return sameURLs(urls(a), urls(b))
}

// sameURLs tells whether a and b name the same peers (peerurl.Key).
func sameURLs(a, b []string) bool { return peerurl.SameSet(a, b) }

// notJoining: the sidecar serves no /v1/join (it was started without
// druid's etcd configuration), so its member starts without admission.
func notJoining(err error) bool {
	var e *sidecar.Error
	return errors.As(err, &e) && e.StatusCode == http.StatusNotFound
}
