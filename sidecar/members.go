package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/peerurl"
)

// etcdHealthInterval is etcd's HealthInterval: its strict reconfiguration
// check counts peers connected for this long, so a refusal clears after it.
const etcdHealthInterval = 5 * time.Second

// addLearner answers POST /v1/members.
func (s *Server) addLearner(r *http.Request) (int, any, *Error) {
	var req AddMemberRequest
	if e := decodeJSON(r, &req); e != nil {
		return 0, nil, e
	}
	if e := validateName("name", req.Name); e != nil {
		return 0, nil, e
	}
	setTarget(r, req.Name)
	if e := validatePeerURLs(req.PeerURLs); e != nil {
		return 0, nil, e
	}
	if !req.Learner {
		return 0, nil, badRequest(ReasonInvalidArgument,
			`only learners can be added ("learner": true); a voter joins as a learner and is promoted once it caught up, so quorum never depends on a member that has not synced`)
	}
	ctx, v, done, e := s.beginChange(r, false, true)
	if e != nil {
		return 0, nil, e
	}
	defer done()
	for _, m := range v.members {
		// Peer URLs are compared by peerurl.Key, never as strings: another
		// spelling of a member's URL names the same peer.
		sameURLs := peerurl.SameSet(m.pb.PeerURLs, req.PeerURLs)
		switch {
		case sameURLs && (m.pb.Name == req.Name || m.pb.Name == ""):
			// The same member, started or not (etcd names it only once
			// it starts).
			return http.StatusOK, ChangeResult{Member: m.api}, nil
		case m.pb.Name == req.Name:
			return 0, nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonNameConflict,
				Message: fmt.Sprintf("member %q (%s) exists with peer URLs %v, not %v", m.pb.Name, m.api.ID, m.pb.PeerURLs, req.PeerURLs)}
		}
		if u, theirs, ok := peerurl.Shared(req.PeerURLs, m.pb.PeerURLs); ok {
			msg := fmt.Sprintf("peer URL %s belongs to member %q (%s)", u, m.pb.Name, m.api.ID)
			if u != theirs {
				msg = fmt.Sprintf("peer URL %s names the same peer as %s of member %q (%s)", u, theirs, m.pb.Name, m.api.ID)
			}
			return 0, nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonPeerURLConflict, Message: msg}
		}
	}
	if e := checkFingerprint(r, v); e != nil {
		return 0, nil, e
	}
	step, e := s.fence(ctx, r, v, StepRecord{Kind: StepAddLearner, Target: req.Name})
	if e != nil {
		return 0, nil, e
	}
	var resp *clientv3.MemberAddResponse
	err := s.withCluster(ctx, func(c *clientv3.Client) (err error) {
		resp, err = c.MemberAddAsLearner(ctx, req.PeerURLs)
		return err
	})
	if err != nil {
		e := etcdError("adding the learner", err)
		step.failed(e)
		return 0, nil, e
	}
	m := resp.Member
	if low := lowestVoterID(resp.Members); m.ID < low {
		var e *Error
		if m, e = s.addForHigherID(ctx, req, m, low); e != nil {
			step.failed(e)
			return 0, nil, e
		}
	}
	step.succeeded(true, "")
	return http.StatusCreated, ChangeResult{Changed: true, Member: Member{
		ID: formatID(m.ID), Name: m.Name, PeerURLs: orEmpty(m.PeerURLs), ClientURLs: orEmpty(m.ClientURLs), IsLearner: m.IsLearner,
	}}, nil
}

// maxIDRolls bounds how often addForHigherID adds a learner again.
const maxIDRolls = 3

// addForHigherID adds learner m again, in a later second, while its ID is
// below every voter's (lowest): a joining etcd asks the members in ID
// order whether a downgrade is enabled and takes the first answer, a
// linearizable read that a learner still catching up answers only once it
// has, so every learner joining after m would wait in its own start for
// m's catch-up. etcd derives a member's ID from its peer URLs and the
// second of its add. m has not started (its pod waits for the admission
// the controller gives once this call answers), and etcd puts no health
// check on a learner's removal. A removal that fails keeps m, which only
// joins slower; an add that fails after the removal is this call's error,
// with no learner left, and the caller adds it again.
func (s *Server) addForHigherID(ctx context.Context, req AddMemberRequest, m *etcdserverpb.Member, lowest uint64) (*etcdserverpb.Member, *Error) {
	for try := 0; try < maxIDRolls && m.ID < lowest; try++ {
		added := time.Now()
		err := s.withCluster(ctx, func(c *clientv3.Client) error {
			_, err := c.MemberRemove(ctx, m.ID)
			return err
		})
		if err != nil {
			s.log.Info("keeping a learner whose ID is below every voter's: removing it to add it again failed", "member", req.Name, "id", formatID(m.ID), "error", err.Error())
			return m, nil
		}
		// The next second by this host's clock, which the local member,
		// which stamps the add, shares.
		next := time.NewTimer(time.Until(added.Truncate(time.Second).Add(time.Second)))
		select {
		case <-ctx.Done():
			next.Stop()
			return nil, etcdError("adding the learner again for a higher member ID", ctx.Err())
		case <-next.C:
		}
		var resp *clientv3.MemberAddResponse
		err = s.withCluster(ctx, func(c *clientv3.Client) (err error) {
			resp, err = c.MemberAddAsLearner(ctx, req.PeerURLs)
			return err
		})
		if err != nil {
			return nil, etcdError("adding the learner again for a higher member ID", err)
		}
		s.log.Info("added a learner again for a member ID above a voter's: joining members ask the lowest ID first", "member", req.Name, "was", formatID(m.ID), "id", formatID(resp.Member.ID), "lowestVoter", formatID(lowest))
		m = resp.Member
	}
	return m, nil
}

// lowestVoterID is the lowest ID of the voters among members (0 if none).
func lowestVoterID(members []*etcdserverpb.Member) uint64 {
	var low uint64
	for _, m := range members {
		if !m.IsLearner && (low == 0 || m.ID < low) {
			low = m.ID
		}
	}
	return low
}

// promote answers POST /v1/members/{name}/promote.
func (s *Server) promote(r *http.Request) (int, any, *Error) {
	name := r.PathValue("name")
	if e := validateName("member name", name); e != nil {
		return 0, nil, e
	}
	ctx, v, done, e := s.beginChange(r, true, true)
	if e != nil {
		return 0, nil, e
	}
	defer done()
	m := v.find(name)
	if m == nil {
		return 0, nil, memberNotFound(name)
	}
	if !m.pb.IsLearner {
		return http.StatusOK, ChangeResult{Member: m.api}, nil
	}
	if e := checkFingerprint(r, v); e != nil {
		return 0, nil, e
	}
	thenName := r.URL.Query().Get("thenRemove")
	if e := s.learnerReady(m, thenName != "" && s.removalNeedsLearner(v, m, thenName)); e != nil {
		return 0, nil, e
	}
	// The promotion makes the learner a voter: the healthy voters after it
	// (the learner counts, it is healthy) must still form a quorum.
	voters := len(v.voters()) + 1
	if healthy := countHealthy(v.voters()) + 1; healthy < quorum(voters) {
		return 0, nil, &Error{StatusCode: http.StatusPreconditionFailed, Reason: ReasonQuorumAtRisk,
			Message: fmt.Sprintf("after promoting %q, %d of %d voters would be healthy, fewer than a quorum of %d", name, healthy, voters, quorum(voters))}
	}
	if thenName != "" {
		if e := validateName("thenRemove", thenName); e != nil {
			return 0, nil, e
		}
	}
	step, e := s.fence(ctx, r, v, StepRecord{Kind: StepPromote, Target: name, ThenRemove: thenName})
	if e != nil {
		return 0, nil, e
	}
	var then *removal
	if thenName != "" {
		var e *Error
		if then, e = s.prepareRemovalAfterPromotion(ctx, v, m, thenName); e != nil {
			step.failed(e)
			return 0, nil, e
		}
	}
	err := s.withCluster(ctx, func(c *clientv3.Client) error {
		_, err := c.MemberPromote(ctx, m.pb.ID)
		return err
	})
	if err != nil && !isEtcdError(err, rpctypes.ErrGRPCMemberNotLearner) {
		if then != nil {
			then.undo()
		}
		e := etcdError("promoting the learner", err)
		step.failed(e)
		return 0, nil, e
	}
	out := m.api
	out.IsLearner = false
	res := ChangeResult{Member: out, Changed: err == nil}
	if then != nil {
		promoted := time.Now()
		removed, e := s.finishRemoval(ctx, then)
		res.GapSeconds = time.Since(promoted).Seconds()
		if e != nil {
			res.RemoveError = e.Error()
		} else {
			res.Removed = &removed
		}
	}
	var note string
	if res.RemoveError != "" {
		note = "promoted; the removal right after it failed: " + res.RemoveError
	}
	step.succeeded(res.Changed, note)
	return http.StatusOK, res, nil
}

// removal is a removal prepared to follow a promotion at once.
type removal struct {
	target *memberView
	client *clientv3.Client
	undo   func()
}

// prepareRemovalAfterPromotion does everything the removal of name needs
// before the promotion of learner is sent: the removal's checks on the
// membership as it will be after the promotion, the tombstone, and the
// grace for status polls. A move between two sites passes through one tie
// (no site holds a majority) between the promotion and the removal, and
// every linearizable request in a tie crosses the link; prepared so, the
// tie lasts the removal's own commit. Nothing is changed when it refuses.
func (s *Server) prepareRemovalAfterPromotion(ctx context.Context, v *view, learner *memberView, name string) (*removal, *Error) {
	if e := validateName("thenRemove", name); e != nil {
		return nil, e
	}
	target := v.find(name)
	switch {
	case target == nil:
		return nil, memberNotFound(name)
	case target == learner:
		return nil, &Error{StatusCode: http.StatusBadRequest, Reason: ReasonInvalidArgument,
			Message: fmt.Sprintf("thenRemove names %q, the learner being promoted", name)}
	case target.pb.ID == v.leaderID:
		return nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonIsLeader,
			Message: fmt.Sprintf("member %q (%s) is the leader; move leadership to another voter first (POST /v1/leader)", name, target.api.ID)}
	}
	// The voters after both changes: the promoted learner in, the target
	// out.
	var others []*memberView
	for _, m := range v.voters() {
		if m != target {
			others = append(others, m)
		}
	}
	// etcd counts only started members for the removal
	// (IsReadyToRemoveVotingMember): a learner promoted before it
	// published itself is not one yet.
	healthy := countHealthy(others)
	if learner.api.Healthy {
		healthy++
	}
	if healthy < quorum(len(others)+1) {
		return nil, &Error{StatusCode: http.StatusPreconditionFailed, Reason: ReasonQuorumAtRisk,
			Message: fmt.Sprintf("after promoting %q and removing %q, %d of the %d voters left would be healthy, fewer than a quorum of %d",
				learner.pb.Name, name, healthy, len(others)+1, quorum(len(others)+1))}
	}
	rc, e := s.removalClient(v, target)
	if e != nil {
		return nil, e
	}
	undo, e := s.writeTombstone(ctx, target.pb.ID)
	if e != nil {
		return nil, e
	}
	select {
	case <-time.After(s.cfg.RemovalGrace):
	case <-ctx.Done():
		undo()
		return nil, etcdError("waiting before the removal", ctx.Err())
	}
	return &removal{target: target, client: rc, undo: undo}, nil
}

// finishRemoval sends a prepared removal, as remove does.
func (s *Server) finishRemoval(ctx context.Context, p *removal) (Member, *Error) {
	_, err := p.client.MemberRemove(ctx, p.target.pb.ID)
	switch {
	case err == nil, isEtcdError(err, rpctypes.ErrGRPCMemberNotFound):
		s.afterRemoval(p.target)
		return p.target.api, nil
	case isEtcdError(err, rpctypes.ErrGRPCUnhealthy), isEtcdError(err, rpctypes.ErrGRPCMemberNotEnoughStarted):
		p.undo()
		return Member{}, etcdError("removing the member", err)
	}
	list, lerr := p.client.MemberList(ctx)
	if lerr == nil && !containsID(list.Members, p.target.pb.ID) {
		s.afterRemoval(p.target)
		return p.target.api, nil
	}
	return Member{}, etcdError("removing the member", err)
}

// learnerReady is the promotion rule, the sidecar's early answer before
// etcd's own. etcd puts no time on a promotion: its leader checks that the
// learner's log is at 90 % of its own and refuses with ErrLearnerNotReady
// otherwise (mapped to LearnerNotReady by etcdError), so a learner is sent
// to etcd as soon as it may be ready. A learner that answers must be at
// most MaxLearnerLag entries behind the leader. One that does not answer
// yet (it has not published itself: after a snapshot etcd retries the
// publish only after its request timeout) must have its raft connected to
// this sidecar's member: the leader's record of a learner that died keeps
// the log it had, and a dead learner promoted would be a voter down.
//
// removalNeedsIt says the removal sent with the promotion (thenRemove)
// needs the new voter counted by etcd's strict reconfiguration check,
// which counts a member connected for MinLearnerHealthy (etcd's 5 s): the
// learner must have been connected or healthy that long, or the removal
// would be refused and the tie the promotion makes would last until then.
func (s *Server) learnerReady(m *memberView, removalNeedsIt bool) *Error {
	notReady := func(retry time.Duration, format string, args ...any) *Error {
		return &Error{StatusCode: http.StatusConflict, Reason: ReasonLearnerNotReady, RetryAfter: max(retry, time.Second),
			Message: fmt.Sprintf("learner %s is not ready: ", memberLabel(m)) + fmt.Sprintf(format, args...)}
	}
	seconds := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	connectedFor := seconds(m.api.ConnectedForSeconds)
	switch {
	case !m.api.Healthy && connectedFor <= 0:
		return notReady(time.Second, "it does not answer (%s), and this sidecar's member has no raft connection to it", m.api.Error)
	case m.api.Healthy && m.api.BehindLeader > s.cfg.MaxLearnerLag:
		return notReady(time.Second, "%d entries behind the leader (at most %d allowed)", m.api.BehindLeader, s.cfg.MaxLearnerLag)
	}
	settled := max(seconds(m.api.HealthyForSeconds), connectedFor)
	if removalNeedsIt && settled < s.cfg.MinLearnerHealthy {
		return notReady(s.cfg.MinLearnerHealthy-settled, "the removal sent with its promotion needs it counted by etcd's strict reconfiguration check, which counts a member connected for %s; it has been healthy or connected for %s",
			s.cfg.MinLearnerHealthy, settled.Round(time.Millisecond))
	}
	return nil
}

// removalNeedsLearner tells whether removing the voter named name right
// after learner's promotion needs learner counted by etcd's strict
// reconfiguration check: the other voters that stay, healthy and healthy
// or connected to this sidecar's member for MinLearnerHealthy, make no
// quorum without it. That check runs on this sidecar's member, which takes
// the removal. A name that is no voter needs no count (a learner's removal
// skips the check; an unknown one is refused before anything changes).
func (s *Server) removalNeedsLearner(v *view, learner *memberView, name string) bool {
	target := v.find(name)
	if target == nil || target == learner || target.pb.IsLearner {
		return false
	}
	voters := v.voters() // the voters after both changes: the same number
	counted := 0
	for _, m := range voters {
		settled := time.Duration(max(m.api.HealthyForSeconds, m.api.ConnectedForSeconds) * float64(time.Second))
		if m != target && m.api.Healthy && settled >= s.cfg.MinLearnerHealthy {
			counted++
		}
	}
	return counted < quorum(len(voters))
}

func memberLabel(m *memberView) string {
	if m.pb.Name == "" {
		return fmt.Sprintf("%s (unstarted)", m.api.ID)
	}
	return fmt.Sprintf("%q (%s)", m.pb.Name, m.api.ID)
}

// remove answers DELETE /v1/members/{name}.
func (s *Server) remove(r *http.Request) (int, any, *Error) {
	name := r.PathValue("name")
	if e := validateName("member name", name); e != nil {
		return 0, nil, e
	}
	ctx, v, done, e := s.beginChange(r, true, true)
	if e != nil {
		return 0, nil, e
	}
	defer done()
	target := v.find(name)
	if target == nil {
		return http.StatusOK, ChangeResult{Member: Member{Name: name, PeerURLs: []string{}, ClientURLs: []string{}}}, nil
	}
	if e := checkFingerprint(r, v); e != nil {
		return 0, nil, e
	}
	var others []*memberView // voters left after the removal
	for _, m := range v.voters() {
		if m != target {
			others = append(others, m)
		}
	}
	if !target.pb.IsLearner {
		if target.pb.ID == v.leaderID {
			return 0, nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonIsLeader,
				Message: fmt.Sprintf("member %q (%s) is the leader; move leadership to another voter first (POST /v1/leader)", name, target.api.ID)}
		}
		// Project the cluster after the removal: the voters left must keep
		// a healthy quorum, or the cluster stops taking writes.
		if healthy := countHealthy(others); healthy < quorum(len(others)) {
			return 0, nil, &Error{StatusCode: http.StatusPreconditionFailed, Reason: ReasonQuorumAtRisk,
				Message: fmt.Sprintf("after removing %q, %d of the %d voters left would be healthy, fewer than a quorum of %d", name, healthy, len(others), quorum(len(others)))}
		}
	}
	rc, e := s.removalClient(v, target)
	if e != nil {
		return 0, nil, e
	}
	step, e := s.fence(ctx, r, v, StepRecord{Kind: StepRemove, Target: name})
	if e != nil {
		return 0, nil, e
	}
	res, e := s.sendRemoval(ctx, rc, target)
	if e != nil {
		step.failed(e)
		return 0, nil, e
	}
	step.succeeded(res.Changed, "")
	return http.StatusOK, res, nil
}

// sendRemoval removes target through rc, with the tombstone that keeps the
// status polls off it while it applies its own removal.
func (s *Server) sendRemoval(ctx context.Context, rc *clientv3.Client, target *memberView) (ChangeResult, *Error) {
	undo, e := s.writeTombstone(ctx, target.pb.ID)
	if e != nil {
		return ChangeResult{}, e
	}
	// Status polls that read the tombstones just before our write must
	// have started before the removal is applied (etcd issue 21966).
	select {
	case <-time.After(s.cfg.RemovalGrace):
	case <-ctx.Done():
		undo()
		return ChangeResult{}, etcdError("waiting before the removal", ctx.Err())
	}
	_, err := rc.MemberRemove(ctx, target.pb.ID)
	switch {
	case err == nil:
		s.afterRemoval(target)
		return ChangeResult{Member: target.api, Changed: true}, nil
	case isEtcdError(err, rpctypes.ErrGRPCMemberNotFound):
		return ChangeResult{Member: target.api}, nil
	case isEtcdError(err, rpctypes.ErrGRPCUnhealthy), isEtcdError(err, rpctypes.ErrGRPCMemberNotEnoughStarted):
		// A definite refusal: nothing changed, polling may resume.
		undo()
		return ChangeResult{}, etcdError("removing the member", err)
	}
	// An ambiguous failure (a timeout, a lost connection): the removal may
	// have gone through. Ask the other voters; the tombstone stays until
	// its lease ends either way, since the removal may still be applied.
	list, lerr := rc.MemberList(ctx)
	if lerr == nil && !containsID(list.Members, target.pb.ID) {
		s.afterRemoval(target)
		return ChangeResult{Member: target.api, Changed: true}, nil
	}
	return ChangeResult{}, etcdError("removing the member", err)
}

// removalClient picks who takes a removal. Never the member it removes: that
// one answers "server stopped" even when the removal went through, and must
// not be asked anything while it applies it. The local member when it is a
// healthy voter (no extra hop), else the leader, which the target is not.
func (s *Server) removalClient(v *view, target *memberView) (*clientv3.Client, *Error) {
	s.mu.Lock()
	localID := s.localID
	s.mu.Unlock()
	var leader *memberView
	for _, m := range v.voters() {
		if m == target || !m.api.Healthy {
			continue
		}
		if m.pb.ID == localID {
			return s.local, nil
		}
		if m.pb.ID == v.leaderID {
			leader = m
		}
	}
	if leader == nil {
		return nil, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonUnhealthyCluster, RetryAfter: time.Second,
			Message: fmt.Sprintf("no healthy leader other than %q can take the removal", target.pb.Name)}
	}
	c, err := s.memberConn(leader.pb)
	if err != nil {
		return nil, etcdError("connecting to the leader", err)
	}
	return c, nil
}

// writeTombstone marks a member as being removed, so that no sidecar polls
// it any more: etcd 3.6 crashes a member that answers Status while applying
// its own removal (etcd issue 21966). The returned undo clears the mark
// after a definite refusal.
func (s *Server) writeTombstone(ctx context.Context, id uint64) (func(), *Error) {
	key := tombstonePrefix + formatID(id)
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		var lease clientv3.LeaseID
		if lease, err = s.tombstoneLease(ctx, attempt > 0); err != nil {
			break
		}
		err = s.withCluster(ctx, func(c *clientv3.Client) error {
			_, err := c.Put(ctx, key, time.Now().UTC().Format(time.RFC3339), clientv3.WithLease(lease))
			return err
		})
		if !isEtcdError(err, rpctypes.ErrGRPCLeaseNotFound) {
			break
		}
	}
	if err != nil {
		return nil, etcdError("writing the removal tombstone", err)
	}
	s.mu.Lock()
	s.removalsSent[id] = time.Now().Add(s.cfg.TombstoneTTL)
	if c, ok := s.memberConns[id]; ok {
		_ = c.client.Close()
		delete(s.memberConns, id)
	}
	delete(s.healthySince, id)
	s.mu.Unlock()
	undo := func() {
		s.mu.Lock()
		delete(s.removalsSent, id)
		s.mu.Unlock()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RequestTimeout)
		defer cancel()
		err := s.withCluster(dctx, func(c *clientv3.Client) error {
			_, err := c.Delete(dctx, key)
			return err
		})
		if err != nil {
			s.log.V(1).Info("deleting a tombstone failed; it expires on its own", "key", key, "error", err.Error())
		}
	}
	return undo, nil
}

// tombstoneLease is one lease shared by this sidecar's tombstones while it
// has at least half of TombstoneTTL left, which saves a lease grant (a round
// trip to the leader) on most removals.
func (s *Server) tombstoneLease(ctx context.Context, fresh bool) (clientv3.LeaseID, error) {
	s.mu.Lock()
	l := s.tombstones
	s.mu.Unlock()
	if !fresh && l.id != 0 && time.Since(l.granted) < s.cfg.TombstoneTTL/2 {
		return l.id, nil
	}
	ttl := int64(max(s.cfg.TombstoneTTL/time.Second, 1))
	var lease *clientv3.LeaseGrantResponse
	granted := time.Now()
	err := s.withCluster(ctx, func(c *clientv3.Client) (err error) {
		lease, err = c.Grant(ctx, ttl)
		return err
	})
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.tombstones = tombstoneLease{id: lease.ID, granted: granted}
	s.mu.Unlock()
	return lease.ID, nil
}

// afterRemoval drops the removed member from the fallback client at once,
// before the next observation would.
func (s *Server) afterRemoval(m *memberView) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.memberConns[m.pb.ID]; ok {
		_ = c.client.Close()
		delete(s.memberConns, m.pb.ID)
	}
	eps := slices.DeleteFunc(slices.Clone(s.peerEndpoints), func(u string) bool { return slices.Contains(m.pb.ClientURLs, u) })
	if s.peers != nil && len(eps) > 0 && len(eps) != len(s.peerEndpoints) {
		s.peerEndpoints = eps
		s.peers.SetEndpoints(eps...)
	}
}

// moveLeader answers POST /v1/leader.
func (s *Server) moveLeader(r *http.Request) (int, any, *Error) {
	var req LeaderRequest
	if e := decodeJSON(r, &req); e != nil {
		return 0, nil, e
	}
	if e := validateName("name", req.Name); e != nil {
		return 0, nil, e
	}
	setTarget(r, req.Name)
	// The member list and the lock first; every member's health only when
	// the fast path below does not apply. Not fenced (fence.go). On the
	// leader they are read from its own state: the callers hold the
	// members' clients while this call runs, and two read indexes across
	// sites cost a round trip of that hold. A leader that is not one any
	// more fails the transfer (etcd serves MoveLeader on the leader only),
	// and a view it read a moment late fails the fingerprint check; either
	// way the caller plans again.
	lctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	led, _ := s.localLeads(lctx)
	cancel()
	ctx, v, done, e := s.beginChangeWith(r, observeOptions{local: led})
	if e != nil {
		return 0, nil, e
	}
	defer done()
	if e := checkTransferee(v, req.Name); e != nil {
		return 0, nil, e
	}
	if e := checkFingerprint(r, v); e != nil {
		return 0, nil, e
	}
	// Callers hold the members' clients for the transfer (see
	// ClientHold), so its checks should not cost a round trip to every
	// member, across sites. When the local member leads and the background
	// poll found the target healthy a moment ago, the transfer goes out at
	// once; otherwise every member is polled now.
	target := v.find(req.Name)
	if led, err := s.localLeads(ctx); err == nil && led && s.healthyWithin(target.pb.ID, 2*s.cfg.PollInterval) {
		if target.pb.ID == s.localIDNow() {
			return http.StatusOK, ChangeResult{Member: target.api}, nil
		}
		if _, err := s.local.MoveLeader(ctx, target.pb.ID); err != nil {
			return 0, nil, etcdError("moving leadership", err)
		}
		s.recordLeaderMove(r, v, req.Name)
		out := target.api
		out.IsLeader, out.Healthy = true, true
		return http.StatusOK, ChangeResult{Member: out, Changed: true}, nil
	}
	v, err := s.observe(ctx, observeOptions{health: true})
	if err != nil {
		return 0, nil, etcdError("reading the membership", err)
	}
	if e := s.checkLock(ctx, r, v); e != nil {
		return 0, nil, e
	}
	if e := checkTransferee(v, req.Name); e != nil {
		return 0, nil, e
	}
	if e := checkFingerprint(r, v); e != nil {
		return 0, nil, e
	}
	target = v.find(req.Name)
	if target.api.IsLeader {
		return http.StatusOK, ChangeResult{Member: target.api}, nil
	}
	if !target.api.Healthy {
		return 0, nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonMemberUnhealthy, RetryAfter: time.Second,
			Message: fmt.Sprintf("member %q (%s) is not healthy (%s); leadership cannot move to it", req.Name, target.api.ID, target.api.Error)}
	}
	var leader *memberView
	for _, m := range v.members {
		if m.pb.ID == v.leaderID && m.api.Healthy {
			leader = m
		}
	}
	if leader == nil {
		return 0, nil, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonUnhealthyCluster, RetryAfter: time.Second,
			Message: "the cluster has no healthy leader to hand leadership over"}
	}
	// MoveLeader is served only by the leader itself.
	lc, err := s.memberConn(leader.pb)
	if err != nil {
		return 0, nil, etcdError("connecting to the leader", err)
	}
	if _, err := lc.MoveLeader(ctx, target.pb.ID); err != nil {
		return 0, nil, etcdError("moving leadership", err)
	}
	s.recordLeaderMove(r, v, req.Name)
	out := target.api
	out.IsLeader = true
	return http.StatusOK, ChangeResult{Member: out, Changed: true}, nil
}

// checkTransferee refuses a leader transfer to a member that is not in v
// or does not vote.
func checkTransferee(v *view, name string) *Error {
	target := v.find(name)
	switch {
	case target == nil:
		return memberNotFound(name)
	case target.pb.IsLearner:
		return &Error{StatusCode: http.StatusConflict, Reason: ReasonNotVoter,
			Message: fmt.Sprintf("member %q (%s) is a learner; promote it before moving leadership to it", name, target.api.ID)}
	}
	return nil
}

// localLeads asks the local member whether it leads; a member whose
// removal is under way is not asked (localStatus) and answers an error.
func (s *Server) localLeads(ctx context.Context) (bool, error) {
	st, err := s.localStatus(ctx)
	if err != nil {
		return false, err
	}
	return st.Header != nil && st.Leader != 0 && st.Leader == st.Header.MemberId, nil
}

// localIDNow is the local member's ID as last learned (0 before).
func (s *Server) localIDNow() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.localID
}

// healthyWithin tells whether the last poll of the member, no longer than
// age ago, found it healthy (a poll that finds it unhealthy, or being
// removed, forgets its entry).
func (s *Server) healthyWithin(id uint64, age time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.lastHealthy[id]
	return ok && age > 0 && time.Since(at) <= age
}

// checkFingerprint refuses a change planned from another membership than
// etcd's current one (two controllers, or a stale plan).
func checkFingerprint(r *http.Request, v *view) *Error {
	want := r.Header.Get(HeaderMembership)
	if want == "" {
		return nil
	}
	if got := v.fingerprint(); !strings.EqualFold(want, got) {
		return &Error{StatusCode: http.StatusConflict, Reason: ReasonMembershipChanged,
			Message: fmt.Sprintf("the change was planned from membership %s, but etcd's membership is now %s; observe again and re-plan", want, got)}
	}
	return nil
}

func memberNotFound(name string) *Error {
	return &Error{StatusCode: http.StatusNotFound, Reason: ReasonMemberNotFound,
		Message: fmt.Sprintf("no member named %q (nor with that hex ID) in the cluster", name)}
}

func quorum(voters int) int { return voters/2 + 1 }

func countHealthy(ms []*memberView) int {
	n := 0
	for _, m := range ms {
		if m.api.Healthy {
			n++
		}
	}
	return n
}

func containsID[M interface{ GetID() uint64 }](ms []M, id uint64) bool {
	for _, m := range ms {
		if m.GetID() == id {
			return true
		}
	}
	return false
}

func isEtcdError(err, want error) bool {
	return err != nil && rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(want)
}

// etcdError maps an etcd client error onto the sidecar's reasons. etcd's
// answers that mean "nothing changed, try later" carry a retry hint.
func etcdError(doing string, err error) *Error {
	mk := func(code int, reason string, retry time.Duration) *Error {
		return &Error{StatusCode: code, Reason: reason, RetryAfter: retry, Message: fmt.Sprintf("%s: %s", doing, rpctypes.ErrorDesc(err))}
	}
	switch {
	case isEtcdError(err, rpctypes.ErrGRPCUnhealthy), isEtcdError(err, rpctypes.ErrGRPCMemberNotEnoughStarted):
		return mk(http.StatusServiceUnavailable, ReasonUnhealthyCluster, etcdHealthInterval)
	case isEtcdError(err, rpctypes.ErrGRPCNoLeader), isEtcdError(err, rpctypes.ErrGRPCNotLeader),
		isEtcdError(err, rpctypes.ErrGRPCLeaderChanged), isEtcdError(err, rpctypes.ErrGRPCTimeoutDueToLeaderFail):
		return mk(http.StatusServiceUnavailable, ReasonUnhealthyCluster, time.Second)
	case isEtcdError(err, rpctypes.ErrGRPCTooManyLearners):
		return mk(http.StatusConflict, ReasonTooManyLearners, 0)
	case isEtcdError(err, rpctypes.ErrGRPCPeerURLExist):
		return mk(http.StatusConflict, ReasonPeerURLConflict, 0)
	case isEtcdError(err, rpctypes.ErrGRPCLearnerNotReady):
		return mk(http.StatusConflict, ReasonLearnerNotReady, time.Second)
	case isEtcdError(err, rpctypes.ErrGRPCMemberBadURLs):
		return mk(http.StatusBadRequest, ReasonInvalidURL, 0)
	case isEtcdError(err, rpctypes.ErrGRPCMemberNotFound):
		return mk(http.StatusNotFound, ReasonMemberNotFound, 0)
	case isEtcdError(err, rpctypes.ErrGRPCBadLeaderTransferee):
		return mk(http.StatusConflict, ReasonMemberUnhealthy, time.Second)
	case isEtcdError(err, rpctypes.ErrGRPCNoSpace):
		e := mk(http.StatusServiceUnavailable, ReasonNoSpace, 5*time.Second)
		e.Message += " (etcd's NOSPACE alarm is raised: it takes no writes until its backend is compacted and defragmented and the alarm disarmed, etcdctl alarm disarm)"
		return e
	}
	// Timeouts, lost connections and anything unforeseen.
	return mk(http.StatusServiceUnavailable, ReasonEtcdUnavailable, time.Second)
}

// beginChange serializes this sidecar's mutating calls and reads the
// membership the change is decided on, refusing a caller that names itself
// but does not hold the membership lock. fenced says the change goes
// through the fence (fence.go), which needs the lock's remaining time. The
// caller calls done when the change is over.
func (s *Server) beginChange(r *http.Request, health, fenced bool) (ctx context.Context, v *view, done func(), e *Error) {
	// The fence needs the lock's remaining time when the caller holds it.
	return s.beginChangeWith(r, observeOptions{health: health, transport: health, lockTTL: fenced && r.Header.Get(HeaderLockHolder) != ""})
}

// beginChangeWith is beginChange observing with o.
func (s *Server) beginChangeWith(r *http.Request, o observeOptions) (ctx context.Context, v *view, done func(), e *Error) {
	s.mutations.Lock()
	// A change once sent runs to its end even if the caller hangs up (a
	// controller killed mid-call): its record then tells how it ended.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.RequestTimeout)
	done = func() { cancel(); s.mutations.Unlock() }
	v, err := s.observe(ctx, o)
	if err != nil {
		done()
		return nil, nil, nil, etcdError("reading the membership", err)
	}
	if e := s.checkLock(ctx, r, v); e != nil {
		done()
		return nil, nil, nil, e
	}
	return ctx, v, done, nil
}
