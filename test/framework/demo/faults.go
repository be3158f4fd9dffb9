package demo

// Failpoints of the demo clusters, for fault-injection tests: a controller
// that dies after a step, sidecars that fail or hang, a member whose
// backend is over its quota.

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/internal/testing/podrunner"
)

// crashPoint kills a cluster's controller right after a step's sidecar
// call returned, before the controller reports anything, and starts a new
// one in its place: the crash that intent-before-action must survive.
type crashPoint struct {
	mu      sync.Mutex
	when    func(StepEvent) bool
	crashes []StepEvent
	errs    []error
}

// CrashAfterSteps makes the cluster's controller die after every step whose
// ended event when accepts: its reconcile ends as the sidecar answers, with
// no status, event or metric written, and a new controller (a new process:
// a new lock token, the same identity) starts in its place. The returned
// func ends the failpoint and returns the steps that crashed a controller;
// it fails if a restart failed.
func (c *Cluster) CrashAfterSteps(when func(StepEvent) bool) (stop func() ([]StepEvent, error)) {
	c.crash.mu.Lock()
	c.crash.when, c.crash.crashes, c.crash.errs = when, nil, nil
	c.crash.mu.Unlock()
	return func() ([]StepEvent, error) {
		c.crash.mu.Lock()
		defer c.crash.mu.Unlock()
		c.crash.when = nil
		if len(c.crash.errs) > 0 {
			return c.crash.crashes, fmt.Errorf("restarting the controller of cluster %s after a crash: %v", c.Name, c.crash.errs)
		}
		return c.crash.crashes, nil
	}
}

// afterStepSent is the controller's AfterStepSent failpoint for c.
func (p *crashPoint) afterStepSent(c *Cluster) func(planner.Step, sidecarcluster.Result) bool {
	return func(step planner.Step, res sidecarcluster.Result) bool {
		ev := StepEvent{Cluster: c.Name, Kind: step.Kind, Member: step.Member, ID: step.ID,
			Start: res.Start, End: res.Start.Add(res.Duration), Outcome: res.Outcome, Changed: res.Changed}
		p.mu.Lock()
		when := p.when
		p.mu.Unlock()
		if when == nil || !when(ev) {
			return false
		}
		p.mu.Lock()
		p.crashes = append(p.crashes, ev)
		p.mu.Unlock()
		// Not on this goroutine: stopping the manager waits for this very
		// reconcile, which ends as soon as the failpoint returns.
		go func() {
			if err := c.RestartController(); err != nil {
				p.mu.Lock()
				p.errs = append(p.errs, fmt.Errorf("%s at %s: %w", ev, time.Now().Format(time.TimeOnly), err))
				p.mu.Unlock()
			}
		}()
		return true
	}
}

// sidecarFault answers in place of a cluster's sidecars while a fault is
// set.
type sidecarFault struct {
	mu sync.Mutex
	f  func(w http.ResponseWriter, r *http.Request) bool
}

// SetSidecarFault makes every sidecar of the cluster pass each request to f
// first; f answers it (returning true) or lets the sidecar answer. nil ends
// the fault.
func (c *Cluster) SetSidecarFault(f func(w http.ResponseWriter, r *http.Request) bool) {
	c.sidecarFaults.mu.Lock()
	defer c.sidecarFaults.mu.Unlock()
	c.sidecarFaults.f = f
}

func (p *sidecarFault) wrap(_ podrunner.Pod, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		f := p.f
		p.mu.Unlock()
		if f != nil && f(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	})
}

// SetNoSpaceAlarm raises (on) or disarms (off) etcd's NOSPACE alarm for the
// member named member: the state etcd enters when that member's backend
// grows past its --quota-backend-bytes, a full disk's effect as etcd
// shows it. The alarm is raised through etcd's maintenance API, the same
// raft request a member's own quota check sends, so every member refuses
// writes, lease grants and any transaction that writes (with "mvcc:
// database space exceeded") until it is disarmed; reads and membership
// changes still go through. Disarming is the operator's step after
// compacting and defragmenting.
func (e *Env) SetNoSpaceAlarm(ctx context.Context, member string, on bool) error {
	cli, err := e.etcdClient(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := cli.MemberList(ctx)
	if err != nil {
		return fmt.Errorf("listing the members: %w", err)
	}
	var id uint64
	for _, m := range list.Members {
		if m.Name == member {
			id = m.ID
		}
	}
	if id == 0 {
		return fmt.Errorf("no member %q in the member list", member)
	}
	if !on {
		if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: id, Alarm: pb.AlarmType_NOSPACE}); err != nil {
			return fmt.Errorf("disarming the NOSPACE alarm of %s: %w", member, err)
		}
		return nil
	}
	// clientv3 offers only listing and disarming; raising goes through the
	// raw maintenance service.
	_, err = pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &pb.AlarmRequest{
		Action: pb.AlarmRequest_ACTIVATE, MemberID: id, Alarm: pb.AlarmType_NOSPACE,
	})
	if err != nil {
		return fmt.Errorf("raising the NOSPACE alarm of %s: %w", member, err)
	}
	return nil
}
