package e2e

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/test/framework/demo"
)

var (
	faultSet = flag.String("faults", "reduced",
		"the fault matrix to run: reduced (one fault per phase; make test) or full (every fault in every phase; make fault-matrix)")
	faultLanes = flag.Int("faults.lanes", 1,
		"how many runs of the matrix go side by side, each in two clusters of its own")
	faultTable = flag.String("faults.write", "",
		"write the fault matrix's table into this Markdown file, between the lines <!-- fault-matrix:begin --> and <!-- fault-matrix:end -->")
)

// phase is a moment of a live move at which a fault goes in: on a step of a
// controller (onStep) or on a step of the move itself (onProgress). An
// abort phase aborts the move once the first source member was retired.
type phase struct {
	name       string
	onStep     func(demo.StepEvent) bool
	onProgress func(livemove.Event) bool
	abort      bool
}

var phases = []phase{
	{name: "join-destination", onStep: func(ev demo.StepEvent) bool {
		return ev.Cluster == "B" && ev.Kind == planner.AddLearner && ev.Applied()
	}},
	{name: "retire-source", onProgress: func(ev livemove.Event) bool {
		return ev.Kind == livemove.StepStarted && ev.Step == move.StepRetireSource
	}},
	{name: "leader-transfer", onStep: func(ev demo.StepEvent) bool {
		return ev.Cluster == "B" && ev.Kind == planner.MoveLeader && !ev.Done()
	}},
	{name: "finish", onProgress: func(ev livemove.Event) bool {
		return ev.Kind == livemove.StepStarted && ev.Step == move.StepFinish
	}},
	{name: "abort", abort: true, onProgress: func(ev livemove.Event) bool {
		return ev.Kind == livemove.StepStarted && ev.Step == move.StepAbort
	}},
}

// fault is one failure injected into a running move. inject runs on its
// own goroutine; it returns when the fault is over (healed), or at once for
// a fault that heals itself (a killed process is restarted by its pod or
// its manager).
type fault struct {
	name   string
	inject func(e *demo.Env) error
}

var faults = []fault{
	{name: "partition between the sites (6 s)", inject: func(e *demo.Env) error {
		e.WAN.Partition(demo.SiteA, demo.SiteB)
		time.Sleep(6 * time.Second) // the length of the cut is the fault itself
		e.WAN.Heal(demo.SiteA, demo.SiteB)
		return nil
	}},
	{name: "etcd leader killed (SIGKILL)", inject: func(e *demo.Env) error {
		name, err := etcdLeader(e)
		if err != nil {
			return err
		}
		for _, c := range e.Clusters() {
			if m := c.Runner.Runtime().Member(name); m != nil && m.Running() {
				return m.Kill()
			}
		}
		return fmt.Errorf("the leader %s runs in neither cluster", name)
	}},
	{name: "newest destination member killed (SIGKILL)", inject: func(e *demo.Env) error {
		var newest string
		for _, s := range e.Steps() {
			if s.Cluster == "B" && s.Kind == planner.AddLearner && s.Applied() {
				newest = s.Member
			}
		}
		m := e.B.Runner.Runtime().Member(newest)
		if m == nil {
			return fmt.Errorf("no destination member %q runs", newest)
		}
		// A learner just added starts once its pod was admitted.
		deadline := time.Now().Add(time.Minute)
		for !m.Running() && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if !m.Running() {
			return fmt.Errorf("destination member %s did not start within a minute", newest)
		}
		return m.Kill()
	}},
	{name: "every sidecar answers changes with 500 (10 s)", inject: func(e *demo.Env) error {
		return sidecarsFor(e, 10*time.Second, func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method == http.MethodGet {
				return false
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"reason":"Internal","message":"injected by the fault matrix"}`))
			return true
		})
	}},
	{name: "every sidecar hangs on changes (10 s)", inject: func(e *demo.Env) error {
		over := make(chan struct{})
		return sidecarsFor(e, 10*time.Second, func(_ http.ResponseWriter, r *http.Request) bool {
			if r.Method != http.MethodGet {
				select {
				case <-over:
				case <-r.Context().Done():
				}
			}
			return false
		}, over)
	}},
	{name: "leader's backend over its quota (NOSPACE alarm, 10 s)", inject: func(e *demo.Env) error {
		// etcd raises NOSPACE when a member's backend outgrows its quota,
		// as a filling disk would make it; every member then refuses
		// writes until an operator compacts, defragments and disarms.
		name, err := etcdLeader(e)
		if err != nil {
			return err
		}
		ctx := context.Background()
		if err := e.SetNoSpaceAlarm(ctx, name, true); err != nil {
			return err
		}
		time.Sleep(10 * time.Second) // the length of the alarm is the fault itself
		return e.SetNoSpaceAlarm(ctx, name, false)
	}},
	{name: "controller B killed", inject: func(e *demo.Env) error { return e.B.RestartController() }},
	{name: "controller A killed", inject: func(e *demo.Env) error { return e.A.RestartController() }},
}

// reducedMatrix is make test's share of the matrix: one fault per phase
// that no other test of the package covers. The join is covered by
// TestPartitionDuringTheJoin (the cut while a member joins) and
// TestMoveSurvivesItsControllerKilledAfterEachStep (a controller killed
// after each of its changes, the joins among them).
var reducedMatrix = map[string]string{
	"retire-source":   "leader's backend over its quota (NOSPACE alarm, 10 s)",
	"leader-transfer": "etcd leader killed (SIGKILL)",
	"finish":          "partition between the sites (6 s)",
}

// faultRow is one run of the matrix, as the table shows it.
type faultRow struct {
	fault, phase string
	outcome      string
	injected     bool
	fewestVoters int
	lost         int
	linearizable bool
	failed       int
	recovery     time.Duration
	moveSeconds  float64
}

// TestFaultMatrix moves an Etcd from A to B once per fault and phase, with
// the fault injected at that phase, and asserts every run's verdict: the
// move completes (the abort phase: the move is aborted and the source
// restored, never below three voters), no acknowledged write is lost and
// the kube-apiservers' history is linearizable, and the cluster never has
// fewer voters than a quorum of its three. Failed requests and recovery (from the fault's end
// to the next membership change applied) are recorded, not asserted: a
// fault may fail a kube-apiserver's request. -faults=full runs every fault
// in every phase (make fault-matrix); -faults.write puts the table into a
// Markdown file.
func TestFaultMatrix(t *testing.T) {
	type run struct {
		p phase
		f fault
	}
	var runs []run
	for _, p := range phases {
		for _, f := range faults {
			if *faultSet == "full" || reducedMatrix[p.name] == f.name {
				runs = append(runs, run{p, f})
			}
		}
	}
	lanes := []*demo.Env{env}
	for i := 2; i <= *faultLanes; i++ {
		lanes = append(lanes, startLane(t, i))
	}
	var (
		mu   sync.Mutex
		next int
		// rows holds each run's row at the run's index; nil: not run.
		rows = make([]*faultRow, len(runs))
	)
	// lane runs the next run nobody took yet, until none is left, in the
	// clusters of e.
	lane := func(t *testing.T, e *demo.Env) {
		for {
			mu.Lock()
			k := next
			next++
			mu.Unlock()
			if k >= len(runs) {
				return
			}
			r := runs[k]
			// A failed run is a row too: it says so. A run that -run
			// leaves out is none.
			row := &faultRow{fault: r.f.name, phase: r.p.name, outcome: "FAILED (see the test log)", recovery: -1}
			ran := false
			t.Run(r.p.name+"/"+r.f.name, func(t *testing.T) {
				ran = true
				runFault(t, e, r.p, r.f, row)
			})
			// Written after every run, so that a matrix cut short keeps
			// the rows it has (and shows none of a run still going).
			mu.Lock()
			if ran {
				rows[k] = row
			}
			err := writeFaultTable(t, rows, len(lanes))
			mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(lanes) == 1 {
		lane(t, env)
		return
	}
	// Lanes run side by side, each its own two clusters, so that a fault
	// (a partition, a killed controller) stays within its run.
	t.Run("lanes", func(t *testing.T) {
		for i, e := range lanes {
			t.Run(fmt.Sprintf("lane%d", i+1), func(t *testing.T) {
				t.Parallel()
				lane(t, e)
			})
		}
	})
}

// startLane starts two more clusters for lane i of the matrix and closes
// them when the test ends.
func startLane(t *testing.T, i int) *demo.Env {
	t.Helper()
	dir := filepath.Join(filepath.Dir(logPath), fmt.Sprintf("lane%d", i))
	e, err := demo.Start(t.Context(), demo.Config{RTT: rtt, Dir: dir, Logger: logger.WithValues("lane", i)})
	if err != nil {
		t.Fatalf("starting the clusters of lane %d: %v", i, err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("stopping the clusters of lane %d: %v", i, err)
		}
	})
	return e
}

// writeFaultTable puts the rows run so far, in the matrix's order, into
// -faults.write's file, and logs the table once every run has a row.
func writeFaultTable(t *testing.T, rows []*faultRow, lanes int) error {
	var done []*faultRow
	for _, r := range rows {
		if r != nil {
			done = append(done, r)
		}
	}
	if len(done) == 0 {
		return nil
	}
	side := ""
	if lanes > 1 {
		side = fmt.Sprintf(", %d at a time (-faults.lanes=%d, each its own two clusters)", lanes, lanes)
	}
	table := faultMatrixTable(done) + fmt.Sprintf("\n%d of %d runs (-faults=%s%s), %s.\n", len(done), len(rows), *faultSet, side, time.Now().UTC().Format("2006-01-02"))
	if *faultTable != "" {
		if err := spliceSection(*faultTable, "fault-matrix", table); err != nil {
			return err
		}
	}
	if len(done) == len(rows) {
		t.Log("\n" + table)
	}
	return nil
}

func runFault(t *testing.T, base *demo.Env, p phase, f fault, row *faultRow) {
	g := NewWithT(t)
	e := newMoveIn(t, base, fmt.Sprintf("etcd-fault-%d", time.Now().UnixNano()%100000))
	var (
		once     sync.Once
		mu       sync.Mutex
		healedAt time.Time
		ferr     error
		done     = make(chan struct{})
	)
	fire := func() {
		once.Do(func() {
			mu.Lock()
			row.injected = true
			mu.Unlock()
			go func() {
				defer close(done)
				err := f.inject(e)
				mu.Lock()
				healedAt, ferr = time.Now(), err
				mu.Unlock()
			}()
		})
	}
	o := rehearsal()
	if p.abort {
		o.Abort = true
		o.AbortWhen = func(src, dst *v1alpha1.Etcd) bool {
			s, d, ok := move.Voters(src, dst)
			return ok && s == 2 && d == 1
		}
	}
	if p.onProgress != nil {
		o.OnProgress = func(ev livemove.Event) {
			if p.onProgress(ev) {
				fire()
			}
		}
	}
	if p.onStep != nil {
		stop := e.OnStep(func(ev demo.StepEvent) {
			if p.onStep(ev) {
				fire()
			}
		})
		defer stop()
	}
	rep, err := e.Rehearse(t.Context(), t.Output(), o)
	mu.Lock()
	injected := row.injected
	mu.Unlock()
	if injected {
		<-done
	}
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(row.injected).To(BeTrue(), "the move passed phase %s", p.name)
	g.Expect(ferr).NotTo(HaveOccurred(), "injecting %s", f.name)

	row.fewestVoters, _ = fewestVoters(e)
	h := rep.APIHistory
	g.Expect(h).NotTo(BeNil())
	row.lost, row.linearizable = h.LostAcknowledgedWrites, h.Linearizable
	for _, s := range rep.KubeAPIServers {
		row.failed += s.Failed
	}
	row.moveSeconds = rep.MigrationSeconds
	for _, s := range e.Steps() {
		if s.Applied() && s.End.After(healedAt) {
			row.recovery = s.End.Sub(healedAt)
			break
		}
	}
	outcome := "finished"
	if p.abort {
		outcome = "aborted"
		expectBackAtA(t, e)
		g.Expect(row.fewestVoters).To(BeNumerically(">=", 3), "an abort is a move back: never fewer than three voters")
	} else {
		expectMovedToB(t, e)
	}
	expectKubeAPIServersKeptEveryWrite(t, rep)
	g.Expect(row.fewestVoters).To(BeNumerically(">=", 2), "never fewer voters than a quorum of three")
	if !t.Failed() {
		row.outcome = outcome
	}
	t.Logf("row: %+v", *row)
}

// sidecarsFor puts f in front of every sidecar of both clusters for d
// (the length of the fault), then takes it away and closes over.
func sidecarsFor(e *demo.Env, d time.Duration, f func(http.ResponseWriter, *http.Request) bool, over ...chan struct{}) error {
	for _, c := range e.Clusters() {
		c.SetSidecarFault(f)
	}
	time.Sleep(d)
	for _, c := range e.Clusters() {
		c.SetSidecarFault(nil)
	}
	for _, o := range over {
		close(o)
	}
	return nil
}

// fewestVoters replays the applied changes of both controllers from the
// source's three voters: the fewest voters the cluster had, and the change
// after which it first had that few.
func fewestVoters(e *demo.Env) (least int, after string) {
	voters := map[string]bool{}
	for o := range 3 {
		voters[fmt.Sprintf("%s-%d", e.Config.Name, o)] = true
	}
	least, after = len(voters), "the start"
	for _, s := range e.Steps() {
		if !s.Applied() {
			continue
		}
		switch s.Kind {
		case planner.Promote:
			voters[s.Member] = true
		case planner.Remove:
			delete(voters, s.Member)
		}
		if len(voters) < least {
			least, after = len(voters), s.String()
		}
	}
	return least, after
}

// etcdLeader is the leader as the fresher of the two Etcds' status shows it.
func etcdLeader(e *demo.Env) (string, error) {
	src, dst, err := e.Read(context.Background())
	if err != nil {
		return "", err
	}
	fresher := src
	if dst != nil && dst.Status.Membership != nil && dst.Status.Membership.ObservedTime != nil &&
		(src == nil || src.Status.Membership == nil || src.Status.Membership.ObservedTime == nil ||
			dst.Status.Membership.ObservedTime.After(src.Status.Membership.ObservedTime.Time)) {
		fresher = dst
	}
	if name := leader(fresher); name != "" {
		return name, nil
	}
	return "", errors.New("no leader in either Etcd's status")
}

func faultMatrixTable(rows []*faultRow) string {
	var b strings.Builder
	b.WriteString("| phase | fault | outcome | fewest voters | lost acknowledged writes | linearizable | failed requests | recovery | move |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		rec := "no change followed"
		if r.recovery >= 0 {
			rec = fmt.Sprintf("%.1f s", r.recovery.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %t | %d | %s | %.0f s |\n",
			r.phase, r.fault, r.outcome, r.fewestVoters, r.lost, r.linearizable, r.failed, rec, r.moveSeconds)
	}
	return b.String()
}

// spliceSection replaces the lines between <!-- name:begin --> and
// <!-- name:end --> in path with content.
func spliceSection(path, name, content string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	begin, end := []byte("<!-- "+name+":begin -->\n"), []byte("<!-- "+name+":end -->")
	i, j := bytes.Index(data, begin), bytes.Index(data, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no section %s...%s", path, begin, end)
	}
	out := append(append(append([]byte{}, data[:i+len(begin)]...), content...), data[j:]...)
	return os.WriteFile(path, out, 0o644)
}
