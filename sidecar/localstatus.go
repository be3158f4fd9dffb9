package sidecar

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// errLocalRemoving is why the local member is not asked for its status:
// its removal is under way, and etcd 3.6 panics when a member that applies
// its own removal is asked (etcd issue 21966).
var errLocalRemoving = errors.New("the local member's removal is under way: it is not asked for its status (etcd issue 21966)")

// localStatusClear is how long a tombstone read that found no removal of
// the local member lets a localPoll ask for its status without reading
// again. It is below tombstoneStaleness, so that a status call starts well
// within the RemovalGrace that every removal waits after its tombstone.
const localStatusClear = tombstoneStaleness / 2

// localPoll asks the local member for its status, the way every call of
// this sidecar to its own member must outside the background poll (which
// reads the tombstones itself, pollMembers): only after a read of the
// removal tombstones, on the member itself, found none for it. A removal writes its tombstone and
// waits RemovalGrace before etcd applies it, and the member applies the
// tombstone before the removal that follows it in the log, so a status
// call that starts soon after a clear read never meets the removal's
// apply. One localPoll serves a loop of calls (a hold's wait for the new
// leader); it reads the tombstones again once its clear read is older than
// localStatusClear.
type localPoll struct {
	s       *Server
	clearAt time.Time
}

// localStatus is one guarded status call to the local member.
func (s *Server) localStatus(ctx context.Context) (*pb.StatusResponse, error) {
	p := localPoll{s: s}
	return p.status(ctx)
}

// status asks the local member for its status. It returns errLocalRemoving
// once the member's removal is under way, and asks nothing when the
// tombstones could not be read.
func (p *localPoll) status(ctx context.Context) (*pb.StatusResponse, error) {
	if time.Since(p.clearAt) > localStatusClear {
		readAt := time.Now()
		if err := p.s.localNotRemoving(ctx); err != nil {
			return nil, err
		}
		p.clearAt = readAt
	}
	return pb.NewMaintenanceClient(p.s.local.ActiveConnection()).Status(ctx, &pb.StatusRequest{})
}

// localNotRemoving returns errLocalRemoving when the local member's
// removal is under way (localRemovals).
func (s *Server) localNotRemoving(ctx context.Context) error {
	removing, self, err := s.localRemovals(ctx)
	if err != nil {
		return err
	}
	if removing[self] {
		return errLocalRemoving
	}
	return nil
}

// localRemovals reads the removal tombstones from the local member and
// returns the members being removed (removingIDs: the tombstones and the
// removals this sidecar sent) with the local member's ID. The read is
// serializable: etcd asks whether a member is a learner before it serves a
// read only after it found the member in its member list, so a read panics
// only when the removal is applied between those two checks, where a
// status call panics for the whole second the removed member still serves.
func (s *Server) localRemovals(ctx context.Context) (removing map[uint64]bool, self uint64, err error) {
	resp, err := s.local.Get(ctx, tombstonePrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithSerializable())
	if err != nil {
		return nil, 0, fmt.Errorf("reading the removal tombstones from the local member: %w", err)
	}
	return s.removingIDs(resp.Kvs), resp.Header.GetMemberId(), nil
}
