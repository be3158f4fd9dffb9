//go:build linux

// Package baseline is the hand-scripted move the bench measures the product
// against: the A -> B move of a three-member etcd cluster that an operator
// would script with plain clientv3, one member at a time:
//
//  1. add B_i as a learner and start it;
//  2. promote it as soon as etcd lets it (etcd refuses a learner that is not
//     in sync with the leader);
//  3. when the voters of A and B tie, move leadership to B's first member,
//     once;
//  4. remove a member of A that is not the leader, retrying while etcd
//     refuses for its strict reconfiguration check (the leader must have
//     seen the new voter connected for 5 s), and stop it.
//
// Nothing of druid-stretch decides a step here: the script talks to etcd
// through clientv3 alone. The package only places the members: each one runs
// in a pod network namespace of its site's podnet.Network, so the members
// and the script's clients cross the same emulated WAN as the product's
// move does when the bench runs both on the same peered sites.
package baseline

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/druid-stretch/druid-stretch/internal/testing/childproc"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/test/infrastructure/podnet"
)

// Options configure Run.
type Options struct {
	// A and B are the pod networks of the two sites, already peered at the
	// round trip to measure. The script runs in A: its clients dial from A's
	// network, as an operator's script in the source cluster would.
	A, B *podnet.Network
	// Dir holds the members' data dirs and logs. Required.
	Dir string
	// Members is the size of the cluster (default 3).
	Members int
	// PreloadKeys keys of ValueSize bytes (default 1024) are written before
	// the move, so that joining members have data to catch up on.
	PreloadKeys, ValueSize int
	// EtcdBinary is the etcd executable (default testbin.Etcd()).
	EtcdBinary string
	// EtcdArgs are added to every member's command line (the product's
	// members run with etcd's defaults, and so does the baseline unless
	// told otherwise).
	EtcdArgs []string
	// WriteInterval is the pause between the writer's puts (default 10 ms);
	// WriteTimeout bounds one put (default 1 s, as the product's workload).
	WriteInterval, WriteTimeout time.Duration
}

// Step is one step of the script: when it started (from the move's start)
// and how long it took.
type Step struct {
	Name     string
	At, Took time.Duration
}

// Result is what one run measured.
type Result struct {
	// Move is the time from the first add to the end of the last removal.
	Move time.Duration
	// Tie is the time the voters of A and B were equal in number: from the
	// promotion that made them equal to the removal that ended it.
	Tie   time.Duration
	Steps []Step
	// Writes counts the writer's acknowledged puts during the run, Failed
	// its puts that returned an error, Lost the acknowledged ones missing
	// when read back after the move. MaxWriteGap is the longest time
	// between two acknowledged puts while the move ran.
	Writes, Failed, Lost int
	MaxWriteGap          time.Duration
	// Members is etcd's member list after the move, "name" for a voter and
	// "name (learner)" for a learner, as the last voter reported it.
	Members []string
}

const (
	clientPort = 2379
	peerPort   = 2380
	retryEvery = 100 * time.Millisecond
	// moveTimeout bounds the script: a learner that never gets in sync
	// would otherwise be retried for ever.
	moveTimeout = 10 * time.Minute
)

// member is one etcd process in a pod of its site.
type member struct {
	name string
	pod  *podnet.Pod
	net  *podnet.Network
	id   uint64
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

func (m *member) peerURL() string   { return fmt.Sprintf("http://%s:%d", m.pod.IP, peerPort) }
func (m *member) clientURL() string { return fmt.Sprintf("http://%s:%d", m.pod.IP, clientPort) }

// run holds what Run started, for its cleanup.
type run struct {
	o       Options
	members []*member
	writer  *writer
}

// Run bootstraps the cluster in A, preloads it, starts the writer, scripts
// the move to B and checks the writer's history. Every process and pod it
// started is gone when it returns, on every path.
func Run(ctx context.Context, o Options) (res Result, err error) {
	if o.A == nil || o.B == nil {
		return res, errors.New("baseline: Options.A and Options.B (the two sites' pod networks) are required")
	}
	if o.Dir == "" {
		return res, errors.New("baseline: Options.Dir is required (the members' data dirs and logs)")
	}
	if o.Members == 0 {
		o.Members = 3
	}
	if o.Members < 1 {
		return res, fmt.Errorf("baseline: %d members: want 1 or more", o.Members)
	}
	if o.ValueSize == 0 {
		o.ValueSize = 1024
	}
	if o.WriteInterval == 0 {
		o.WriteInterval = 10 * time.Millisecond
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = time.Second
	}
	if o.EtcdBinary == "" {
		if o.EtcdBinary, err = testbin.Etcd(); err != nil {
			return res, fmt.Errorf("baseline: %w", err)
		}
	}
	r := &run{o: o}
	defer func() { err = errors.Join(err, r.close()) }()

	var src []*member
	for i := range o.Members {
		m, err := r.newMember(fmt.Sprintf("baseline-a-%d", i), o.A)
		if err != nil {
			return res, err
		}
		src = append(src, m)
	}
	var initial []string
	for _, m := range src {
		initial = append(initial, m.name+"="+m.peerURL())
	}
	for _, m := range src {
		if err := r.start(m, strings.Join(initial, ","), "new"); err != nil {
			return res, err
		}
	}
	cli, err := r.client(src)
	if err != nil {
		return res, err
	}
	defer func() { _ = cli.Close() }()
	if err := waitServing(ctx, cli, src); err != nil {
		return res, err
	}
	for _, m := range src {
		st, err := cli.Status(ctx, m.clientURL())
		if err != nil {
			return res, fmt.Errorf("baseline: status of %s: %w", m.name, err)
		}
		m.id = st.Header.MemberId
	}
	if err := preload(ctx, cli, o.PreloadKeys, o.ValueSize); err != nil {
		return res, err
	}

	w, err := r.startWriter(src)
	if err != nil {
		return res, err
	}
	start := time.Now()
	moveCtx, cancel := context.WithTimeout(ctx, moveTimeout)
	defer cancel()
	steps, tie, moveErr := r.move(moveCtx, cli, src, start)
	res.Move = time.Since(start)
	res.Steps, res.Tie = steps, tie
	w.stop()
	if moveErr != nil {
		return res, moveErr
	}
	res.Writes, res.Failed, res.MaxWriteGap = len(w.acked), w.failed, w.maxGap
	if res.Lost, err = lost(ctx, cli, w.acked); err != nil {
		return res, err
	}
	list, err := cli.MemberList(ctx)
	if err != nil {
		return res, fmt.Errorf("baseline: the member list after the move: %w", err)
	}
	for _, m := range list.Members {
		name := m.Name
		if m.IsLearner {
			name += " (learner)"
		}
		res.Members = append(res.Members, name)
	}
	return res, nil
}

// move is the script itself. cli starts on A's members; its endpoints
// follow the membership.
func (r *run) move(ctx context.Context, cli *clientv3.Client, src []*member, start time.Time) (steps []Step, tie time.Duration, err error) {
	step := func(name string, fn func() error) error {
		t := time.Now()
		err := fn()
		steps = append(steps, Step{Name: name, At: t.Sub(start), Took: time.Since(t)})
		if err != nil {
			return fmt.Errorf("baseline: %s: %w", name, err)
		}
		return nil
	}
	voters := append([]*member(nil), src...)
	remaining := append([]*member(nil), src...) // A's voters
	var dst []*member
	var tieFrom time.Time
	moved := false
	for i := range src {
		b, err := r.newMember(fmt.Sprintf("baseline-b-%d", i), r.o.B)
		if err != nil {
			return steps, tie, err
		}
		if err := step("add learner "+b.name, func() error {
			var resp *clientv3.MemberAddResponse
			if err := retry(ctx, func() (err error) {
				resp, err = cli.MemberAddAsLearner(ctx, []string{b.peerURL()})
				return err
			}, rpctypes.ErrGRPCUnhealthy); err != nil {
				return err
			}
			b.id = resp.Member.ID
			var initial []string
			for _, pm := range resp.Members {
				name := pm.Name
				if pm.ID == b.id {
					name = b.name
				}
				for _, u := range pm.PeerURLs {
					initial = append(initial, name+"="+u)
				}
			}
			return r.start(b, strings.Join(initial, ","), "existing")
		}); err != nil {
			return steps, tie, err
		}
		if err := step("promote "+b.name, func() error {
			return retry(ctx, func() error {
				if err := b.exited(); err != nil {
					return err
				}
				_, err := cli.MemberPromote(ctx, b.id)
				return err
			},
				rpctypes.ErrGRPCLearnerNotReady, rpctypes.ErrGRPCMemberNotEnoughStarted)
		}); err != nil {
			return steps, tie, err
		}
		voters = append(voters, b)
		dst = append(dst, b)
		r.follow(cli, voters)
		if len(dst) == len(remaining) {
			tieFrom = time.Now()
			if !moved {
				moved = true
				if err := step("move leader to "+dst[0].name, func() error { return moveLeader(ctx, cli, voters, dst[0]) }); err != nil {
					return steps, tie, err
				}
			}
		}
		leader, err := leaderOf(ctx, cli, voters)
		if err != nil {
			return steps, tie, err
		}
		var gone *member
		for _, a := range remaining {
			if a.id != leader {
				gone = a
				break
			}
		}
		if gone == nil {
			return steps, tie, fmt.Errorf("baseline: every member of A left is the leader (%x): nothing to remove", leader)
		}
		// The removal goes through members that stay: a member applying
		// its own removal stops serving, and its answer is an error.
		remaining = without(remaining, gone)
		voters = without(voters, gone)
		r.follow(cli, voters)
		if err := step("remove "+gone.name, func() error {
			return retry(ctx, func() error { _, err := cli.MemberRemove(ctx, gone.id); return err },
				rpctypes.ErrGRPCUnhealthy, rpctypes.ErrGRPCMemberNotEnoughStarted)
		}); err != nil {
			return steps, tie, err
		}
		if !tieFrom.IsZero() {
			tie += time.Since(tieFrom)
			tieFrom = time.Time{}
		}
		r.stop(gone)
	}
	return steps, tie, nil
}

// follow points the script's and the writer's clients at the voters, as
// a script that keeps its endpoint list current would.
func (r *run) follow(cli *clientv3.Client, voters []*member) {
	cli.SetEndpoints(clientURLs(voters)...)
	if r.writer != nil {
		r.writer.cli.SetEndpoints(clientURLs(voters)...)
	}
}

// retry calls fn every retryEvery while it fails with one of the refusals
// etcd gives before a step may pass; any other error ends it.
func retry(ctx context.Context, fn func() error, refusals ...error) error {
	for {
		err := fn()
		if err == nil {
			return nil
		}
		refused := false
		for _, want := range refusals {
			if rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(want) {
				refused = true
			}
		}
		if !refused {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last refusal: %v)", ctx.Err(), err)
		case <-time.After(retryEvery):
		}
	}
}

// leaderOf asks each voter for its view of the leader until one answers.
func leaderOf(ctx context.Context, cli *clientv3.Client, voters []*member) (uint64, error) {
	var errs []error
	for _, m := range voters {
		st, err := statusOf(ctx, cli, m)
		if err == nil && st.Leader != 0 {
			return st.Leader, nil
		}
		errs = append(errs, fmt.Errorf("%s: %v", m.name, err))
	}
	return 0, fmt.Errorf("baseline: no voter names a leader: %w", errors.Join(errs...))
}

func statusOf(ctx context.Context, cli *clientv3.Client, m *member) (*clientv3.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return cli.Status(ctx, m.clientURL())
}

// moveLeader sends MoveLeader to the leader (etcd accepts it only there).
func moveLeader(ctx context.Context, cli *clientv3.Client, voters []*member, to *member) error {
	leader, err := leaderOf(ctx, cli, voters)
	if err != nil {
		return err
	}
	if leader == to.id {
		return nil
	}
	for _, m := range voters {
		if m.id != leader {
			continue
		}
		one, err := clientv3.New(clientv3.Config{Endpoints: []string{m.clientURL()}, DialTimeout: 5 * time.Second, DialOptions: dialIn(m.net), Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer func() { _ = one.Close() }()
		_, err = one.MoveLeader(ctx, to.id)
		return err
	}
	return fmt.Errorf("the leader %x is not among the voters", leader)
}

func without(ms []*member, gone *member) []*member {
	out := ms[:0:0]
	for _, m := range ms {
		if m != gone {
			out = append(out, m)
		}
	}
	return out
}

func clientURLs(ms []*member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.clientURL()
	}
	return out
}

// dialIn makes clientv3 dial from inside n, where the pod IPs route.
func dialIn(n *podnet.Network) []grpc.DialOption {
	return []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return n.DialContext(ctx, "tcp", addr)
	})}
}

// client is the script's client, in A.
func (r *run) client(ms []*member) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: clientURLs(ms), DialTimeout: 5 * time.Second, DialOptions: dialIn(r.o.A), Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("baseline: client: %w", err)
	}
	return cli, nil
}

// waitServing waits until every member answers Status.
func waitServing(ctx context.Context, cli *clientv3.Client, ms []*member) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, m := range ms {
		for {
			if err := m.exited(); err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			if _, err := statusOf(ctx, cli, m); err == nil {
				break
			} else if ctx.Err() != nil {
				return fmt.Errorf("baseline: %s does not serve: %w", m.name, err)
			}
			time.Sleep(retryEvery)
		}
	}
	return nil
}

// preload writes n keys of size bytes in transactions of 128 puts, etcd's
// default --max-txn-ops.
func preload(ctx context.Context, cli *clientv3.Client, n, size int) error {
	value := strings.Repeat("v", size)
	const batch = 128
	for i := 0; i < n; i += batch {
		var ops []clientv3.Op
		for j := i; j < min(i+batch, n); j++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("/baseline/preload/%08d", j), value))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return fmt.Errorf("baseline: preloading key %d of %d: %w", i, n, err)
		}
	}
	return nil
}

// writer puts a new key every interval through its own client and keeps
// what was acknowledged.
type writer struct {
	cli    *clientv3.Client
	acked  []string
	failed int
	maxGap time.Duration
	quit   chan struct{}
	wg     sync.WaitGroup
}

func (r *run) startWriter(ms []*member) (*writer, error) {
	cli, err := r.client(ms)
	if err != nil {
		return nil, err
	}
	w := &writer{cli: cli, quit: make(chan struct{})}
	r.writer = w
	w.wg.Go(func() {
		last := time.Now()
		for seq := 0; ; seq++ {
			select {
			case <-w.quit:
				return
			case <-time.After(r.o.WriteInterval):
			}
			key := fmt.Sprintf("/baseline/writes/%08d", seq)
			ctx, cancel := context.WithTimeout(context.Background(), r.o.WriteTimeout)
			_, err := cli.Put(ctx, key, "w")
			cancel()
			if err != nil {
				w.failed++
				continue
			}
			now := time.Now()
			w.maxGap = max(w.maxGap, now.Sub(last))
			last = now
			w.acked = append(w.acked, key)
		}
	})
	return w, nil
}

// stop ends the writer; its figures are stable afterwards.
func (w *writer) stop() {
	close(w.quit)
	w.wg.Wait()
	_ = w.cli.Close()
}

// lost counts the acknowledged keys that cannot be read back.
func lost(ctx context.Context, cli *clientv3.Client, acked []string) (int, error) {
	resp, err := cli.Get(ctx, "/baseline/writes/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, fmt.Errorf("baseline: reading back the writes: %w", err)
	}
	have := make(map[string]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		have[string(kv.Key)] = true
	}
	n := 0
	for _, k := range acked {
		if !have[k] {
			n++
		}
	}
	return n, nil
}

// newMember creates the member's pod in its site.
func (r *run) newMember(name string, n *podnet.Network) (*member, error) {
	pod, err := n.AddPod("druid-stretch-baseline/" + name)
	if err != nil {
		return nil, fmt.Errorf("baseline: pod of %s: %w", name, err)
	}
	m := &member{name: name, pod: pod, net: n}
	r.members = append(r.members, m)
	return m, nil
}

// start runs etcd for m inside its pod's network namespace (nsenter), as
// a child that dies with this process.
func (r *run) start(m *member, initialCluster, state string) error {
	dir := filepath.Join(r.o.Dir, m.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	log, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		return err
	}
	args := append([]string{"--net=" + m.pod.NetnsPath, r.o.EtcdBinary,
		"--name=" + m.name,
		"--data-dir=" + filepath.Join(dir, "data"),
		"--listen-peer-urls=" + m.peerURL(),
		"--initial-advertise-peer-urls=" + m.peerURL(),
		"--listen-client-urls=" + m.clientURL(),
		"--advertise-client-urls=" + m.clientURL(),
		"--initial-cluster=" + initialCluster,
		"--initial-cluster-state=" + state,
		"--initial-cluster-token=druid-stretch-baseline",
	}, r.o.EtcdArgs...)
	cmd := exec.Command("nsenter", args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := childproc.Start(cmd); err != nil {
		_ = log.Close()
		return fmt.Errorf("baseline: starting %s: %w", m.name, err)
	}
	m.cmd, m.log, m.done = cmd, log, make(chan struct{})
	go func() { _ = cmd.Wait(); close(m.done) }()
	return nil
}

// exited is an error naming m's log once its etcd has ended.
func (m *member) exited() error {
	select {
	case <-m.done:
		return fmt.Errorf("etcd of %s exited (%s); its log is %s", m.name, m.cmd.ProcessState, m.log.Name())
	default:
		return nil
	}
}

// stop kills m's etcd and waits for it.
func (r *run) stop(m *member) {
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Kill()
	<-m.done
	_ = m.log.Close()
	m.cmd = nil
}

// close ends every process and removes every pod Run made.
func (r *run) close() error {
	var errs []error
	for _, m := range r.members {
		r.stop(m)
		if err := m.net.RemovePod(m.pod.Key); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
