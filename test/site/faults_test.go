package site

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
	"github.com/druid-stretch/druid-stretch/internal/testing/childproc"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
)

var (
	siteFaultSet = flag.String("site-faults", "reduced",
		"the real-site fault lane of TestSiteFaultMatrix: off, reduced (make test; one row: "+reducedSiteFaultRow+") or full (every fault in every phase, one move each; make site-fault-matrix)")
	siteFaultTable = flag.String("site-faults.write", "",
		"write the rows run into this Markdown file, between the lines <!-- "+siteFaultSection+":begin --> and <!-- "+siteFaultSection+":end -->, keeping the rows of earlier runs that this one did not run")
)

// siteFaultSection names the markers of the lane's table.
const siteFaultSection = "site-fault-matrix"

// reducedSiteFaultRow is the one row of -site-faults=reduced: the
// controller that adds the destination's members stops right after its
// first learner joined and a new process takes over its lock, its step
// records and the learner's catch-up, while druid and the sidecars go on.
const reducedSiteFaultRow = "join-controller-killed"

// partitionLength is how long a partition between the sites lasts.
const partitionLength = 10 * time.Second

// controllerDownFor is how long a killed controller stays down before its
// replacement starts: a pod's restart, image cached.
const controllerDownFor = 5 * time.Second

// siteFaultPhase is a moment of a live move at which a fault goes in.
type siteFaultPhase struct {
	name string
	at   moment
	// abort aborts the move after the destination joined; at is then a
	// moment of the abort.
	abort bool
	// rebalance: the row's change is TestRebalanceBetweenNodeGroups's
	// rebalance between two node groups of one site, not a live move.
	rebalance bool
}

// The steps of a live move are listed above podDeletionRows; an abort
// after the destination joined removes the destination's members (Remove
// #1 is the abort's first).
var siteFaultPhases = []siteFaultPhase{
	{name: "join", at: after(planner.AddLearner, 1)},
	{name: "retire", at: before(planner.Remove, 1)},
	{name: "transfer", at: before(planner.MoveLeader, 1)},
	{name: "finish", at: after(planner.Promote, 3)},
	{name: "abort", at: before(planner.Remove, 1), abort: true},
	// The old voters and the first new one vote side by side: the
	// moment at which a dropped status once had the old members' pods
	// deleted.
	{name: "rebalance", at: after(planner.Promote, 1), rebalance: true},
}

// faultScene is what a fault acts on: both sites (the same one in a
// rebalance), the site whose controller took the step of the moment, the
// Etcd, and the client URLs of all its members, old and new, as the
// stepping site dials them.
type faultScene struct {
	a, b     *Site
	stepping *Site
	key      client.ObjectKey
	eps      []string
	moment   stepMoment
	// partitioned records a partition's window and the packets it
	// dropped.
	partitioned func(cut, healed time.Time, dropped int64)
	// logf writes to the row's log.
	logf func(format string, args ...any)
}

// siteFault is one kind of fault of the lane.
type siteFault struct {
	id, name string
	// inject puts the fault in at its moment, off the controller's
	// goroutine; it returns once the fault is over (the process back, the
	// link healed).
	inject func(ctx context.Context, s *faultScene) error
	// partition: requests may fail while the sites are cut apart.
	partition bool
	// twoSites: the fault needs two sites (a rebalance has one).
	twoSites bool
}

var siteFaults = []siteFault{
	{id: "druid-killed", name: "druid's manager killed (SIGKILL), restarted at once",
		inject: func(ctx context.Context, s *faultScene) error { return s.stepping.KillDruid(ctx, 0) }},
	{id: "controller-killed", name: fmt.Sprintf("druid-stretch's controller killed, a new one after %.0f s", controllerDownFor.Seconds()),
		inject: func(ctx context.Context, s *faultScene) error {
			return s.stepping.RestartDruidStretch(ctx, controllerDownFor)
		}},
	// The source's controller steps little in a move (the destination's
	// retires the source's members), but a new one must take nothing back:
	// no retired member re-added, no member of the move's removed.
	{id: "source-controller-killed", name: fmt.Sprintf("the source site's druid-stretch controller killed, a new one after %.0f s", controllerDownFor.Seconds()), twoSites: true,
		inject: func(ctx context.Context, s *faultScene) error {
			return s.a.RestartDruidStretch(ctx, controllerDownFor)
		}},
	{id: "crds-reapplied", name: "druid's CRDs re-applied in both sites",
		inject: func(ctx context.Context, s *faultScene) error {
			for _, site := range []*Site{s.a, s.b} {
				if site == s.b && s.a == s.b {
					break // a rebalance's one site
				}
				d, err := site.DeployDruidCRDs(ctx, time.Hour)
				if err != nil {
					return err
				}
				if err := d.Stop().Err; err != nil {
					return err
				}
			}
			return nil
		}},
	{id: "status-dropped", name: "status.membership dropped",
		inject: func(ctx context.Context, s *faultScene) error { return dropMembershipStatus(ctx, s) }},
	{id: "fields-dropped", name: fmt.Sprintf("the EtcdMembership deleted (its fields gone) for %.0f s, then created again", fieldsGoneFor.Seconds()),
		inject: func(ctx context.Context, s *faultScene) error {
			return withFieldsGone(ctx, s.stepping, s.key, s.eps, fieldsGoneFor, s.logf)
		}},
	{id: "partition", name: fmt.Sprintf("partition between the sites (%.0f s)", partitionLength.Seconds()), partition: true, twoSites: true,
		inject: func(ctx context.Context, s *faultScene) error {
			if err := s.a.Partition(s.b); err != nil {
				return err
			}
			cut := time.Now()
			err := pauseUntil(ctx, cut.Add(partitionLength))
			// Healed on every path: a cut left in place would fail the
			// checks after the move, not name the cause.
			dropped, healErr := s.a.Heal(s.b)
			s.partitioned(cut, time.Now(), dropped)
			if healErr == nil && dropped == 0 {
				healErr = errors.New("the partition dropped no packet: the sites were not cut apart")
			}
			return errors.Join(err, healErr)
		}},
}

// cpuBusyFault keeps both cores busy for the whole move, in a process
// group of its own.
const cpuBusyFault = "cpu-busy"

// siteFaultRow is one move of the lane: a fault at a phase, or the cores
// kept busy for the whole move (wholeMove).
type siteFaultRow struct {
	phase     siteFaultPhase
	fault     siteFault
	wholeMove bool
}

// id names the row's subtest, one level, so that -run picks rows by a list
// of ids.
func (r siteFaultRow) id() string {
	if r.wholeMove {
		return "move-" + cpuBusyFault
	}
	return r.phase.name + "-" + r.fault.id
}

func (r siteFaultRow) phaseName() string {
	if r.wholeMove {
		return "whole move"
	}
	return r.phase.name
}

func (r siteFaultRow) faultName() string {
	if r.wholeMove {
		return "both cores kept busy by another process"
	}
	return r.fault.name
}

// siteFaultRows are every fault at every phase, then the busy cores. A
// rebalance has no row of a fault between or of a second site: its
// members are in one site.
func siteFaultRows() []siteFaultRow {
	var rows []siteFaultRow
	for _, p := range siteFaultPhases {
		for _, f := range siteFaults {
			if p.rebalance && f.twoSites {
				continue
			}
			rows = append(rows, siteFaultRow{phase: p, fault: f})
		}
	}
	return append(rows, siteFaultRow{wholeMove: true})
}

// siteFaultResult is a row's line in the table.
type siteFaultResult struct {
	fault, phase string
	result       string
	fewestVoters int
	failed       int
	lost         int
	linearizable bool
	moveTook     time.Duration
}

// TestSiteFaultMatrix is the real-site fault lane: the live move of
// TestLiveMoveBetweenRealSites (or, in the rebalance phase, the rebalance
// of TestRebalanceBetweenNodeGroups), once per row, with one fault put
// into druid's or druid-stretch's side of the sites at one phase of the
// move (druid's manager killed, the stepping or the source site's
// druid-stretch controller killed and replaced, druid's CRDs re-applied,
// status.membership dropped, the EtcdMembership deleted for a while, the
// sites cut apart for partitionLength), or the cores kept busy for the
// whole move. Each row passes what a move must: it completes (or, aborted, ends with the
// source's members), no acknowledged write is lost, both histories are
// linearizable, the cluster never has fewer than MoveReplicas voters and
// stays one cluster, no etcd member crashes, and no request fails at
// either kube-apiserver, except, in a partition's row, requests in flight
// while the sites were cut apart. -site-faults=reduced (the default, in
// make test) runs reducedSiteFaultRow, =full every row (make
// site-fault-matrix), =off none;
// -site-faults.write puts the rows into docs/reliability.md's table.
func TestSiteFaultMatrix(t *testing.T) {
	if *siteFaultSet == "off" {
		t.Skip("-site-faults=off: the real-site fault lane runs with -site-faults=reduced (make test) or =full (make site-fault-matrix)")
	}
	if *siteFaultSet != "reduced" && *siteFaultSet != "full" {
		t.Fatalf("-site-faults=%s: want off, reduced or full", *siteFaultSet)
	}
	testbin.Need(t)
	rows := siteFaultRows()
	var results []siteFaultResult
	for _, row := range rows {
		if *siteFaultSet == "reduced" && row.id() != reducedSiteFaultRow {
			continue
		}
		// A failed row is a row too: it says so. A row -run leaves out is
		// none.
		res := siteFaultResult{fault: row.faultName(), phase: row.phaseName(), result: "FAILED (see the test log)"}
		ran := false
		t.Run(row.id(), func(t *testing.T) {
			ran = true
			runSiteFaultRow(t, row, &res)
		})
		if !ran {
			continue
		}
		results = append(results, res)
		// Written after every row, so that a lane cut short keeps the rows
		// it has.
		if *siteFaultTable != "" {
			if err := writeSiteFaultTable(*siteFaultTable, rows, results); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func runSiteFaultRow(t *testing.T, row siteFaultRow, res *siteFaultResult) {
	if row.phase.rebalance {
		runRebalanceFaultRow(t, row, res)
		return
	}
	check := rowCheck(t)
	ctx := testContext(t, siteTestDeadline)
	root := moveRoot(t, "druid-stretch-sitefault-")
	t.Logf("sites in %s", root)
	hook := &faultHook{t: t, row: row, applied: stepCounter{}}
	opts := MoveSiteOptions(root)
	for i := range opts {
		opts[i].OnStep = hook.onStep(i)
	}
	sites := startSites(t, opts...)
	a, b := sites[0], sites[1]
	lo := LiveMoveOptions{RTT: DefaultMoveRTT, Out: testWriter{t}, ReadyzExclude: testReadyzExclude}
	if row.phase.abort {
		lo.AbortAfter = move.StepJoinDestination
	}
	mv, err := NewLiveMove(ctx, a, b, lo)
	if err != nil {
		t.Fatal(err)
	}
	if err := mv.CreateSource(ctx); err != nil {
		t.Fatal(err)
	}
	if row.wholeMove {
		stopBusy := keepCoresBusy(t, 2)
		defer stopBusy()
	}
	hook.arm(ctx, a, b, mv.Key(), ClientURLs())
	run, err := mv.Run(ctx)
	fired, injected := hook.stop()
	logTemplateChanges(t, b, moveNamespace, MoveEtcdName)
	if err != nil {
		t.Fatalf("the move: %v", err)
	}
	res.moveTook = run.MoveTook
	t.Logf("the move took %s", run.MoveTook.Round(100*time.Millisecond))
	if !row.wholeMove {
		check.Expect(fired).NotTo(BeZero(), "the moment %s came", row.phase.at.name)
		check.Expect(injected).NotTo(HaveOccurred(), "%s at %s", row.fault.name, row.phase.at.name)
	}

	f := run.Own
	t.Logf("own etcd client: %d writes, %d reads, %d failed (%v), %d retries, max write gap %s", f.Writes, f.Reads, f.FailedRequests, f.FailedErrors, f.Retries, f.MaxWriteGap)
	history := run.Membership
	fewest, from, lasted := history.FewestVoters()
	t.Logf("the fewest voters: %d, from %s for %s", fewest, from.Format("15:04:05.000"), lasted.Round(100*time.Millisecond))
	res.fewestVoters = fewest
	res.lost = len(run.OwnLost.Lost) + run.API.LostAcknowledgedWrites
	res.linearizable = f.Linearizable && run.API.Linearizable
	for _, s := range run.API.Servers {
		res.failed += s.Failed
	}

	check.Expect(run.OwnLost.Lost).To(BeEmpty(), "no acknowledged write of the own client lost")
	check.Expect(f.Linearizable).To(BeTrue(), "the own client's history is linearizable: %s", f.LinearizabilityResult)
	expectTLSMembers(t, history)
	t.Logf("membership steps: %s", strings.Join(history.TransitionsInApplyOrder(appliedConfChanges(t, b, moveNamespace, "etcd-main-3")), "; "))
	check.Expect(fewest).To(Equal(MoveReplicas), "the cluster never had fewer than %d voters: %v", MoveReplicas, history.Snapshot())
	expectOneCluster(check, history)
	check.Expect(run.Aborted).To(Equal(row.phase.abort), "aborted")
	home := []string{"etcd-main-3", "etcd-main-4", "etcd-main-5"}
	if row.phase.abort {
		home = []string{"etcd-main-0", "etcd-main-1", "etcd-main-2"}
	}
	check.Expect(history.Last()).To(ConsistOf(
		HaveField("Name", home[0]), HaveField("Name", home[1]), HaveField("Name", home[2])), "the move's end")
	check.Expect(run.EtcdCrashes).To(BeEmpty(), "etcd panics or fatal exits")
	if row.fault.partition {
		cut, healed := hook.partitionWindow()
		expectFailuresOnlyWhileCut(t, check, run.API, run.APIRequests, cut, healed)
	} else {
		expectKubeAPIServersSawNothing(t, run.API, a)
	}
	if !t.Failed() {
		res.result = "passed"
		if row.phase.abort {
			res.result = "aborted cleanly"
		}
	}
	t.Logf("row: %+v", *res)
}

// rowCheck is a row's Gomega: every figure of a failed row counts, so the
// checks report all that failed, not the first.
func rowCheck(t *testing.T) Gomega {
	return NewGomega(func(msg string, _ ...int) { t.Helper(); t.Errorf("\n%s", msg) })
}

// runRebalanceFaultRow is a row of the rebalance phase: the rebalance of
// TestRebalanceBetweenNodeGroups (without its upgrade from the extended
// Etcd CRD and its own faults), the row's fault put in at the phase's
// moment, judged as that test judges it: it completes, no acknowledged
// write is lost, both histories are linearizable, never fewer than 3
// voters, one cluster, no etcd crash, no failed request at the
// kube-apiserver.
func runRebalanceFaultRow(t *testing.T, row siteFaultRow, res *siteFaultResult) {
	check := rowCheck(t)
	ctx := testContext(t, siteTestDeadline)
	hook := &faultHook{t: t, row: row, applied: stepCounter{}}
	r := newRebalance(ctx, t, rebalanceOptions{onStep: hook.onStep(0)})
	hook.arm(ctx, r.s, r.s, r.key, r.eps)
	r.begin(ctx, t)
	r.waitNewVoters(ctx, check)
	fired, injected := hook.stop()
	check.Expect(fired).NotTo(BeZero(), "the moment %s came", row.phase.at.name)
	check.Expect(injected).NotTo(HaveOccurred(), "%s at %s", row.fault.name, row.phase.at.name)
	out := r.finish(ctx, t, check)
	t.Logf("the rebalance took %s", out.took.Round(100*time.Millisecond))
	logTemplateChanges(t, r.s, r.e.Namespace, MoveEtcdName)
	res.moveTook, res.fewestVoters = out.took, out.fewestVoters
	res.lost = out.lost + out.api.LostAcknowledgedWrites
	res.linearizable = out.own.Linearizable && out.api.Linearizable
	for _, s := range out.api.Servers {
		res.failed += s.Failed
	}
	expectKubeAPIServersSawNothing(t, out.api, r.s)
	if !t.Failed() {
		res.result = "passed"
	}
	t.Logf("row: %+v", *res)
}

// expectFailuresOnlyWhileCut is a partition row's check of the
// kube-apiservers' clients: no acknowledged write lost, a linearizable
// history, and every failed request in flight while the sites were cut
// apart (called before the heal, answered after the cut). A side that
// lost its majority cannot commit until the heal; nothing else may fail.
func expectFailuresOnlyWhileCut(t *testing.T, check Gomega, api apiload.Results, reqs []apiload.Request, cut, healed time.Time) {
	t.Helper()
	t.Logf("kube-apiserver clients:\n%s", api)
	check.Expect(api.LostAcknowledgedWrites).To(BeZero(), "no write a kube-apiserver acknowledged is lost: %v", api.LostWrites)
	check.Expect(api.Linearizable).To(BeTrue(), "the kube-apiservers' history is linearizable: %s", api.LinearizabilityResult)
	check.Expect(cut.IsZero()).To(BeFalse(), "the sites were cut apart")
	var outside []string
	inside := 0
	for _, r := range reqs {
		if !r.Failed() {
			continue
		}
		call, ret := api.StartedAt.Add(r.Call), api.StartedAt.Add(r.Return)
		if !call.After(healed) && !ret.Before(cut) {
			inside++
			continue
		}
		outside = append(outside, fmt.Sprintf("%s %s %s at %s-%s: %s", r.Server, r.Kind, r.Object, call.Format("15:04:05.000"), ret.Format("15:04:05.000"), r.Err))
	}
	t.Logf("the sites were cut apart from %s to %s; %d request(s) failed in flight meanwhile", cut.Format("15:04:05.000"), healed.Format("15:04:05.000"), inside)
	check.Expect(outside).To(BeEmpty(), "failed requests outside the partition (%s to %s)", cut.Format("15:04:05.000"), healed.Format("15:04:05.000"))
}

// faultHook puts a row's fault in at its moment, from the controllers'
// OnStep hook (both sites' controllers share it), counting the moments as
// podDeleter does: a repeat of a refused step is the same moment. The
// fault runs on a goroutine of its own: a killed controller cannot wait
// for its own step.
type faultHook struct {
	t   *testing.T
	row siteFaultRow

	mu      sync.Mutex
	ctx     context.Context
	scene   *faultScene
	armed   bool
	fired   int
	applied stepCounter
	done    chan struct{}
	err     error
	cut     time.Time
	healed  time.Time
}

// arm starts counting steps: the source's own bootstrap is no moment of
// the move.
func (h *faultHook) arm(ctx context.Context, a, b *Site, key client.ObjectKey, eps []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ctx = ctx
	h.scene = &faultScene{a: a, b: b, key: key, eps: eps, logf: h.t.Logf, partitioned: func(cut, healed time.Time, dropped int64) {
		h.t.Logf("the sites were cut apart from %s to %s: %d packets dropped", cut.Format("15:04:05.000"), healed.Format("15:04:05.000"), dropped)
		h.mu.Lock()
		defer h.mu.Unlock()
		h.cut, h.healed = cut, healed
	}}
	h.armed = true
}

// stop ends the counting, waits for a fault still going on, and returns
// how many times the moment came (once, or 0) and the fault's error.
func (h *faultHook) stop() (int, error) {
	h.mu.Lock()
	h.armed = false
	done := h.done
	h.mu.Unlock()
	if done != nil {
		<-done
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fired, h.err
}

func (h *faultHook) partitionWindow() (cut, healed time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cut, h.healed
}

// onStep is site i's Options.OnStep.
func (h *faultHook) onStep(i int) func(planner.Step, *sidecarcluster.Result) {
	return func(step planner.Step, res *sidecarcluster.Result) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if !h.armed || h.row.wholeMove || h.fired > 0 {
			return
		}
		m, ok := h.applied.moment(step, res)
		if !ok {
			return
		}
		if !h.row.phase.at.is(m) {
			return
		}
		h.fired++
		scene := *h.scene
		scene.stepping, scene.moment = scene.a, m
		if i == 1 {
			scene.stepping = scene.b
		}
		h.done = make(chan struct{})
		ctx, done, fault := h.ctx, h.done, h.row.fault
		go func() {
			defer close(done)
			start := time.Now()
			err := fault.inject(ctx, &scene)
			h.mu.Lock()
			h.err = err
			h.mu.Unlock()
			// stop waits for this goroutine before the test ends.
			h.t.Logf("%s at %s (%s %s, by %s's controller), from %s: over after %s, error %v",
				fault.name, h.row.phase.at.name, m.kind, m.member, scene.stepping.opts.ClusterIdentity,
				start.Format("15:04:05.000"), time.Since(start).Round(time.Millisecond), err)
		}()
	}
}

// dropMembershipStatus drops status.membership of the stepping site's
// Etcd and EtcdMembership once, as statusWiper does after every step: at
// a moment before a step, the records of the steps before; at a moment
// after one, once the controller recorded it.
func dropMembershipStatus(ctx context.Context, s *faultScene) error {
	site := s.stepping
	p, err := etcdview.Get(ctx, site.Client, s.key)
	if err != nil {
		return err
	}
	var seen *v1alpha1.MembershipStep
	if st := p.View.Status.Membership; st != nil && st.LastStep != nil {
		seen = st.LastStep.DeepCopy()
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := etcdview.Get(ctx, site.Client, s.key)
		if err != nil || p.Membership == nil {
			return false, nil
		}
		st := p.View.Status.Membership
		if s.moment.after && (st == nil || st.LastStep == nil || seen != nil && st.LastStep.Kind == seen.Kind && st.LastStep.Member == seen.Member && st.LastStep.Time.Equal(&seen.Time)) {
			return false, nil // the step's record is not written yet
		}
		return dropStatus(ctx, site, p), nil
	})
	if err != nil {
		return fmt.Errorf("status.membership was not dropped within 30 s: %w", err)
	}
	return nil
}

// keepCoresBusy starts n busy loops in a process group of its own (dying
// with this process, childproc) and returns what ends them; the test's
// cleanup ends them too.
func keepCoresBusy(t *testing.T, n int) func() {
	t.Helper()
	cmd := exec.Command("sh", "-c", fmt.Sprintf("for i in $(seq %d); do (while :; do :; done) & done; wait", n))
	if err := childproc.Start(cmd); err != nil {
		t.Fatalf("starting the busy loops: %v", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)
	t.Logf("%d busy loops in process group %d", n, cmd.Process.Pid)
	return stop
}

// writeSiteFaultTable puts the lane's table into path's section: the rows
// run now, and those of earlier runs this one did not run, in the lane's
// order.
func writeSiteFaultTable(path string, rows []siteFaultRow, results []siteFaultResult) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	begin, end := "<!-- "+siteFaultSection+":begin -->\n", "<!-- "+siteFaultSection+":end -->"
	i, j := strings.Index(string(data), begin), strings.Index(string(data), end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no section %q...%q: add the two lines where the table goes", path, begin, end)
	}
	key := func(fault, phase string) string { return fault + " | " + phase }
	lines := map[string]string{}
	for _, l := range strings.Split(string(data[i+len(begin):j]), "\n") {
		cells := strings.Split(strings.Trim(l, "| "), " | ")
		if strings.HasPrefix(l, "| ") && len(cells) == 8 {
			lines[key(cells[0], cells[1])] = l
		}
	}
	for _, r := range results {
		lines[key(r.fault, r.phase)] = fmt.Sprintf("| %s | %s | %s | %d | %d | %d | %t | %.0f s |",
			r.fault, r.phase, r.result, r.fewestVoters, r.failed, r.lost, r.linearizable, r.moveTook.Seconds())
	}
	var b strings.Builder
	b.WriteString("| fault | phase | result | fewest voters | failed requests | lost | linearizable | move |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	written := 0
	for _, r := range rows {
		if l, ok := lines[key(r.faultName(), r.phaseName())]; ok {
			b.WriteString(l + "\n")
			written++
		}
	}
	fmt.Fprintf(&b, "\n%d of %d rows; last written %s (-site-faults=%s).\n", written, len(rows), time.Now().UTC().Format("2006-01-02"), *siteFaultSet)
	out := string(data[:i+len(begin)]) + b.String() + string(data[j:])
	return os.WriteFile(path, []byte(out), 0o644)
}
