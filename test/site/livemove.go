package site

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
)

// MoveNamespace is the shoot namespace of a live move, the same in both
// sites as in two Gardener seeds.
const MoveNamespace = "shoot--dev--move"

// MoveEtcdName is the Etcd a live move moves.
const MoveEtcdName = "etcd-main"

// MoveReplicas is the size of the moved Etcd.
const MoveReplicas = 3

// DefaultMoveRTT is the round trip between the two sites of a move: two
// regions apart, the distance a live control plane migration spans.
const DefaultMoveRTT = 180 * time.Millisecond

// The cluster identities and external DNS zones of the two sites of a move.
const (
	SourceIdentity      = "site-a"
	DestinationIdentity = "site-b"
	sourceDomain        = "site-a.test"
	destinationDomain   = "site-b.test"
)

// MoveCompactionEventsThreshold is druid's compaction events threshold in
// the sites of a live move: low enough that one delta snapshot period of
// the move's traffic (a shoot kube-apiserver's clients and the own etcd
// client) crosses it, so that druid runs compaction Jobs while the move
// runs, as it does on a seed; the chart's 1,000,000 is never reached in a
// test. The Etcd keeps the manifest's delta snapshot period: the move's
// steps before the leader leaves the source outlast it, and druid reacts
// to the delta snapshot lease each period renews.
const MoveCompactionEventsThreshold = 500

// MoveSiteOptions are the options of the two sites of a live move, in
// order source, destination, with their folders under dir: distinct
// cluster identities, pod networks and external DNS zones, as two seeds
// have, druid-stretch installed in both, and druid's compaction at
// MoveCompactionEventsThreshold.
func MoveSiteOptions(dir string) []Options {
	// One druid-stretch client CA for both: each site's controller calls
	// the other's sidecars.
	ca, err := pki.NewCA("druid-stretch-client-ca")
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return []Options{
		{Dir: filepath.Join(dir, SourceIdentity), DruidStretch: true, ClusterIdentity: SourceIdentity, PodCIDR: "10.244.0.0/16", Domain: sourceDomain, CompactionEventsThreshold: MoveCompactionEventsThreshold, StretchCA: ca},
		{Dir: filepath.Join(dir, DestinationIdentity), DruidStretch: true, ClusterIdentity: DestinationIdentity, PodCIDR: "10.245.0.0/16", Domain: destinationDomain, CompactionEventsThreshold: MoveCompactionEventsThreshold, StretchCA: ca},
	}
}

// StartSites starts sites side by side. On error, the sites that started
// are stopped again.
func StartSites(ctx context.Context, opts ...Options) ([]*Site, error) {
	sites := make([]*Site, len(opts))
	errs := make([]error, len(opts))
	var wg sync.WaitGroup
	for i, o := range opts {
		wg.Go(func() {
			sites[i], errs[i] = Start(ctx, o)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("starting site %s (logs in %s): %w", o.ClusterIdentity, o.Dir, errs[i])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, s := range sites {
			if s != nil {
				err = errors.Join(err, s.Stop())
			}
		}
		return nil, err
	}
	return sites, nil
}

// LiveMoveOptions configure a LiveMove.
type LiveMoveOptions struct {
	// RTT is the round trip between the sites; 0 puts them at no distance
	// (the test and the demo pass DefaultMoveRTT).
	RTT time.Duration
	// Workload configures the project's own etcd client, a second,
	// lower-level check beside the kube-apiservers' clients (its preload
	// among others); its endpoints, dialer, prefix and log are set here.
	Workload workload.Options
	// Before is how long the kube-apiservers' clients write before the move
	// starts, counted from when A's kube-apiserver serves (default 5 s);
	// After how long the destination's clients write after the move's end
	// (default 5 s).
	Before, After time.Duration
	// HoldSource is the mover's HoldSource (0: switch the clients first):
	// above 0 the destination retires all source members but that many,
	// then the clients switch, then the held ones go.
	HoldSource int32
	// GEP39 makes the move GEP-39's (livemove.GEP39): the adapter writes
	// druid's own fields only, and B's members, named with B's cluster
	// identity as spec.memberNamePrefix, take the ordinals 0..2 in B (the
	// in-cluster names of A's pods).
	GEP39 bool
	// RenewCertificatesAt, when set, is the step at whose start the
	// shoot's server, peer and client certificates are renewed in both
	// sites (ShootTLS.Renew), as gardenlet renews them in place while the
	// move goes on; LiveMoveRun.Renewal says when the source's first
	// member served the new server certificate.
	RenewCertificatesAt move.Step
	// DeltaSnapshotAfterJoin, once the destination's join is done, asks the source's backup-restore for a delta snapshot out of
	// its schedule (Site.TriggerSnapshot): its lease renewal lets
	// druid start a compaction Job of the source inside the move, however
	// short the move is next to the delta snapshot period.
	// LiveMoveRun.DeltaSnapshot says when and where.
	DeltaSnapshotAfterJoin bool
	// AbortAfter, when set, aborts the move once that step is done
	// (Mover.Abort), as gardenlet takes a move back: the clients that went
	// to the destination's kube-apiserver switch back to the source's, the
	// destination's kube-apiserver stops, and the abort takes the
	// destination's members out. The run then ends with the source's
	// members and checks the histories through the source.
	AbortAfter move.Step
	// ReadyzExclude names the /readyz checks that the shoot kube-apiservers'
	// readiness leaves out, both their pods' probes and the clients' gate
	// (apiload.Options.ReadyzExclude): the tests leave out
	// apiload.RBACBootstrapCheck, the bench and the demo nothing.
	ReadyzExclude []string
	// OnEvent, when set, sees every event of the move as it happens.
	OnEvent func(livemove.Event)
	// Out receives one line per stage (default: nothing). The logs of the
	// move's own parts (the mover, the loads) go to files in the source
	// site's folder.
	Out io.Writer
}

// LiveMove is the live move of a shoot's etcd-main from site A to site B,
// two peered sites of real parts, with the migration adapter as gardenlet
// drives it: a shoot kube-apiserver in each site on its own site's etcd
// client Service, client-go clients through both for the whole move, and
// the source's clients switched to the destination's kube-apiserver before
// any source member goes.
type LiveMove struct {
	// A is the source site, B the destination.
	A, B *Site
	opts LiveMoveOptions
	// crds write druid's own CRDs into A and B from CreateSource to the
	// end of Run, as gardenlet does on both seeds.
	crds []*CRDDeployer
	// compactions record druid's compaction Jobs in A and B over the same
	// time.
	compactions []*CompactionRecorder
	// shoot is the shoot's TLS, installed in both sites.
	shoot *ShootTLS
}

// DruidCRDPeriod is how often a live move writes druid's own CRDs into
// both sites: gardenlet writes them on every seed reconcile, about once a
// minute; twice as often here, so that a move of two minutes meets
// several writes.
const DruidCRDPeriod = 30 * time.Second

// NewLiveMove peers a and b at opts.RTT and creates the shoot namespace in
// both, with the shoot's TLS Secrets (the same in both). a and b are sites
// of MoveSiteOptions.
func NewLiveMove(ctx context.Context, a, b *Site, opts LiveMoveOptions) (*LiveMove, error) {
	if opts.RTT < 0 {
		return nil, fmt.Errorf("the round trip between the sites is %s: want 0 or more", opts.RTT)
	}
	if opts.Before <= 0 {
		opts.Before = 5 * time.Second
	}
	if opts.After <= 0 {
		opts.After = 5 * time.Second
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if err := Peer(a, b, opts.RTT); err != nil {
		return nil, fmt.Errorf("peering the sites: %w", err)
	}
	// A GEP-39 move runs in a shoot namespace of two seeds, whose Etcds
	// druid-stretch manages without an object of its own; the other moves
	// opt their Etcds in with EtcdMemberships, as a user without gardenlet
	// does.
	var labels map[string]string
	if opts.GEP39 {
		labels = ShootNamespaceLabels
	}
	shoot, err := NewShootTLS([]string{MoveNamespace}, a.opts.Domain, b.opts.Domain)
	if err != nil {
		return nil, err
	}
	for _, s := range []*Site{a, b} {
		if err := s.CreateNamespace(ctx, MoveNamespace, labels); err != nil {
			return nil, err
		}
		if err := s.InstallShootTLS(ctx, shoot, MoveNamespace); err != nil {
			return nil, err
		}
	}
	return &LiveMove{A: a, B: b, opts: opts, shoot: shoot}, nil
}

// Key is the moved Etcd's key, the same in both sites.
func (m *LiveMove) Key() client.ObjectKey {
	return client.ObjectKey{Namespace: MoveNamespace, Name: MoveEtcdName}
}

func (m *LiveMove) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(m.opts.Out, format+"\n", args...)
}

// CreateSource starts writing druid's own CRDs into both sites, as
// gardenlet does, and recording druid's compaction Jobs of the move's
// namespace in both (each until the end of Run), creates the source Etcd
// in A with druid's own type, advertising its members' names under A's
// external domain (in a GEP-39 move it advertises none: the move's first
// stage adds them), opts it in to druid-stretch with an EtcdMembership
// (in a GEP-39 move its namespace's labels opt it in, as on a seed), and
// waits until druid reports it Ready and druid-stretch sees its
// voters.
func (m *LiveMove) CreateSource(ctx context.Context) error {
	for _, s := range []*Site{m.A, m.B} {
		d, err := s.DeployDruidCRDs(ctx, DruidCRDPeriod)
		if err != nil {
			return fmt.Errorf("writing druid's CRDs into %s: %w", s.opts.ClusterIdentity, err)
		}
		m.crds = append(m.crds, d)
		c, err := s.RecordCompactionJobs(ctx, MoveNamespace)
		if err != nil {
			return err
		}
		m.compactions = append(m.compactions, c)
	}
	if !m.opts.GEP39 {
		opted := &stretchv1alpha1.EtcdMembership{ObjectMeta: metav1.ObjectMeta{Namespace: MoveNamespace, Name: MoveEtcdName}}
		opted.Spec.OrdinalStart = ptr.To[int32](0)
		if err := m.A.Client.Create(ctx, opted); err != nil {
			return fmt.Errorf("creating the source's EtcdMembership: %w", err)
		}
	}
	if _, err := m.A.CreateEtcd(ctx, MoveNamespace, func(o *unstructured.Unstructured) error {
		if m.opts.GEP39 {
			// A running Etcd as a seed has it: GEP-39's first stage gives
			// it the additional peer URLs, and druid rolls its pods.
			return nil
		}
		return unstructured.SetNestedSlice(o.Object, ExternalPeerURLs(MoveEtcdName, MoveReplicas, sourceDomain), "spec", "etcd", "additionalAdvertisePeerURLs")
	}); err != nil {
		return err
	}
	if err := m.A.WaitEtcdReady(ctx, m.Key(), MoveReplicas, 5*time.Minute); err != nil {
		return err
	}
	if err := m.A.WaitVoters(ctx, m.Key(), MoveReplicas, 3*time.Minute); err != nil {
		return err
	}
	if m.opts.GEP39 {
		return m.optedInByNamespace(ctx)
	}
	return nil
}

// optedInByNamespace checks that the controller wrote down the source's
// opt-in by its namespace: an EtcdMembership of ordinalStart 0 and no
// other field, owned by the Etcd.
func (m *LiveMove) optedInByNamespace(ctx context.Context) error {
	p, err := etcdview.Get(ctx, m.A.Client, m.Key())
	if err != nil {
		return err
	}
	want := v1alpha1.MembershipSpec{OrdinalStart: ptr.To[int32](0)}
	switch {
	case p.Membership == nil:
		return fmt.Errorf("the source %s runs in a shoot namespace but has no EtcdMembership", m.Key())
	case !equality.Semantic.DeepEqual(p.Membership.Spec.MembershipSpec, want):
		return fmt.Errorf("the source's EtcdMembership, created for its namespace, has spec %+v: want ordinalStart 0 alone", p.Membership.Spec.MembershipSpec)
	case !slices.Contains(p.Membership.OwnerReferences, stretchv1alpha1.OwnerReference(p.Etcd)):
		return fmt.Errorf("the source's EtcdMembership is not owned by its Etcd (owners %v)", p.Membership.OwnerReferences)
	}
	m.printf("source opted in by its namespace's labels: the controller created its EtcdMembership (ordinalStart 0)")
	return nil
}

// ExternalPeerURLs is spec.etcd.additionalAdvertisePeerURLs giving the pods
// 0..n-1 of Etcd name in MoveNamespace their name under the site's domain.
func ExternalPeerURLs(name string, n int, domain string) []any {
	var out []any
	for i := range n {
		pod := fmt.Sprintf("%s-%d", name, i)
		out = append(out, map[string]any{"memberName": pod,
			"urls": []any{fmt.Sprintf("https://%s.%s.%s:2380", pod, MoveNamespace, domain)}})
	}
	return out
}

// ClientURLs are the external client URLs of the members of both sides: A's
// pods 0..2 under A's domain, then B's 3..5 under B's.
func ClientURLs() []string { return clientURLs(MoveReplicas) }

// clientURLs are A's pods 0..2 under A's domain, then B's from ordinal
// bFirst under B's (0 in a GEP-39 move).
func clientURLs(bFirst int) []string {
	var eps []string
	for i := range MoveReplicas {
		eps = append(eps, fmt.Sprintf("https://%s-%d.%s.%s:2379", MoveEtcdName, i, MoveNamespace, sourceDomain))
	}
	for i := range MoveReplicas {
		eps = append(eps, fmt.Sprintf("https://%s-%d.%s.%s:2379", MoveEtcdName, bFirst+i, MoveNamespace, destinationDomain))
	}
	return eps
}

// destinationFirst is B's first ordinal: after A's, or 0 in a GEP-39 move,
// whose member name prefix keeps the names apart.
func (m *LiveMove) destinationFirst() int {
	if m.opts.GEP39 {
		return 0
	}
	return MoveReplicas
}

// StepDoneSuffix ends the mark of a step's end; its start's mark is the
// step's name alone.
const StepDoneSuffix = " done"

// LiveMoveRun is what a live move showed.
type LiveMoveRun struct {
	// MoveStarted is when the move's first step began; MoveTook how long
	// the whole move took.
	MoveStarted time.Time
	MoveTook    time.Duration
	// Aborted says that the move was aborted (LiveMoveOptions.AbortAfter)
	// and the cluster is the source's again.
	Aborted bool
	// Renewal is the certificate renewal of
	// LiveMoveOptions.RenewCertificatesAt, nil without one.
	Renewal *CertificateRenewal
	// DeltaSnapshot is the delta snapshot of
	// LiveMoveOptions.DeltaSnapshotAfterJoin, nil without one.
	DeltaSnapshot *SnapshotTaken
	// API are the kube-apiservers' clients' figures; APIRequests every
	// request they made.
	API         apiload.Results
	APIRequests []apiload.Request
	// Own are the figures of the project's own etcd client, OwnLost its
	// acknowledged writes read back.
	Own     workload.Figures
	OwnLost workload.LostWrites
	// Membership is every member list a poll (every 100 ms) saw.
	Membership *MembershipHistory
	// DruidReady is druid's Ready of B, sampled every second from B's
	// first member's join to the move's end.
	DruidReady []bool
	// Ties is how many ties the controllers measured during the move, and
	// TieSeconds their sum (from etcd's answers to the change that made
	// each and the one that ended it).
	Ties, TiesUnderOneSecond uint64
	TieSeconds               float64
	// EtcdCrashes are the panics and fatal exits in every etcd log of both
	// sites.
	EtcdCrashes []string
	// FirstMemberRuns is how often B's pod etcd-main-3 ran (1: no change of
	// its template restarted it during the move).
	FirstMemberRuns int
	// DruidCRDWrites is how often druid's own CRDs were written into the
	// sites, both counted, from CreateSource to the end of the move.
	DruidCRDWrites int
	// CompactionJobs are druid's compaction Jobs in the move's namespace
	// of both sites, from CreateSource to the end of Run, in the order
	// they appeared.
	CompactionJobs []CompactionJob
	// Progress is what both sites' membership controllers reported of
	// the changes under way (their EtcdMembership's
	// MembershipProgressing), from the start of the traffic to the end of
	// the move, in the order the reports began.
	Progress []Progress
}

// MoveEnded is when the move's last step ended.
func (r *LiveMoveRun) MoveEnded() time.Time { return r.MoveStarted.Add(r.MoveTook) }

// Run runs the client traffic, moves the Etcd while it runs, waits until B
// serves with every member ready and druid reports it Ready, and checks
// the traffic. The Etcd must run in A (CreateSource). The returned run
// holds whatever was measured, also when an error ends it early. Every
// client and load it starts has ended when it returns, and so have the
// writes of druid's CRDs and the recording of compaction Jobs that
// CreateSource started.
func (m *LiveMove) Run(ctx context.Context) (*LiveMoveRun, error) {
	run, err := m.run(ctx)
	for _, d := range m.crds {
		r := d.Stop()
		run.DruidCRDWrites += r.Writes
		if r.Err != nil {
			err = errors.Join(err, fmt.Errorf("writing druid's CRDs as gardenlet does: %w", r.Err))
		}
	}
	m.crds = nil
	for _, c := range m.compactions {
		run.CompactionJobs = append(run.CompactionJobs, c.Stop()...)
	}
	m.compactions = nil
	sortCompactionJobs(run.CompactionJobs)
	return run, err
}

func (m *LiveMove) run(ctx context.Context) (*LiveMoveRun, error) {
	run := &LiveMoveRun{}
	a, b := m.A, m.B
	eps := clientURLs(m.destinationFirst())
	var closers []func() error
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
	}()
	logTo := func(name string) (logr.Logger, error) {
		f, err := os.Create(filepath.Join(a.Dir, name))
		if err != nil {
			return logr.Discard(), err
		}
		closers = append(closers, f.Close)
		// Milliseconds: a step's timeline is read from these lines.
		return ctrlzap.New(ctrlzap.WriteTo(f), func(o *ctrlzap.Options) { o.TimeEncoder = zapcore.RFC3339NanoTimeEncoder }), nil
	}

	// The project's own etcd client through the members' external client
	// URLs, a lower-level check: lost writes and linearizability at the
	// etcd API.
	wlog, err := logTo("workload.log")
	if err != nil {
		return run, err
	}
	wo := m.opts.Workload
	wo.Endpoints, wo.DialContext, wo.Prefix, wo.Log = eps, a.DialContext, "/move/", wlog
	if wo.TLS, err = a.EtcdClientTLS(); err != nil {
		return run, err
	}
	w, err := workload.New(wo)
	if err != nil {
		return run, err
	}
	closers = append(closers, w.Close)
	if wo.PreloadKeys > 0 {
		m.printf("preloading %d keys of %d bytes through the project's own etcd client ...", wo.PreloadKeys, wo.PreloadValueSize)
		if _, err := w.Preload(ctx); err != nil {
			return run, fmt.Errorf("preloading: %w", err)
		}
	}
	m.printf("starting the project's own etcd client ...")
	if err := w.Start(ctx); err != nil {
		return run, fmt.Errorf("starting the own etcd client: %w", err)
	}
	closers = append(closers, func() error { w.Stop(); return nil })

	cli, err := a.EtcdClient(eps...)
	if err != nil {
		return run, err
	}
	closers = append(closers, cli.Close)
	run.Membership = RecordMembership(cli)
	closers = append(closers, func() error { run.Membership.Stop(); return nil })
	progress := RecordProgress([]*Site{a, b}, m.Key())
	closers = append(closers, func() error { run.Progress = progress.Stop(); return nil })

	// The clients that matter: client-go clients of the shoot's
	// kube-apiservers, one per site, each on the etcd client Service of its
	// own site, as Gardener runs a shoot's control plane in each seed
	// during a move. B's starts once B has a ready member.
	var servers []apiload.Server
	shoots := map[*Site]*ShootAPIServer{}
	for _, s := range []*Site{a, b} {
		api, err := s.NewShootAPIServer(s.opts.ClusterIdentity, MoveNamespace, MoveEtcdName, m.opts.ReadyzExclude)
		if err != nil {
			return run, err
		}
		shoots[s] = api
		servers = append(servers, apiload.Server{Name: api.Name, Config: api.Config})
	}
	m.printf("starting the shoot kube-apiserver of %s on its etcd client Service, and client-go clients through it ...", a.opts.ClusterIdentity)
	if err := shoots[a].Start(ctx); err != nil {
		return run, err
	}
	bCtx, cancelB := context.WithCancel(ctx)
	closers = append(closers, func() error { cancelB(); return nil })
	var startErrB error
	startedB := make(chan struct{})
	go func() { startErrB = shoots[b].StartOnceMemberServes(bCtx); close(startedB) }()
	// The switch waits for B's start within its step's deadline: B's Etcd
	// may never show a serving member, and the step must then fail rather
	// than hold the move for good.
	bStarted := func(ctx context.Context) error {
		select {
		case <-startedB:
			return startErrB
		case <-ctx.Done():
			return fmt.Errorf("waiting for a serving member in %s's Etcd status: %w", b.opts.ClusterIdentity, context.Cause(ctx))
		}
	}
	llog, err := logTo("apiload.log")
	if err != nil {
		return run, err
	}
	load, err := apiload.New(apiload.Options{Servers: servers, ReadyzExclude: m.opts.ReadyzExclude, Log: llog})
	if err != nil {
		return run, err
	}
	startCtx, cancelStart := context.WithTimeout(ctx, 3*time.Minute)
	defer cancelStart()
	if err := load.Start(startCtx); err != nil {
		return run, fmt.Errorf("%s's kube-apiserver does not serve: %w", a.opts.ClusterIdentity, err)
	}
	closers = append(closers, func() error { load.Stop(); return nil })
	// A baseline of the traffic before the move, from when A's
	// kube-apiserver serves.
	if err := pauseUntil(ctx, time.Now().Add(m.opts.Before)); err != nil {
		return run, err
	}

	templates := func(domain string) livemove.URLTemplates {
		return livemove.URLTemplates{
			Peer:    "https://{pod}.{namespace}." + domain + ":2380",
			Client:  "https://{pod}.{namespace}." + domain + ":2379",
			Sidecar: fmt.Sprintf("https://{pod}.{namespace}.%s:%d", domain, webhook.DefaultSidecarPort),
		}
	}
	druidReady := WatchDruidReady(b, m.Key())
	closers = append(closers, func() error { druidReady.Stop(); return nil })
	mlog, err := logTo("mover.log")
	if err != nil {
		return run, err
	}
	ties, tieSum, tiesUnder, err := tieHistogram()
	if err != nil {
		return run, err
	}
	var gep39 *livemove.GEP39
	if m.opts.GEP39 {
		gep39 = &livemove.GEP39{DestinationPrefix: b.opts.ClusterIdentity, SourceClientEndpoints: eps[:MoveReplicas]}
	}
	// The renewal's result, once RenewCertificatesAt's step started; it
	// is read before Run returns.
	var renewed chan *CertificateRenewal
	// The delta snapshot's result, once the join is done.
	var snapshotted chan SnapshotTaken
	// The move's context ends at AbortAfter's end, before the next step.
	moveCtx, stopMove := context.WithCancelCause(ctx)
	defer stopMove(nil)
	mover, err := livemove.New(livemove.Options{
		GEP39:  gep39,
		Source: a.Client, Destination: b.Client,
		Namespace: MoveNamespace, Name: MoveEtcdName,
		// B's pods take the ordinals after A's (etcd-main-3..5): in one shoot
		// namespace of two seeds, druid's in-cluster peer URL of a pod of
		// the same name is the same string, and etcd refuses a second
		// member with a peer URL it knows. The adapter makes B's members
		// advertise their names under B's domain.
		SourceAddresses: templates(sourceDomain).Addresses(), DestinationAddresses: templates(destinationDomain).Addresses(),
		StepTimeout: 5 * time.Minute,
		HoldSource:  m.opts.HoldSource,
		// Once B's first member votes and B's kube-apiserver serves on
		// it, before any of A's members goes, A's clients move to B's
		// kube-apiserver (the shoot's API endpoint switched) and A's
		// kube-apiserver stops, as gardenlet does it.
		SwitchClients: func(ctx context.Context) error {
			if err := bStarted(ctx); err != nil {
				return fmt.Errorf("starting %s's kube-apiserver: %w", b.opts.ClusterIdentity, err)
			}
			if err := load.WaitReady(ctx, b.opts.ClusterIdentity); err != nil {
				return err
			}
			if err := load.Switch(ctx, a.opts.ClusterIdentity, b.opts.ClusterIdentity); err != nil {
				return err
			}
			return shoots[a].Stop(ctx)
		},
		Logger: mlog,
		Progress: func(e livemove.Event) {
			switch e.Kind {
			case livemove.StepStarted:
				if e.Step == m.opts.RenewCertificatesAt && renewed == nil {
					renewed = make(chan *CertificateRenewal, 1)
					go func() { renewed <- m.renewCertificates(ctx, eps[0]) }()
				}
				w.Mark(string(e.Step))
				load.Mark(string(e.Step))
				m.printf("  %6.1f s  %-17s %s", e.At.Sub(load.StartedAt()).Seconds(), e.Step, requestCounts(load.Requests(), servers))
			case livemove.StepDone:
				w.Mark(string(e.Step) + StepDoneSuffix)
				load.Mark(string(e.Step) + StepDoneSuffix)
				if e.Step == move.StepJoinDestination || e.Step == move.Step(move.StageDestinationEtcdPeersJoined) {
					druidReady.Start()
					if m.opts.DeltaSnapshotAfterJoin && snapshotted == nil {
						snapshotted = make(chan SnapshotTaken, 1)
						go func() { snapshotted <- a.TriggerSnapshot(ctx, m.Key(), "delta") }()
					}
				}
				if m.opts.AbortAfter != "" && e.Step == m.opts.AbortAfter {
					stopMove(errAbortPoint)
				}
			}
			if m.opts.OnEvent != nil {
				m.opts.OnEvent(e)
			}
		},
	})
	if err != nil {
		return run, err
	}
	w.MarkPhase("during")
	load.MarkPhase("during")
	m.printf("moving %s/%s from %s to %s (times on the load's clock) ...", MoveNamespace, MoveEtcdName, a.opts.ClusterIdentity, b.opts.ClusterIdentity)
	run.MoveStarted = time.Now()
	err = mover.Move(moveCtx)
	if m.opts.AbortAfter != "" {
		if !errors.Is(context.Cause(moveCtx), errAbortPoint) {
			err = errors.Join(err, fmt.Errorf("the move ended without reaching %s, after which it was to be aborted", m.opts.AbortAfter))
		} else {
			cancelB()
			<-startedB
			err = m.abort(ctx, mover, load, shoots[b], startErrB == nil)
			run.Aborted = true
		}
	}
	run.MoveTook = time.Since(run.MoveStarted)
	if renewed != nil {
		run.Renewal = <-renewed
	}
	if snapshotted != nil {
		d := <-snapshotted
		run.DeltaSnapshot = &d
	}
	run.DruidReady = druidReady.Stop()
	if err != nil {
		return run, fmt.Errorf("the move: %w", err)
	}
	w.MarkPhase("after")
	load.MarkPhase("after")
	afterMove := time.Since(load.StartedAt())
	if n, sum, under, err := tieHistogram(); err == nil {
		run.Ties, run.TieSeconds, run.TiesUnderOneSecond = n-ties, sum-tieSum, under-tiesUnder
	}
	// The cluster's home after the move: B's, or A's again after an abort.
	home, homeEps := b, eps[MoveReplicas:]
	if run.Aborted {
		home, homeEps = a, eps[:MoveReplicas]
	}
	m.printf("moved in %s; waiting for %s's members, pods and druid's Ready ...", run.MoveTook.Round(100*time.Millisecond), home.opts.ClusterIdentity)

	if err := home.WaitVoters(ctx, m.Key(), MoveReplicas, 3*time.Minute); err != nil {
		return run, err
	}
	// A member that joined by snapshot serves its first linearizable read
	// (etcd-wrapper's readiness) some seconds after its promotion; B's
	// StatefulSet rolls out whatever druid changed at the move's end.
	if err := home.waitRolledOut(ctx, m.Key(), MoveReplicas, 3*time.Minute); err != nil {
		return run, err
	}
	// druid reads its member leases by the ordinals 0..2; the member lease
	// bridge fills them from the leases B's members renew.
	if err := home.WaitEtcdReady(ctx, m.Key(), MoveReplicas, 5*time.Minute); err != nil {
		return run, err
	}
	if !run.Aborted {
		if run.FirstMemberRuns, err = b.PodRuns(MoveNamespace, fmt.Sprintf("%s-%d", MoveEtcdName, m.destinationFirst())); err != nil {
			return run, err
		}
	}
	// The destination's clients write for a while after the move: the
	// baseline after it.
	if err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		return time.Since(load.StartedAt()) >= afterMove+m.opts.After && wroteSince(load, home.opts.ClusterIdentity, afterMove), nil
	}); err != nil {
		return run, fmt.Errorf("%s's kube-apiserver acknowledged no write after the move: %w", home.opts.ClusterIdentity, err)
	}

	m.printf("checking the histories (lost writes, linearizability) ...")
	// The final reads retry until they are answered: bounded, a destination
	// that stopped serving fails the run instead of holding it.
	verifyCtx, cancelVerify := context.WithTimeout(ctx, 5*time.Minute)
	defer cancelVerify()
	w.Stop()
	if err := w.SetEndpoints(homeEps...); err != nil {
		return run, err
	}
	if run.Own, run.OwnLost, err = w.Verify(verifyCtx, workload.VerifyOptions{LinearizabilityTimeout: time.Minute}); err != nil {
		return run, fmt.Errorf("checking the own client's history: %w", err)
	}
	load.Stop()
	run.APIRequests = load.Requests()
	if run.API, err = load.Results(verifyCtx, apiload.VerifyOptions{LinearizabilityTimeout: time.Minute}); err != nil {
		return run, fmt.Errorf("checking the kube-apiservers' history: %w", err)
	}
	run.Membership.Stop()
	for _, s := range []*Site{a, b} {
		crashes, err := s.EtcdCrashes()
		if err != nil {
			return run, err
		}
		run.EtcdCrashes = append(run.EtcdCrashes, crashes...)
	}
	return run, nil
}

// errAbortPoint ends the move's context at LiveMoveOptions.AbortAfter.
var errAbortPoint = errors.New("the move reached the step after which it is aborted")

// abort takes the move back as gardenlet would: the clients through the
// destination's kube-apiserver (if it started) go back to the source's,
// which serves on the source's members throughout, the destination's
// kube-apiserver stops, and Mover.Abort takes the destination's members
// out.
func (m *LiveMove) abort(ctx context.Context, mover *livemove.Mover, load *apiload.Load, shootB *ShootAPIServer, bStarted bool) error {
	a, b := m.A.opts.ClusterIdentity, m.B.opts.ClusterIdentity
	m.printf("aborting the move after %s: %s's clients back to %s's kube-apiserver ...", m.opts.AbortAfter, b, a)
	if err := load.Switch(ctx, b, a); err != nil {
		return fmt.Errorf("switching %s's clients back to %s: %w", b, a, err)
	}
	if bStarted {
		if err := shootB.Stop(ctx); err != nil {
			return fmt.Errorf("stopping %s's kube-apiserver: %w", b, err)
		}
	}
	// The abort's step marks the loads' clocks through Progress.
	if err := mover.Abort(ctx); err != nil {
		return fmt.Errorf("the abort: %w", err)
	}
	return nil
}

// waitRolledOut waits until the Etcd's StatefulSet has rolled out its
// current revision with replicas ready pods, and every pod of the Etcd is
// ready.
func (s *Site) waitRolledOut(ctx context.Context, key client.ObjectKey, replicas int32, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := s.EtcdPods(ctx, key)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, p := range pods {
			if !PodReady(&p) {
				last = "pod " + p.Name + " is not ready"
				return false, nil
			}
		}
		sts, err := s.Kube.AppsV1().StatefulSets(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		switch {
		case sts.Status.CurrentRevision != sts.Status.UpdateRevision:
			last = fmt.Sprintf("StatefulSet rolling out %s (current %s)", sts.Status.UpdateRevision, sts.Status.CurrentRevision)
		case sts.Status.ReadyReplicas != replicas:
			last = fmt.Sprintf("StatefulSet has %d ready replicas, want %d", sts.Status.ReadyReplicas, replicas)
		case len(pods) != int(replicas):
			last = fmt.Sprintf("%d pods, want %d", len(pods), replicas)
		default:
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("etcd %s in %s did not roll out in %s: %s", key, s.opts.ClusterIdentity, timeout, last)
	}
	return nil
}

// requestCounts sums the requests so far per server, for the progress
// lines: what a person watching the move wants to see change.
func requestCounts(reqs []apiload.Request, servers []apiload.Server) string {
	type counts struct{ ok, failed int }
	by := map[string]*counts{}
	for _, r := range reqs {
		c := by[r.Server]
		if c == nil {
			c = &counts{}
			by[r.Server] = c
		}
		if r.Failed() {
			c.failed++
		} else {
			c.ok++
		}
	}
	var parts []string
	for _, s := range servers {
		if c := by[s.Name]; c != nil {
			parts = append(parts, fmt.Sprintf("%s: %d answered, %d failed", s.Name, c.ok, c.failed))
		}
	}
	return strings.Join(parts, "; ")
}

// pauseUntil waits until t or until ctx ends.
func pauseUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// wroteSince tells whether server had a write acknowledged that it was
// called at or after since, an offset on the load's clock.
func wroteSince(l *apiload.Load, server string, since time.Duration) bool {
	for _, r := range l.Requests() {
		if r.Server == server && r.Acknowledged() && r.Call >= since {
			return true
		}
	}
	return false
}

// tieHistogram reads the controllers' tie durations from controller-
// runtime's registry (both sites' controllers run in this process and
// share it): how many, their sum in seconds, and how many lasted at most a
// second.
func tieHistogram() (n uint64, sum float64, underOneSecond uint64, err error) {
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		return 0, 0, 0, err
	}
	for _, f := range families {
		if f.GetName() != "druid_stretch_membership_tie_duration_seconds" || len(f.Metric) == 0 {
			continue
		}
		h := f.Metric[0].GetHistogram()
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == 1 {
				underOneSecond = b.GetCumulativeCount()
			}
		}
		return h.GetSampleCount(), h.GetSampleSum(), underOneSecond, nil
	}
	return 0, 0, 0, nil
}

// PodRuns counts the runs of the pod of that name in namespace on the
// site's nodes (one folder each, named by the pod's UID).
func (s *Site) PodRuns(namespace, pod string) (int, error) {
	dirs, err := s.PodFolders(namespace + "_" + pod + "_*")
	return len(dirs), err
}

// ReadySampler records druid's Ready of one Etcd once a second, from Start
// until Stop.
type ReadySampler struct {
	site      *Site
	key       client.ObjectKey
	startOnce sync.Once
	stopOnce  sync.Once
	ctx       context.Context
	cancel    context.CancelFunc
	done      chan struct{}
	samples   []bool
}

// WatchDruidReady prepares a sampler of druid's Ready of the Etcd key in s.
func WatchDruidReady(s *Site, key client.ObjectKey) *ReadySampler {
	ctx, cancel := context.WithCancel(context.Background())
	return &ReadySampler{site: s, key: key, ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

// Start starts sampling; a second call does nothing.
func (r *ReadySampler) Start() {
	r.startOnce.Do(func() {
		go func() {
			defer close(r.done)
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				var e v1alpha1.Etcd
				if err := r.site.Client.Get(r.ctx, r.key, &e); err == nil {
					r.samples = append(r.samples, e.DruidEtcd().IsReady())
				}
				select {
				case <-r.ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	})
}

// Stop ends the sampling and returns the samples (none if it never
// started). Safe to call twice.
func (r *ReadySampler) Stop() []bool {
	r.stopOnce.Do(func() {
		r.cancel()
		r.startOnce.Do(func() { close(r.done) })
		<-r.done
	})
	return r.samples
}

// CertificateRenewal is what a renewal of the shoot's certificates during a
// move showed.
type CertificateRenewal struct {
	// At is when the Secrets were written.
	At time.Time
	// ServedAfter is how long after At the source's first member served
	// the new server certificate to a new connection.
	ServedAfter time.Duration
	// Err is why the renewal failed or was not seen served.
	Err error
}

// renewCertificates renews the shoot's certificates in both sites and
// waits, up to two minutes, until endpoint (a member's client URL) serves
// the new server certificate in a new TLS handshake.
func (m *LiveMove) renewCertificates(ctx context.Context, endpoint string) *CertificateRenewal {
	r := &CertificateRenewal{At: time.Now()}
	if r.Err = m.shoot.Renew(ctx, MoveNamespace, m.A, m.B); r.Err != nil {
		return r
	}
	m.printf("renewed the shoot's server, peer and client certificates in both sites")
	u, err := url.Parse(endpoint)
	if err != nil {
		r.Err = err
		return r
	}
	cfg, err := m.A.EtcdClientTLS()
	if err != nil {
		r.Err = err
		return r
	}
	cfg.ServerName = u.Hostname()
	want := m.shoot.ServerSerial()
	var last string
	r.Err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		conn, err := m.A.DialContext(ctx, "tcp", u.Host)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		c := tls.Client(conn, cfg)
		defer func() { _ = c.Close() }()
		if err := c.HandshakeContext(ctx); err != nil {
			last = err.Error()
			return false, nil
		}
		got := c.ConnectionState().PeerCertificates[0].SerialNumber
		last = fmt.Sprintf("serves the certificate of serial %s, not the renewed %s", got, want)
		return got.Cmp(want) == 0, nil
	})
	if r.Err != nil {
		r.Err = fmt.Errorf("%s did not serve the renewed certificate: %w (last: %s)", endpoint, r.Err, last)
		return r
	}
	r.ServedAfter = time.Since(r.At)
	m.printf("%s serves the renewed server certificate, %.1f s after the renewal", u.Host, r.ServedAfter.Seconds())
	return r
}
