package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"
)

// Keys the sidecars keep in the etcd cluster they manage: the one store that
// both Kubernetes clusters of a stretched etcd share.
const (
	keyPrefix          = "/druid-stretch/"
	lockKey            = keyPrefix + "lock"
	tombstonePrefix    = keyPrefix + "removing/"
	tombstoneStaleness = 250 * time.Millisecond
)

// view is one observation of the cluster: etcd's member list, the removals
// in flight, the lock key, and each member's health as polled just now.
type view struct {
	clusterID uint64
	leaderID  uint64
	members   []*memberView // sorted by name, then ID
	lock      *mvccpb.KeyValue
	// step is the record of the latest change (fence.go).
	step *mvccpb.KeyValue
	// lockStatus is the lock with its remaining lease time, when asked for.
	lockStatus *LockStatus
	// transportOf and transportError say whose transport the members'
	// ConnectedForSeconds describe (MemberList.TransportOf).
	transportOf, transportError string
}

type memberView struct {
	pb     *pb.Member
	status *pb.StatusResponse
	api    Member
}

func (v *view) fingerprint() string { return Fingerprint(v.apiMembers()) }

func (v *view) apiMembers() []Member {
	out := make([]Member, len(v.members))
	for i, m := range v.members {
		out[i] = m.api
	}
	return out
}

// find looks a member up by name, and failing that by hex ID: a learner that
// has not started has no name yet.
func (v *view) find(nameOrID string) *memberView {
	for _, m := range v.members {
		if m.pb.Name == nameOrID {
			return m
		}
	}
	for _, m := range v.members {
		if m.api.ID == strings.ToLower(nameOrID) {
			return m
		}
	}
	return nil
}

func (v *view) voters() []*memberView {
	var out []*memberView
	for _, m := range v.members {
		if !m.pb.IsLearner {
			out = append(out, m)
		}
	}
	return out
}

func formatID(id uint64) string { return strconv.FormatUint(id, 16) }

// memberConn is a connection to one member, kept open between polls so that
// a GET does not pay a TLS handshake per member.
type memberConn struct {
	urls   []string
	client *clientv3.Client
}

// pollHealth polls in the background so that "healthy for N seconds" means
// without interruption, even when nobody calls GET /v1/members.
func (s *Server) pollHealth(ctx context.Context) {
	defer close(s.pollingDone)
	if s.cfg.PollInterval < 0 {
		return
	}
	t := time.NewTicker(s.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
		// The transport first: the observation reports it, and a learner
		// is watched from its first poll on.
		s.scrapeTransport(pctx)
		if _, err := s.observe(pctx, observeOptions{health: true}); err != nil && ctx.Err() == nil {
			s.log.V(1).Info("background health poll failed", "error", err.Error())
		}
		cancel()
	}
}

// observeOptions say how much an observation needs beyond the member list,
// the lock and the step record (read linearizably, concurrently).
type observeOptions struct {
	// health polls every member that is not being removed.
	health bool
	// lockTTL reads how long the lock's lease has left (a GET shows it).
	lockTTL bool
	// transport scrapes the local member's raft transport alongside the
	// member list when the view is older than transportFresh.
	transport bool
	// local reads the member list and the lock from the local member,
	// serializable: no read index, which on a leader whose quorum is
	// across a WAN costs a round trip. Only for a local member that leads:
	// its applied state is the cluster's, but for entries in flight.
	local bool
}

// observe reads the member list and the lock, then the tombstones, then
// polls every member that is not being removed.
func (s *Server) observe(ctx context.Context, o observeOptions) (*view, error) {
	began := time.Now()
	var (
		list          *clientv3.MemberListResponse
		lock, step    *mvccpb.KeyValue
		listErr, lErr error
		wg            sync.WaitGroup
	)
	wg.Go(func() {
		if o.local {
			list, listErr = s.local.MemberList(ctx, clientv3.WithSerializable())
			return
		}
		listErr = s.readCluster(ctx, func(c *clientv3.Client) (err error) {
			list, err = c.MemberList(ctx)
			return err
		})
	})
	wg.Go(func() {
		if o.local {
			lock, step, lErr = readLockAndStepWith(ctx, s.local, clientv3.WithSerializable())
			return
		}
		lock, step, lErr = s.readLockAndStep(ctx)
	})
	if o.transport {
		// Local and quick next to the member list (a round trip to the
		// leader on a follower); done before the polls below, which count
		// each member's connected time from it.
		wg.Go(func() { s.scrapeTransportIfStale(ctx) })
	}
	wg.Wait()
	if listErr != nil {
		return nil, fmt.Errorf("listing members: %w", listErr)
	}
	if lErr != nil {
		return nil, fmt.Errorf("reading the membership lock: %w", lErr)
	}
	v := &view{clusterID: list.Header.GetClusterId(), lock: lock, step: step}
	for _, m := range list.Members {
		v.members = append(v.members, &memberView{pb: m, api: Member{
			ID:         formatID(m.ID),
			Name:       m.Name,
			PeerURLs:   orEmpty(m.PeerURLs),
			ClientURLs: orEmpty(m.ClientURLs),
			IsLearner:  m.IsLearner,
		}})
	}
	sort.Slice(v.members, func(i, j int) bool {
		a, b := v.members[i].pb, v.members[j].pb
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.ID < b.ID
	})
	if o.lockTTL && v.lock != nil {
		wg.Go(func() { v.lockStatus = s.lockStatus(ctx, v.lock) })
	}
	removing := s.removingIDs(nil)
	if o.health {
		// Connections are made first and tombstones read last, right
		// before the polls start, to keep the window in which a removal
		// can begin unseen as short as possible.
		conns := make([]*clientv3.Client, len(v.members))
		connErrs := make([]error, len(v.members))
		for i, m := range v.members {
			if len(m.pb.ClientURLs) > 0 {
				conns[i], connErrs[i] = s.memberConn(m.pb)
			}
		}
		tombstones, err := s.readTombstones(ctx)
		if err != nil {
			wg.Wait()
			return nil, fmt.Errorf("reading the removal tombstones: %w", err)
		}
		readAt := time.Now()
		removing = s.removingIDs(tombstones)
		s.pollMembers(ctx, v, removing, conns, connErrs, readAt)
	}
	wg.Wait()
	s.noteView(v, removing)
	if o.health {
		s.settleDrain(v, removing, began)
	}
	return v, nil
}

// readTombstones reads the removals in flight from the local member with a
// serializable read: it costs no round trip to the leader, and a tombstone
// reaches every member within one replication (the leader sends the commit
// at once) while a removal waits RemovalGrace after writing it. When the
// local member does not answer, the cluster answers.
func (s *Server) readTombstones(ctx context.Context) ([]*mvccpb.KeyValue, error) {
	s.mu.Lock()
	_, localRemoving := s.removalsSent[s.localID]
	localRemoving = localRemoving && s.localID != 0
	s.mu.Unlock()
	if !localRemoving && s.local.ActiveConnection().GetState() != connectivity.TransientFailure {
		lctx, cancel := context.WithTimeout(ctx, s.cfg.StatusTimeout)
		resp, err := s.local.Get(lctx, tombstonePrefix, clientv3.WithPrefix(), clientv3.WithSerializable())
		cancel()
		if err == nil {
			return resp.Kvs, nil
		}
	}
	var resp *clientv3.GetResponse
	err := s.readCluster(ctx, func(c *clientv3.Client) (err error) {
		resp, err = c.Get(ctx, tombstonePrefix, clientv3.WithPrefix())
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.Kvs, nil
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// removingIDs merges the tombstones in etcd (written by any sidecar) with
// the removals this sidecar sent, which stay unpolled even if the tombstone
// read failed or was written elsewhere after it.
func (s *Server) removingIDs(kvs []*mvccpb.KeyValue) map[uint64]bool {
	out := map[uint64]bool{}
	for _, kv := range kvs {
		if rest, ok := strings.CutPrefix(string(kv.Key), tombstonePrefix); ok {
			if id, err := strconv.ParseUint(rest, 16, 64); err == nil {
				out[id] = true
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for id, until := range s.removalsSent {
		if now.After(until) {
			delete(s.removalsSent, id)
			continue
		}
		out[id] = true
	}
	return out
}

// noteView keeps the connections in line with the membership: it learns
// whether the local member is a learner, points the fallback client at the
// other voters, and closes connections to members that left or are being
// removed.
func (s *Server) noteView(v *view, removing map[uint64]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var eps []string
	present := map[uint64]bool{}
	s.localLed = s.localID != 0 && v.leaderID == s.localID
	for _, m := range v.members {
		present[m.pb.ID] = true
		if m.pb.ID == s.localID {
			s.localLearner = m.pb.IsLearner
		}
		if !m.pb.IsLearner && !removing[m.pb.ID] && m.pb.ID != s.localID {
			eps = append(eps, m.pb.ClientURLs...)
		}
	}
	for id, c := range s.memberConns {
		if !present[id] || removing[id] {
			_ = c.client.Close()
			delete(s.memberConns, id)
		}
	}
	for id := range s.healthySince {
		if !present[id] || removing[id] {
			delete(s.healthySince, id)
			delete(s.lastHealthy, id)
		}
	}
	if len(eps) == 0 || slices.Equal(eps, s.peerEndpoints) || s.closed {
		return
	}
	s.peerEndpoints = eps
	if s.peers != nil {
		s.peers.SetEndpoints(eps...)
		return
	}
	if c, err := newEtcdClient(eps, &s.cfg); err == nil {
		s.peers = c
	}
}

// pollMembers asks every member that is not being removed for its status,
// concurrently, and fills in health, leader and lag.
func (s *Server) pollMembers(ctx context.Context, v *view, removing map[uint64]bool, conns []*clientv3.Client, connErrs []error, readAt time.Time) {
	var wg sync.WaitGroup
	errs := make([]string, len(v.members))
	var progress *raftProgress
	wg.Go(func() {
		// The leader's word on the members whose polls find no client
		// port; a member that does not lead has none to give, and etcd
		// stops the world for a moment to serve /debug/vars (its Go
		// memory statistics), so only a member seen leading is asked.
		s.mu.Lock()
		led := s.localLed
		s.mu.Unlock()
		if !led {
			return
		}
		pctx, cancel := context.WithTimeout(ctx, s.cfg.StatusTimeout)
		defer cancel()
		p, err := s.readRaftProgress(pctx)
		if err != nil {
			s.log.V(1).Info("cannot read the local member's raft status; this poll reports no member as replicating", "error", err.Error())
			return
		}
		progress = p
	})
	for i, m := range v.members {
		switch {
		case removing[m.pb.ID]:
			errs[i] = "being removed"
			continue
		case len(m.pb.ClientURLs) == 0:
			errs[i] = "not started"
			continue
		case connErrs[i] != nil:
			errs[i] = connErrs[i].Error()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A poll that starts long after the tombstone read (a starved
			// CPU) could hit a member whose removal began since.
			if time.Since(readAt) > tombstoneStaleness {
				errs[i] = "not polled: the tombstone read is stale"
				return
			}
			pctx, cancel := context.WithTimeout(ctx, s.cfg.StatusTimeout)
			defer cancel()
			st, err := pb.NewMaintenanceClient(conns[i].ActiveConnection()).Status(pctx, &pb.StatusRequest{})
			switch {
			case err != nil:
				errs[i] = rpctypes.ErrorDesc(err)
			case len(st.Errors) > 0:
				errs[i] = strings.Join(st.Errors, "; ")
				m.status = st
			case st.Leader == 0:
				errs[i] = "no leader"
				m.status = st
			default:
				m.status = st
			}
		}()
	}
	wg.Wait()

	v.leaderID = leaderOf(v)
	var leaderIndex uint64
	for _, m := range v.members {
		if m.pb.ID == v.leaderID && m.status != nil {
			leaderIndex = m.status.RaftIndex
		}
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range v.members {
		a := &m.api
		a.IsLeader = m.pb.ID == v.leaderID
		a.Healthy = errs[i] == ""
		a.Error = errs[i]
		a.Unanswered = !a.Healthy && m.status == nil
		if m.status != nil {
			a.RaftIndex = m.status.RaftIndex
			a.RaftAppliedIndex = m.status.RaftAppliedIndex
		}
		if leaderIndex > a.RaftIndex {
			a.BehindLeader = leaderIndex - a.RaftIndex
		}
		var healthyFor time.Duration
		if a.Healthy {
			s.lastHealthy[m.pb.ID] = now
			since, ok := s.healthySince[m.pb.ID]
			if !ok {
				since = now
				s.healthySince[m.pb.ID] = now
			}
			healthyFor = now.Sub(since)
		} else {
			delete(s.healthySince, m.pb.ID)
			delete(s.lastHealthy, m.pb.ID)
		}
		a.HealthyForSeconds = healthyFor.Seconds()
		if !removing[m.pb.ID] {
			a.ConnectedForSeconds = s.connectedForLocked(m.pb.ID, healthyFor, now).Seconds()
			leads := m.pb.ID != s.localID && progress != nil && progress.id == s.localID && progress.id == v.leaderID
			a.Replicating = leads && progress.replicating(m.pb.ID) && a.ConnectedForSeconds > 0
			a.BehindAtLeader = leads && progress.behind(m.pb.ID)
		}
	}
	if s.transport.of != 0 && s.transport.of == s.localID {
		v.transportOf = formatID(s.transport.of)
	}
	v.transportError = s.transport.failed
}

// leaderOf trusts a member that reports itself as leader; failing that, the
// leader most members report.
func leaderOf(v *view) uint64 {
	votes := map[uint64]int{}
	for _, m := range v.members {
		if m.status == nil || m.status.Leader == 0 {
			continue
		}
		if m.status.Leader == m.pb.ID {
			return m.pb.ID
		}
		votes[m.status.Leader]++
	}
	var best uint64
	for id, n := range votes {
		if n > votes[best] || (n == votes[best] && id < best) {
			best = id
		}
	}
	return best
}

func (s *Server) memberConn(m *pb.Member) (*clientv3.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("sidecar closed")
	}
	if c, ok := s.memberConns[m.ID]; ok {
		if slices.Equal(c.urls, m.ClientURLs) {
			return c.client, nil
		}
		_ = c.client.Close()
		delete(s.memberConns, m.ID)
	}
	c, err := newEtcdClient(m.ClientURLs, &s.cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to %v: %w", m.ClientURLs, err)
	}
	s.memberConns[m.ID] = &memberConn{urls: slices.Clone(m.ClientURLs), client: c}
	return c, nil
}

func (s *Server) noteLocalID(id uint64) {
	if id == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.localID = id
}

// clusterClient picks the client for cluster-wide calls: the local member,
// unless it is a learner (which serves no membership or linearizable calls)
// or is being removed, in which case the other voters.
func (s *Server) clusterClient() *clientv3.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, removing := s.removalsSent[s.localID]
	if s.peers != nil && s.localID != 0 && (s.localLearner || removing) {
		return s.peers
	}
	return s.local
}

// withCluster runs fn on the cluster client, and once more on the other
// voters when the local member turns out to be a learner. The retry is safe
// for any call: a learner refuses before anything is applied.
func (s *Server) withCluster(ctx context.Context, fn func(c *clientv3.Client) error) error {
	c := s.clusterClient()
	err := fn(c)
	if err == nil || c != s.local || rpctypes.ErrorDesc(err) != rpctypes.ErrorDesc(rpctypes.ErrGRPCNotSupportedForLearner) {
		if err == nil && c == s.local {
			s.learnLocalID(ctx)
		}
		return err
	}
	s.mu.Lock()
	s.localLearner = true
	peers := s.peers
	s.mu.Unlock()
	s.learnLocalID(ctx)
	if peers == nil {
		return fmt.Errorf("the local member is a learner and serves no membership calls, and no voter is known; list voters' client URLs after the local one in the endpoints: %w", err)
	}
	return fn(peers)
}

// readCluster is withCluster for reads, which also go to the other voters
// while the connection to the local member is down (its process stopped, or
// it was removed): without this a read would wait for its whole timeout on
// a member that cannot answer. A read applies nothing, so where it goes does
// not matter for safety.
func (s *Server) readCluster(ctx context.Context, fn func(c *clientv3.Client) error) error {
	s.mu.Lock()
	peers := s.peers
	s.mu.Unlock()
	if peers != nil && s.local.ActiveConnection().GetState() == connectivity.TransientFailure {
		return fn(peers)
	}
	return s.withCluster(ctx, fn)
}

// learnLocalID asks the local member for its ID once, with a serializable
// read that learners serve too.
func (s *Server) learnLocalID(ctx context.Context) {
	s.mu.Lock()
	known := s.localID != 0
	s.mu.Unlock()
	if known {
		return
	}
	if resp, err := s.local.Get(ctx, keyPrefix, clientv3.WithSerializable(), clientv3.WithCountOnly()); err == nil {
		s.noteLocalID(resp.Header.GetMemberId())
	}
}

// listMembers answers GET /v1/members.
func (s *Server) listMembers(r *http.Request) (int, any, *Error) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	// The records are read alongside the observation: on a follower across
	// a WAN each linearizable read costs a round trip to the leader.
	var (
		retired    []RetiredMember
		retiredErr error
		wg         sync.WaitGroup
	)
	wg.Go(func() { retired, retiredErr = s.retiredMembers(ctx) })
	v, err := s.observe(ctx, observeOptions{health: true, lockTTL: true, transport: true})
	wg.Wait()
	if err != nil {
		return 0, nil, etcdError("reading the membership", err)
	}
	if retiredErr != nil {
		return 0, nil, etcdError("reading the retirement records", retiredErr)
	}
	return http.StatusOK, MemberList{
		Retired:        retired,
		ClusterID:      formatID(v.clusterID),
		LeaderID:       formatID(v.leaderID),
		Fingerprint:    v.fingerprint(),
		Members:        v.apiMembers(),
		TransportOf:    v.transportOf,
		TransportError: v.transportError,
		Lock:           v.lockStatus,
		Step:           parseStep(v.step),
	}, nil
}
