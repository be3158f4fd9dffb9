package site

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	gocmp "github.com/google/go-cmp/cmp"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
)

// moveNamespace is the shoot namespace of the moves.
const moveNamespace = MoveNamespace

// TestLiveMoveBetweenRealSites moves a 3-member Etcd from site A to site B,
// two sites of real parts (real druid, real backup-restore, the injected
// sidecar, pods run from their Pod objects) whose pod networks are peered
// 180 ms apart, with the migration adapter as gardenlet would drive it,
// judged by client-go clients of a shoot kube-apiserver in each site (see
// LiveMove). In the middle of the move druid is made to reconcile both
// Etcds, as an operator's annotation does, and at the destination's join
// the shoot's server, peer and client certificates are renewed in both
// sites, as gardenlet renews them in place: the source's members serve
// the new server certificate while the move goes on, and no client sees
// a failure.
func TestLiveMoveBetweenRealSites(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ctx := testContext(t, siteTestDeadline)
	root := moveRoot(t, "druid-stretch-move-")
	sites := startSites(t, MoveSiteOptions(root)...)
	a, b := sites[0], sites[1]

	var (
		reconciled    sync.WaitGroup
		reconcileErrs = make([]error, 2)
	)
	mv, err := NewLiveMove(ctx, a, b, LiveMoveOptions{
		RTT:                 DefaultMoveRTT,
		Out:                 testWriter{t},
		ReadyzExclude:       testReadyzExclude,
		RenewCertificatesAt: move.StepJoinDestination,
		// A compaction Job inside the move (expectCompactionDuringMove).
		DeltaSnapshotAfterJoin: true,
		OnEvent: func(e livemove.Event) {
			if e.Kind == livemove.StepStarted && e.Step == move.StepRetireSource {
				reconciled.Add(1)
				go func() {
					defer reconciled.Done()
					for i, s := range []*Site{a, b} {
						reconcileErrs[i] = forceDruidReconcile(s, moveNamespace, MoveEtcdName)
					}
				}()
			}
		},
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mv.CreateSource(ctx)).To(Succeed())
	run, err := mv.Run(ctx)
	reconciled.Wait()
	logTemplateChanges(t, b, moveNamespace, MoveEtcdName)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(errors.Join(reconcileErrs...)).NotTo(HaveOccurred(), "druid was asked to reconcile in the middle of the move")
	t.Logf("the move took %s", run.MoveTook.Round(100*time.Millisecond))
	g.Expect(run.Renewal).NotTo(BeNil(), "the certificates were renewed at %s", move.StepJoinDestination)
	g.Expect(run.Renewal.Err).NotTo(HaveOccurred())
	t.Logf("certificates renewed %.1f s into the move; the source's first member served the new one %.1f s later",
		run.Renewal.At.Sub(run.MoveStarted).Seconds(), run.Renewal.ServedAfter.Seconds())

	// druid's own CRDs were written into both sites throughout, as
	// gardenlet writes them: both Etcds are druid's objects, and every
	// field of druid-stretch's lives in their EtcdMemberships, the
	// destination's peer URLs among them (druid's own field admits none of
	// the ordinals 3..5).
	t.Logf("druid's own CRDs were written %d times into the two sites", run.DruidCRDWrites)
	g.Expect(run.DruidCRDWrites).To(BeNumerically(">=", 4), "druid's CRDs were written into both sites more than once each")
	for _, s := range []*Site{a, b} {
		p, err := etcdview.Get(ctx, s.Client, mv.Key())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(p.Etcd.Spec.MembershipSpec).To(BeZero(), "%s's Etcd carries no druid-stretch field", s.opts.ClusterIdentity)
		g.Expect(p.Membership).NotTo(BeNil(), "%s's Etcd has its EtcdMembership", s.opts.ClusterIdentity)
	}
	dstPair, err := etcdview.Get(ctx, b.Client, mv.Key())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(dstPair.Etcd.Spec.Etcd.AdditionalAdvertisePeerURLs).To(BeEmpty())
	g.Expect(dstPair.Membership.Spec.AdditionalAdvertisePeerURLs).To(HaveExactElements(
		HaveField("MemberName", "etcd-main-3"), HaveField("MemberName", "etcd-main-4"), HaveField("MemberName", "etcd-main-5")))

	expectDestinationReadyAndOwnHistory(t, run)

	// What the kube-apiservers' clients saw. A's clients are switched
	// before any membership change that could fail them; B's are drained
	// before a removal and held through the leader transfer by the client
	// gate, each gate releasing its clients as soon as its member sees the
	// new leader. No cause of a failed request is left, and the hold keeps
	// the write gap under a second at 180 ms RTT
	// (docs/kube-apiserver-clients.md).
	expectKubeAPIServersSawNothing(t, run.API, a)

	history := run.Membership
	expectInterleavedMove(t, history, appliedConfChanges(t, b, moveNamespace, "etcd-main-3"), "a source member")
	tie, ties := history.LongestTie(func(name string) bool { return memberOrdinal(name) >= 3 })
	t.Logf("polls saw the voters tied %d time(s), the longest for %s", ties, tie)
	g.Expect(ties).To(BeNumerically("<=", 1), "the move passes through one tie at most")
	// The controllers time each tie from etcd's answers to the change that
	// made it and the one that ended it.
	t.Logf("the controllers measured %d tie(s), %.3f s in all", run.Ties, run.TieSeconds)
	g.Expect(run.Ties).To(BeNumerically(">=", 1), "the majority changed sides through a tie")
	logTieLength(t, tie, run.Ties, run.TiesUnderOneSecond)
	// No etcd member of either site panicked or exited fatally (etcd
	// issue 21966: a member applying its own removal, polled).
	g.Expect(run.EtcdCrashes).To(BeEmpty(), "etcd panics or fatal exits")
	expectCompactionDuringMove(t, run, a)
	// Every run of B's pods, a pod druid restarted after the move included.
	dst := &v1alpha1.Etcd{}
	dst.Namespace, dst.Name = moveNamespace, MoveEtcdName
	for _, p := range etcdPods(t, b, dst) {
		log := containerLogs(t, b, p, "backup-restore")
		g.Expect(log).NotTo(ContainSubstring("Attempting to promote member"), "backup-restore of %s promoted", p.Name)
		// A's members still advertise their in-cluster names; B's
		// controller publishes them in B (an EndpointSlice on the peer
		// Service), so no joining member waits out etcd's 30 s resolution.
		g.Expect(containerLogs(t, b, p, "etcd")).NotTo(ContainSubstring("failed to resolve URL Host"), "%s joined without waiting on a peer name B's DNS did not know", p.Name)
	}

	// B's backup-restore takes a full snapshot of the moved cluster into
	// B's store; a new Etcd restored from it holds every key.
	eps := ClientURLs()
	before := readPrefix(t, etcdClientVia(t, b, eps[3:]...), "/move/", false)
	g.Expect(before).NotTo(BeEmpty())
	triggerFullSnapshot(t, b, dst)
	store := filepath.Join(b.HostPathRoot, "etc", "gardener", "local-backupbuckets", "backups", "etcd-main")
	g.Expect(fullSnapshots(t, store)).NotTo(BeEmpty(), "a full snapshot in B's store %s", store)
	restored := applyEtcd(t, b, moveNamespace, func(o *unstructured.Unstructured) {
		o.SetName("etcd-restored")
		g.Expect(unstructured.SetNestedField(o.Object, int64(1), "spec", "replicas")).To(Succeed())
	})
	waitEtcdReady(t, b, restored, 1)
	g.Expect(readPrefix(t, etcdClientOf(t, b, restored, "etcd-restored-0"), "/move/", true)).To(Equal(before),
		"the Etcd restored from B's snapshot holds every key of the moved cluster")
}

// TestLiveMoveHoldingASourceMember is the live move in the other order
// (LiveMoveOptions.HoldSource, the migrate command's --hold-source): the
// destination takes the majority first and holds one source member for the
// source's clients, whose kube-apiserver keeps serving on it; the clients
// switch once the destination holds the majority, and only then does the
// held member go. B's kube-apiserver then finishes its start on a quorum
// inside B. A's clients meet two removals of their members and the leader
// transfer, through their members' client gates. Throughout, both
// controllers' status.membership is dropped after every step they make, as
// druid's compaction drops it from the Etcd and as nothing but a fault
// would drop it from the EtcdMembership: the move goes on from what etcd
// and the sidecars record, with no voter lost and no new cluster (the
// member list's history shows every member of the one cluster).
func TestLiveMoveHoldingASourceMember(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	ctx := testContext(t, siteTestDeadline)
	root := moveRoot(t, "druid-stretch-hold-")
	opts := MoveSiteOptions(root)
	for i := range opts {
		opts[i].MaxLearners = MoveReplicas
	}
	sites := startSites(t, opts...)
	a, b := sites[0], sites[1]
	mv, err := NewLiveMove(ctx, a, b, LiveMoveOptions{RTT: DefaultMoveRTT, HoldSource: 1, Out: testWriter{t}, ReadyzExclude: testReadyzExclude})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mv.CreateSource(ctx)).To(Succeed())
	// Both controllers' records are dropped after every step they make
	// (statusWiper): the move decides from etcd and the sidecars' step
	// records, not from a status someone else can drop.
	wiper := wipeStatusAfterEveryStep(ctx, t, mv.Key(), a, b)
	run, err := mv.Run(ctx)
	wipes := wiper.stop()
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("the move took %s", run.MoveTook.Round(100*time.Millisecond))
	t.Logf("status.membership was dropped %d times: %v", len(wipes), wipes)
	// The wiper drops the record it finds at a poll: a step whose record
	// the next one replaced first has no drop of its own, which on a busy
	// machine can be every removal (the controller plans the next step as
	// soon as a removal is applied), and in this order every promotion: the
	// warm learners are promoted in the calls that remove a source member
	// (their record is the removal's) or right before the next add. The
	// adds are the steps after which a dropped record once cost a cluster;
	// one drop after a change of the voters (a promotion or a removal)
	// covers the rest.
	g.Expect(kinds(wipes)).To(ContainElement(v1alpha1.StepAddLearner), "status.membership was dropped after a learner's add")
	g.Expect(kinds(wipes)).To(ContainElement(BeElementOf(v1alpha1.StepPromoteLearner, v1alpha1.StepRemoveMember)),
		"status.membership was dropped after a change of the voters")
	expectTLSMembers(t, run.Membership)
	fewest, at, lasted := run.Membership.FewestVoters()
	t.Logf("the fewest voters: %d, from %s for %s", fewest, at.Format(time.RFC3339Nano), lasted)
	g.Expect(fewest).To(BeNumerically(">=", MoveReplicas), "no voter was lost to a dropped status")
	expectOneCluster(g, run.Membership)

	g.Expect(run.OwnLost.Lost).To(BeEmpty(), "no acknowledged write lost")
	g.Expect(run.Own.Linearizable).To(BeTrue(), "the own client's history is linearizable: %s", run.Own.LinearizabilityResult)
	// A's clients wait through the leader transfer and then commit across
	// the link (longest write gaps of 0.74-1.32 s at 180 ms RTT in the
	// bench); B's meet no membership change.
	api := run.API
	expectKubeAPIServersSawNothing(t, api, a)

	// The held member goes only after the switch, and at the switch B
	// held the majority beside it.
	var switched time.Time
	for _, m := range api.Marks {
		if strings.HasPrefix(m.Name, "switch ") {
			switched = api.StartedAt.Add(m.At)
		}
	}
	g.Expect(switched).NotTo(BeZero(), "the clients were switched: %v", api.Marks)
	var removals []Transition
	for _, tr := range run.Membership.TimedTransitions() {
		if strings.Contains(tr.Change, "remove etcd-main-") {
			removals = append(removals, tr)
		}
	}
	t.Logf("removals: %v; clients switched at %s", removals, switched.Format(time.RFC3339Nano))
	// One removal alone, one with the promotion that made the tie (a poll
	// may see those two apart), then the held member's.
	g.Expect(removals).To(HaveLen(MoveReplicas), "every source member removed once")
	var before, after int
	for _, tr := range removals {
		if tr.At.Before(switched) {
			before++
		} else {
			after++
		}
	}
	g.Expect(before).To(Equal(MoveReplicas-1), "every source member but the held one went before the switch")
	g.Expect(after).To(Equal(1), "the held member went after the switch")
	tie, ties := run.Membership.LongestTie(func(name string) bool { return memberOrdinal(name) >= 3 })
	t.Logf("polls saw the voters tied %d time(s), the longest for %s; the controllers measured %d, %.3f s in all", ties, tie, run.Ties, run.TieSeconds)
	g.Expect(ties).To(BeNumerically("<=", 1), "the move passes through one tie at most")
	g.Expect(run.TiesUnderOneSecond).To(Equal(run.Ties), "every tie lasted under a second")
	g.Expect(run.EtcdCrashes).To(BeEmpty(), "etcd panics or fatal exits")
	g.Expect(run.Membership.Last()).To(ConsistOf(
		HaveField("Name", "etcd-main-3"), HaveField("Name", "etcd-main-4"), HaveField("Name", "etcd-main-5")))
}

// expectCompactionDuringMove logs druid's compaction Jobs of both sites on
// the move's clock, beside the move's steps, and asserts that druid
// compacted the source's backups while the move ran: a compaction Job of
// the source Etcd began between the move's start and its end (the move
// asked for a delta snapshot once the destination had joined,
// LiveMoveOptions.DeltaSnapshotAfterJoin, so that druid's trigger falls
// inside the move however fast the machine moves it) and completed, its
// pod logged the compacted snapshot (etcdbrctl compact also exits 0 when
// it cannot open the store), druid recorded it on the Etcd, and no
// compaction Job of either site failed.
func expectCompactionDuringMove(t *testing.T, run *LiveMoveRun, a *Site) {
	t.Helper()
	g := NewWithT(t)
	origin := run.MoveStarted
	var steps []string
	for _, m := range run.API.Marks {
		steps = append(steps, fmt.Sprintf("%+.1f s %s", run.API.StartedAt.Add(m.At).Sub(origin).Seconds(), m.Name))
	}
	t.Logf("on the move's clock (0: the move's start, %+.1f s: its end): %s", run.MoveTook.Seconds(), strings.Join(steps, "; "))
	g.Expect(run.DeltaSnapshot).NotTo(BeNil(), "the move asked for a delta snapshot after the join")
	g.Expect(run.DeltaSnapshot.Err).NotTo(HaveOccurred())
	t.Logf("delta snapshot asked for at %+.1f s, taken by the backup-restore of %s", run.DeltaSnapshot.At.Sub(origin).Seconds(), run.DeltaSnapshot.Pod)
	var during, succeeded int
	for _, j := range run.CompactionJobs {
		t.Logf("druid's compaction Job: %s", j.Describe(origin))
		g.Expect(j.Failed).To(BeFalse(), "druid's compaction Job %s", j.Describe(origin))
		if j.Site != SourceIdentity || j.Etcd != MoveEtcdName || !j.Succeeded {
			continue
		}
		succeeded++
		if j.BeganWithin(run.MoveStarted, run.MoveEnded()) {
			during++
		}
	}
	g.Expect(during).To(BeNumerically(">=", 1), "a compaction Job of the source Etcd began during the move and completed: %d completed in all", succeeded)
	log, runs, err := a.ContainerLogs(moveNamespace, druidv1alpha1.GetCompactionJobName(metav1.ObjectMeta{Name: MoveEtcdName})+"-*", "compact-backup")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(runs).To(BeNumerically(">=", succeeded), "a pod ran for each compaction Job")
	g.Expect(strings.Count(log, "Compacted snapshot name")).To(BeNumerically(">=", succeeded), "each compaction Job's etcdbrctl saved a compacted snapshot:\n%s", log)
	src := &v1alpha1.Etcd{}
	g.Expect(a.Client.Get(context.Background(), client.ObjectKey{Namespace: moveNamespace, Name: MoveEtcdName}, src)).To(Succeed())
	g.Expect(src.Status.Conditions).To(ContainElement(And(
		HaveField("Type", druidv1alpha1.ConditionTypeLastSnapshotCompactionSucceeded),
		HaveField("Status", druidv1alpha1.ConditionTrue))), "druid recorded the compaction on the source Etcd: %s", Conditions(src.Status.Conditions))
}

// expectDestinationReadyAndOwnHistory asserts that druid reported B Ready
// from its first Ready sample on, that B's first member ran once (no
// template change restarted it during the move), and that the project's
// own etcd client lost no acknowledged write in a linearizable history.
// expectTLSMembers: every member the polls saw advertised https peer and
// client URLs, as on a seed: etcd served its members and clients over TLS.
func expectTLSMembers(t *testing.T, h *MembershipHistory) {
	t.Helper()
	NewWithT(t).Expect(h.PlainURLs()).To(BeEmpty(), "member URLs that are not https")
}

func expectDestinationReadyAndOwnHistory(t *testing.T, run *LiveMoveRun) {
	t.Helper()
	g := NewWithT(t)
	expectTLSMembers(t, run.Membership)
	firstReady := slices.Index(run.DruidReady, true)
	g.Expect(firstReady).To(BeNumerically(">=", 0), "druid reported B Ready during the move (%d samples)", len(run.DruidReady))
	g.Expect(run.DruidReady[firstReady:]).To(HaveEach(BeTrue()), "once Ready, druid reports B Ready for the rest of the move")
	t.Logf("druid's Ready of B, sampled every second from B's join: first Ready after %d s, then %d samples, all Ready", firstReady, len(run.DruidReady)-firstReady)
	g.Expect(run.FirstMemberRuns).To(Equal(1), "B's first member ran once: no template change restarted it during the move")

	f := run.Own
	t.Logf("own etcd client: %d writes, %d reads, %d failed (%v), %d retries, max write gap %s", f.Writes, f.Reads, f.FailedRequests, f.FailedErrors, f.Retries, f.MaxWriteGap)
	g.Expect(run.OwnLost.Lost).To(BeEmpty(), "no acknowledged write lost")
	g.Expect(f.Linearizable).To(BeTrue(), "the own client's history is linearizable: %s", f.LinearizabilityResult)
}

// expectKubeAPIServersSawNothing logs what the kube-apiservers' clients
// saw, keeps it as apiload-results.json in s's folder, and asserts it: no
// acknowledged write lost, one linearizable history, and per server no
// failed request and no stall: no wait between two acknowledged writes
// longer than a client gate holds calls at most (sidecar.MaxClientHold).
// The longest write gap itself, a figure of the machine's load as much as
// of the move (under a second on a quiet machine, its target; over it
// with both cores kept busy), is logged and reported by the demo and the
// bench, not bounded here.
// expectOneCluster asserts that every member list the history's polls saw
// shares a member with the one before: one cluster throughout, never a new
// one bootstrapped beside it.
func expectOneCluster(g Gomega, history *MembershipHistory) {
	lists := history.Snapshot()
	for i := 1; i < len(lists); i++ {
		var before []uint64
		for _, m := range lists[i-1] {
			before = append(before, m.ID)
		}
		g.Expect(lists[i]).To(ContainElement(HaveField("ID", BeElementOf(before))), "one cluster throughout: each member list shares a member with the one before (%v after %v)", lists[i], lists[i-1])
	}
}

func expectKubeAPIServersSawNothing(t *testing.T, api apiload.Results, s *Site) {
	t.Helper()
	g := NewWithT(t)
	t.Logf("kube-apiserver clients:\n%s", api)
	marks := make([]string, 0, len(api.Marks))
	for _, m := range api.Marks {
		marks = append(marks, fmt.Sprintf("%.1f s %s", m.At.Seconds(), m.Name))
	}
	t.Logf("on the load's clock: %s", strings.Join(marks, "; "))
	g.Expect(json.NewEncoder(logFileOf(t, s, "apiload-results.json")).Encode(api)).To(Succeed())
	g.Expect(api.LostAcknowledgedWrites).To(BeZero(), "no write a kube-apiserver acknowledged is lost: %v", api.LostWrites)
	g.Expect(api.Linearizable).To(BeTrue(), "the kube-apiservers' history is linearizable: %s", api.LinearizabilityResult)
	for _, f := range api.Servers {
		t.Logf("%s: %d writes, %d failed (by class %v), max write gap %s", f.Name, f.Writes, f.Failed, f.FailedByClass, f.MaxWriteGap)
		g.Expect(f.Failed).To(BeZero(), "failed requests through %s's kube-apiserver: %v", f.Name, f.FailedErrors)
		g.Expect(f.MaxWriteGap).To(BeNumerically("<=", sidecar.MaxClientHold), "the longest write gap of %s's clients: a stall", f.Name)
		if f.MaxWriteGap > time.Second {
			t.Logf("%s's longest write gap, %s, is over the 1 s target (load average %s)", f.Name, f.MaxWriteGap, loadAverage())
		}
	}
}

// expectInterleavedMove asserts that the member list, as the polls saw it,
// went through the planner's interleaved move of etcd-main-0..2 to
// etcd-main-3..5 and nothing else: a new member added and promoted, then
// an old one removed; where the majority changes sides, the promotion that
// makes the tie and the removal that ends it go in one sidecar call, so a
// poll sees them together. Which old member goes when depends on where the
// leader is (never the leader first), so the old members are named by
// role only: label; so are the new ones, promoted as they are ready. It ends with the three new members voting. The
// learners' adds are counted, not placed: how far ahead of its promotion
// a learner joins depends on the learner slots (the controller's
// --max-learners) and on the move (a warmed destination adds its further
// members while the clients are switched), and the promotions and
// removals interleave the same either way.
//
// The polls come 100 ms apart, and a planner sends a removal's next step
// at once, so one poll may see two changes; applied, the changes a member
// that stayed throughout applied (AppliedConfChanges of etcd-main-3's
// log), orders them.
func expectInterleavedMove(t *testing.T, history *MembershipHistory, applied []ConfChange, label string) {
	t.Helper()
	g := NewWithT(t)
	steps := history.TransitionsInApplyOrder(applied)
	t.Logf("membership steps: %s", strings.Join(steps, "; "))
	var removed []string
	shape := slices.Clone(steps)
	for i, s := range shape {
		for _, old := range []string{"etcd-main-0", "etcd-main-1", "etcd-main-2"} {
			if strings.Contains(s, "remove "+old) {
				removed = append(removed, old)
				shape[i] = strings.Replace(s, "remove "+old, "remove "+label, 1)
			}
		}
	}
	const add = "add learner (unnamed)"
	g.Expect(shape).NotTo(BeEmpty())
	g.Expect(shape[0]).To(Equal(add), "a learner comes first; membership history: %v", history.Snapshot())
	g.Expect(slices.DeleteFunc(slices.Clone(shape), func(s string) bool { return s != add })).To(HaveLen(3),
		"three learners added; membership history: %v", history.Snapshot())
	// Which learner is promoted first is whichever is ready first, so the
	// new members too are named by role only.
	changes := slices.DeleteFunc(slices.Clone(shape), func(s string) bool { return s == add })
	newMember := strings.NewReplacer("promote etcd-main-3", "promote a new member", "promote etcd-main-4", "promote a new member", "promote etcd-main-5", "promote a new member")
	for i, s := range changes {
		changes[i] = newMember.Replace(s)
	}
	// On a busy machine a poll may still fall between etcd's two commits
	// of the tie's sidecar call and see them apart; how long the tie lasted
	// is asserted by the caller.
	tie := "promote a new member + remove " + label
	if len(changes) == 6 && changes[2] == "promote a new member" && changes[3] == "remove "+label {
		changes = slices.Replace(changes, 2, 4, tie)
	}
	g.Expect(changes).To(Equal([]string{
		"promote a new member", "remove " + label,
		tie,
		"promote a new member", "remove " + label,
	}), "promotions and removals interleave, one tie; membership history: %v", history.Snapshot())
	g.Expect(removed).To(ConsistOf("etcd-main-0", "etcd-main-1", "etcd-main-2"))
	g.Expect(history.Last()).To(ConsistOf(
		HaveField("Name", "etcd-main-3"), HaveField("Name", "etcd-main-4"), HaveField("Name", "etcd-main-5")))
	for _, m := range history.Last() {
		g.Expect(m.Learner).To(BeFalse(), "%s votes", m.Name)
	}
}

// appliedConfChanges are the membership changes the etcd of pod applied,
// in every run of the pod, from its container log.
func appliedConfChanges(t *testing.T, s *Site, namespace, pod string) []ConfChange {
	t.Helper()
	log, _, err := s.ContainerLogs(namespace, pod, "etcd")
	if err != nil {
		t.Fatalf("reading the etcd log of %s: %v", pod, err)
	}
	return AppliedConfChanges(log)
}

// testWriter writes each line to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// forceDruidReconcile sets the operation annotation druid reconciles on.
func forceDruidReconcile(s *Site, namespace, name string) error {
	e := &v1alpha1.Etcd{}
	if err := s.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, e); err != nil {
		return err
	}
	patch := client.MergeFrom(e.DeepCopy())
	if e.Annotations == nil {
		e.Annotations = map[string]string{}
	}
	e.Annotations["gardener.cloud/operation"] = "reconcile"
	return s.Client.Patch(context.Background(), e, patch)
}

// readPrefix reads every key under prefix through cli, serializable (what
// the member asked holds) or linearizable.
func readPrefix(t *testing.T, cli *clientv3.Client, prefix string, serializable bool) map[string]string {
	t.Helper()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, opts...)
	if err != nil {
		t.Fatalf("reading %s: %v", prefix, err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}

// memberOrdinal is the ordinal at the end of a member name, -1 if none.
func memberOrdinal(name string) int {
	i := strings.LastIndex(name, "-")
	n, err := strconv.Atoi(name[i+1:])
	if i < 0 || err != nil {
		return -1
	}
	return n
}

// waitVoters waits until druid-stretch reports n voters for e.
func waitVoters(t *testing.T, s *Site, e *v1alpha1.Etcd, n int) {
	t.Helper()
	if err := s.WaitVoters(context.Background(), client.ObjectKeyFromObject(e), n, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// etcdClientVia is an etcd client of the given client URLs, dialing through
// s's pod network (and its peers').
func etcdClientVia(t *testing.T, s *Site, eps ...string) *clientv3.Client {
	t.Helper()
	cli, err := s.EtcdClient(eps...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// siteTestDeadline bounds a site test's own waits. A move takes 3-6
// minutes on a busy 2-core machine; a wait that outlasts this is a stall,
// and it must fail its test with the wait's name and leave the package's
// other tests their time, not run into go test's timeout, which prints
// only goroutines.
const siteTestDeadline = 15 * time.Minute

// testContext is a site test's context: done when the test ends or after
// d, whichever comes first.
func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// moveRoot is the folder of a live move's two sites, for a test run as
// root: removed at the end unless the test failed (its sites' folders then
// hold their logs, leaveSiteFolder) or DRUID_STRETCH_KEEP_SITES is set.
func moveRoot(t *testing.T, pattern string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("a real site needs root: its pods get network namespaces and chroots")
	}
	root, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() && os.Getenv("DRUID_STRETCH_KEEP_SITES") == "" {
			_ = os.RemoveAll(root)
		}
	})
	return root
}

// leaveSiteFolder removes a site's folder after a test that passed. After
// one that failed it keeps the logs (the processes' in logs/, the
// containers' in node/) and removes the pods' volumes (hostpath/: the etcd
// members' data and backups, hundreds of MB a site, which would fill the
// disk of a run with several failures); DRUID_STRETCH_KEEP_SITES keeps
// the whole folder either way.
func leaveSiteFolder(t *testing.T, what, dir string) {
	switch {
	case os.Getenv("DRUID_STRETCH_KEEP_SITES") != "":
		t.Logf("the folder of %s (processes' logs in logs/, containers' in node/, volumes in hostpath/): %s", what, dir)
	case t.Failed():
		logExcerpt(t, what, filepath.Join(dir, "site.log"))
		_ = os.RemoveAll(filepath.Join(dir, "hostpath"))
		t.Logf("the logs of %s (processes' in logs/, containers' in node/; the volumes were removed, DRUID_STRETCH_KEEP_SITES=1 keeps them): %s", what, dir)
	default:
		_ = os.RemoveAll(dir)
	}
}

// testReadyzExclude is the shoot kube-apiservers' readiness in the tests:
// /readyz without the RBAC bootstrap, which the clients (system:masters)
// do not wait on and which the destination's server runs one round trip
// between the sites per default role (apiload.RBACBootstrapCheck). The
// bench keeps the full /readyz.
var testReadyzExclude = []string{apiload.RBACBootstrapCheck}

// startSites starts sites side by side and stops them when the test ends.
// A site without a folder gets a temporary one; each site's folder is
// removed at the end, or reduced to its logs when the test failed
// (leaveSiteFolder).
func startSites(t *testing.T, opts ...Options) []*Site {
	t.Helper()
	for i := range opts {
		o := &opts[i]
		if o.Dir == "" {
			dir, err := os.MkdirTemp("", "druid-stretch-site-")
			if err != nil {
				t.Fatal(err)
			}
			o.Dir = dir
		} else if err := os.MkdirAll(o.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		logFile, err := os.Create(filepath.Join(o.Dir, "site.log"))
		if err != nil {
			t.Fatal(err)
		}
		o.Logger = ctrlzap.New(ctrlzap.WriteTo(logFile))
		dir, identity := o.Dir, o.ClusterIdentity
		// Registered before the site's Stop, so it runs after it.
		t.Cleanup(func() {
			_ = logFile.Close()
			leaveSiteFolder(t, "site "+identity, dir)
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sites, err := StartSites(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sites {
		t.Cleanup(func() {
			if err := s.Stop(); err != nil {
				t.Errorf("stopping site %s: %v", s.opts.ClusterIdentity, err)
			}
		})
	}
	return sites
}

// logFileOf is a log file in s's folder, closed when the test ends.
func logFileOf(t *testing.T, s *Site, name string) *os.File {
	f, err := os.Create(filepath.Join(s.Dir, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// containerLogs is a container's output over every run of pod p on any
// node of s (a deleted and recreated pod included); the test fails if the
// pod never ran there.
func containerLogs(t *testing.T, s *Site, p corev1.Pod, container string) string {
	t.Helper()
	log, runs, err := s.ContainerLogs(p.Namespace, p.Name, container)
	if err != nil || runs == 0 {
		t.Fatalf("no run of pod %s/%s on the nodes (%v)", p.Namespace, p.Name, err)
	}
	return log
}

// logTemplateChanges logs how each revision of a StatefulSet's pod template
// differs from the one before: a new revision restarts the pods, so these
// lines say what made a pod restart during a move.
func logTemplateChanges(t *testing.T, s *Site, namespace, name string) {
	t.Helper()
	list, err := s.Kube.AppsV1().ControllerRevisions(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Logf("listing the ControllerRevisions of %s/%s: %v", namespace, name, err)
		return
	}
	var revs []appsv1.ControllerRevision
	for _, r := range list.Items {
		if c := metav1.GetControllerOf(&r); c != nil && c.Kind == "StatefulSet" && c.Name == name {
			revs = append(revs, r)
		}
	}
	slices.SortFunc(revs, func(a, b appsv1.ControllerRevision) int { return cmp.Compare(a.Revision, b.Revision) })
	for i := 1; i < len(revs); i++ {
		var before, after map[string]any
		if err := json.Unmarshal(revs[i-1].Data.Raw, &before); err != nil {
			t.Logf("decoding revision %s: %v", revs[i-1].Name, err)
			return
		}
		if err := json.Unmarshal(revs[i].Data.Raw, &after); err != nil {
			t.Logf("decoding revision %s: %v", revs[i].Name, err)
			return
		}
		t.Logf("StatefulSet %s/%s of %s, pod template revision %d -> %d (-before +after):\n%s",
			namespace, name, s.opts.ClusterIdentity, revs[i-1].Revision, revs[i].Revision, gocmp.Diff(before, after))
	}
}

// loadAverage is the machine's load average over 1, 5 and 15 minutes, as
// uptime prints it, for a figure that depends on it.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " / ")
}

// logTieLength logs how long the tie lasted, as the polls and the
// controllers saw it. Under a second is the target on a quiet machine; the
// figure follows the machine's load as much as the move, so the demo and
// the bench report it against their baseline and no test bounds it. That
// the majority changes sides through one tie is the plan's shape, which
// the callers assert.
func logTieLength(t *testing.T, polled time.Duration, ties, underOneSecond uint64) {
	t.Helper()
	if polled >= time.Second || underOneSecond < ties {
		t.Logf("a tie lasted a second or more (polls: %s; the controllers: %d of %d under a second), over the target (load average %s)",
			polled, underOneSecond, ties, loadAverage())
	}
}
