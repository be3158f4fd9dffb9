package sidecar

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/clientgate"
)

// A leader whose pod ends hands its leadership over before etcd stops.
//
// etcd stopped with SIGTERM transfers leadership by itself, but while that
// transfer runs the leader drops every proposal, and the proposals its
// followers forwarded meanwhile are lost without an answer: their clients'
// writes time out after etcd's request timeout (7 s) and kube-apiserver
// fails the request. The controller's planned leader transfer avoids that
// by holding every member's client gate first; a deleted pod gives the
// controller no step to plan. So the leader's sidecar, on its own SIGTERM
// (the webhook delays etcd's by a preStop sleep, webhook.EtcdStopDelay),
// asks the other sidecars through etcd itself, the one store every
// sidecar of the cluster reaches, to hold their gates:
//
//  1. it writes handoffKey, with a short lease, naming itself and the
//     member it hands over to;
//  2. every other sidecar with a gate watches that key: it holds its gate's
//     new calls (at most handoffHold), waits for its proposals in flight,
//     and writes an acknowledgement under handoffAckPrefix with the same
//     lease;
//  3. the leader holds its own gate, waits for the acknowledgements of the
//     other voters (at most handoffAckWait), and moves leadership;
//  4. it revokes the lease, which deletes the key and the
//     acknowledgements; each hold ends once its member sees the new leader,
//     at the key's deletion, or by itself.
//
// A sidecar that does not answer in time costs only its own clients'
// forwarded writes, as without the handoff; the leader moves on.
const (
	handoffKey       = keyPrefix + "handoff"
	handoffAckPrefix = keyPrefix + "handoff-ack/"
	// handoffHold bounds a gate's hold for a handoff: one leader transfer.
	handoffHold = 2 * time.Second
	// handoffAckWait bounds how long the leader waits for the other gates'
	// holds: a watch event and a write, each a round trip between sites.
	handoffAckWait = 1500 * time.Millisecond
	// handoffLeaseSeconds bounds how long the key outlives a leader that
	// dies in the middle.
	handoffLeaseSeconds = 5
	handoffAckPoll      = 10 * time.Millisecond
)

// handoffRecord is handoffKey's value.
type handoffRecord struct {
	// From and To are member IDs in hex, as the member list shows them.
	From  string `json:"from"`
	To    string `json:"to"`
	Lease int64  `json:"lease"`
}

// Handoff is what HandOffLeadership did.
type Handoff struct {
	// From and To name the members: the old leader and the new one.
	From, To string
	// Held is how many other voters' gates held their calls before the
	// transfer, of Voters (the voters other than the old leader).
	Held, Voters int
	// Took is the handoff's time, from the key's write to the transfer's end.
	Took time.Duration
}

// HandOffLeadership moves leadership away from the local member, with
// every reachable member's clients held (see above), when the local member
// leads a cluster with another voter; otherwise it does nothing and
// returns nil. Call it when the pod ends, before etcd stops.
func (s *Server) HandOffLeadership(ctx context.Context) (*Handoff, error) {
	st, err := s.localStatus(ctx)
	if errors.Is(err, errLocalRemoving) {
		return nil, nil // leaving: the planner removes no leader, so it does not lead
	}
	if err != nil {
		return nil, fmt.Errorf("asking the local member whether it leads: %w", err)
	}
	self := st.Header.GetMemberId()
	if st.Leader != self {
		return nil, nil
	}
	list, err := s.local.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the members: %w", err)
	}
	to, others := successor(list.Members, self, s.leavingMembers(ctx))
	if to == nil {
		return nil, nil
	}
	began := time.Now()
	lease, err := s.local.Grant(ctx, handoffLeaseSeconds)
	if err != nil {
		return nil, fmt.Errorf("granting the handoff's lease: %w", err)
	}
	// The lease goes whatever happens: its key and acknowledgements with it.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RequestTimeout)
		defer cancel()
		_, _ = s.local.Revoke(rctx, lease.ID)
	}()
	rec, _ := json.Marshal(handoffRecord{From: memberHex(self), To: memberHex(to.ID), Lease: int64(lease.ID)})
	if _, err := s.local.Put(ctx, handoffKey, string(rec), clientv3.WithLease(lease.ID)); err != nil {
		return nil, fmt.Errorf("asking the other members to hold their clients: %w", err)
	}
	h := &Handoff{From: memberName(list.Members, self), To: to.Name, Voters: len(others)}
	if g := s.cfg.ClientGate; g != nil {
		hctx, cancel := context.WithTimeout(ctx, handoffHold)
		release, err := g.Hold(hctx, handoffHold)
		cancel()
		defer release()
		if err != nil {
			s.log.Info("the local gate's proposals in flight did not end in time; handing over all the same", "error", err.Error())
		}
	}
	h.Held = s.waitHandoffAcks(ctx, others)
	if _, err := s.local.MoveLeader(ctx, to.ID); err != nil {
		return h, fmt.Errorf("moving leadership to %s: %w", h.To, err)
	}
	h.Took = time.Since(began)
	s.log.Info("leadership handed over before etcd stops", "from", h.From, "to", h.To, "heldGates", h.Held, "otherVoters", h.Voters, "took", h.Took.String())
	return h, nil
}

// waitHandoffAcks waits until the gates of the voters others acknowledged
// their hold, or handoffAckWait passed, and returns how many did.
func (s *Server) waitHandoffAcks(ctx context.Context, others []*pb.Member) int {
	ctx, cancel := context.WithTimeout(ctx, handoffAckWait)
	defer cancel()
	t := time.NewTicker(handoffAckPoll)
	defer t.Stop()
	got := 0
	for {
		// Serializable: the local member leads, so it has every
		// acknowledgement that committed.
		resp, err := s.local.Get(ctx, handoffAckPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithSerializable())
		if err == nil {
			got = 0
			for _, kv := range resp.Kvs {
				if slices.ContainsFunc(others, func(m *pb.Member) bool { return handoffAckPrefix+memberHex(m.ID) == string(kv.Key) }) {
					got++
				}
			}
		}
		if got == len(others) {
			return got
		}
		select {
		case <-ctx.Done():
			s.log.Info("not every other voter's gate held its clients in time; handing over all the same", "held", got, "otherVoters", len(others))
			return got
		case <-t.C:
		}
	}
}

// ordinalSuffix ends a member name in druid's pod ordinal.
var ordinalSuffix = regexp.MustCompile(`-[0-9]+$`)

// successor is the member leadership goes to: a started voter other than
// self, one that is not leaving (its clients drained or its removal under
// way) when there is one, then one of the same Etcd (its name without the
// ordinal matches), the lowest name first; and the voters other than self.
// A leaving member would take leadership only to have it moved again
// before its removal, a second transfer while clients write.
func successor(members []*pb.Member, self uint64, leaving map[uint64]bool) (*pb.Member, []*pb.Member) {
	var own string
	for _, m := range members {
		if m.ID == self {
			own = ordinalSuffix.ReplaceAllString(m.Name, "")
		}
	}
	var voters []*pb.Member
	for _, m := range members {
		if m.ID != self && !m.IsLearner && m.Name != "" {
			voters = append(voters, m)
		}
	}
	if len(voters) == 0 {
		return nil, nil
	}
	slices.SortFunc(voters, func(a, b *pb.Member) int {
		if leaving[a.ID] != leaving[b.ID] {
			if leaving[b.ID] {
				return -1
			}
			return 1
		}
		sameA, sameB := ordinalSuffix.ReplaceAllString(a.Name, "") == own, ordinalSuffix.ReplaceAllString(b.Name, "") == own
		if sameA != sameB {
			if sameA {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return voters[0], voters
}

// leavingMembers are the members about to leave, as the local member (the
// leader) knows them: their clients drained for a removal (drainMarks) or
// their removal under way (a tombstone). A read that fails leaves the
// member out of the choice's order, not the handoff out.
func (s *Server) leavingMembers(ctx context.Context) map[uint64]bool {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StatusTimeout)
	defer cancel()
	out, err := s.drainMarks(ctx)
	if err != nil {
		s.log.Info("the members' drain marks could not be read; the handoff's successor may be a drained member", "error", err.Error())
		out = map[uint64]bool{}
	}
	removing, _, err := s.localRemovals(ctx)
	if err != nil {
		s.log.Info("the removal tombstones could not be read; the handoff's successor may be a member being removed", "error", err.Error())
		removing = s.removingIDs(nil)
	}
	for id := range removing {
		out[id] = true
	}
	return out
}

func memberName(members []*pb.Member, id uint64) string {
	for _, m := range members {
		if m.ID == id {
			return m.Name
		}
	}
	return memberHex(id)
}

func memberHex(id uint64) string { return strconv.FormatUint(id, 16) }

// watchHandoffs holds the local gate for every handoff another member's
// sidecar announces (see above), until ctx ends. It runs only with a gate.
func (s *Server) watchHandoffs(ctx context.Context) {
	g := s.cfg.ClientGate
	var release func()
	end := func() {
		if release != nil {
			release()
			release = nil
		}
	}
	defer end()
	for ctx.Err() == nil {
		// A watch of a member that is not up yet waits for it; one that
		// breaks is opened again.
		for resp := range s.local.Watch(clientv3.WithRequireLeader(ctx), handoffKey) {
			if err := resp.Err(); err != nil {
				break
			}
			self := resp.Header.GetMemberId()
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypePut {
					end()
					continue
				}
				var rec handoffRecord
				if err := json.Unmarshal(ev.Kv.Value, &rec); err != nil || rec.From == memberHex(self) {
					continue
				}
				end()
				release = s.holdForHandoff(ctx, g, rec, self)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// holdForHandoff holds the gate for one handoff, acknowledges the hold
// once its proposals in flight ended, and lets the hold end when the local
// member sees the new leader. It returns the hold's release.
func (s *Server) holdForHandoff(ctx context.Context, g *clientgate.Gate, rec handoffRecord, self uint64) func() {
	hctx, cancel := context.WithTimeout(ctx, handoffHold)
	defer cancel()
	release, err := g.Hold(hctx, handoffHold)
	if err != nil {
		s.log.Info("a handoff's hold began, but proposals in flight did not end in time", "error", err.Error())
	}
	if _, err := s.local.Put(hctx, handoffAckPrefix+memberHex(self), "", clientv3.WithLease(clientv3.LeaseID(rec.Lease))); err != nil && !errors.Is(err, context.Canceled) {
		s.log.Info("could not acknowledge a handoff's hold", "from", rec.From, "error", err.Error())
	}
	if to, err := strconv.ParseUint(rec.To, 16, 64); err == nil && to != 0 {
		go s.releaseOnLeader(release, to, handoffHold)
	}
	s.log.V(1).Info("clients held for a leader's handoff", "from", rec.From, "to", rec.To)
	return release
}
