package sidecar_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	"github.com/druid-stretch/druid-stretch/internal/etcdconfig"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// joinFile is druid's etcd.conf.yaml for etcd-main in namespace ns, two
// replicas, no prefix (abridged); its data dir is set per test.
const joinFile = `name: etcd-config
initial-cluster-state: new
initial-cluster: etcd-main-0=http://etcd-main-0.etcd-main-peer.ns.svc:2380,etcd-main-1=http://etcd-main-1.etcd-main-peer.ns.svc:2380
initial-advertise-peer-urls:
  etcd-main-0: [http://etcd-main-0.etcd-main-peer.ns.svc:2380]
  etcd-main-1: [http://etcd-main-1.etcd-main-peer.ns.svc:2380]
advertise-client-urls:
  etcd-main-0: [http://etcd-main-0.etcd-main-peer.ns.svc:2379]
  etcd-main-1: [http://etcd-main-1.etcd-main-peer.ns.svc:2379]
`

// joiningSidecar serves the sidecar of pod etcd-main-3 (outside druid's
// ordinals: its URLs come from the flags) as etcd-wrapper's server, with a
// data volume under a temporary folder. No etcd runs: joining reads files.
func joiningSidecar(t *testing.T) (url, dataVolume string) {
	t.Helper()
	return joiningSidecarListening(t, "")
}

// joiningSidecarListening is joiningSidecar with etcd's clients served on
// listen (a client gate's backend), when not empty.
func joiningSidecarListening(t *testing.T, listen string) (url, dataVolume string) {
	t.Helper()
	return joiningSidecarWith(t, func(j *sidecar.Joining) { j.ListenClientURLs = listen })
}

// joiningSidecarWith is joiningSidecar with its Joining changed by set.
func joiningSidecarWith(t *testing.T, set func(*sidecar.Joining)) (url, dataVolume string) {
	t.Helper()
	dir := t.TempDir()
	dataVolume = filepath.Join(dir, "data")
	if err := os.MkdirAll(dataVolume, 0o700); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "etcd.conf.yaml")
	if err := os.WriteFile(config, []byte(joinFile+"data-dir: "+filepath.Join(dataVolume, "new.etcd")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	joining := &sidecar.Joining{EtcdConfigFile: config, Member: etcdconfig.Member{
		Name:       "etcd-main-3",
		PeerURLs:   []string{"http://etcd-main-3.etcd-main-peer.ns.svc:2380"},
		ClientURLs: []string{"http://etcd-main-3.etcd-main-peer.ns.svc:2379"},
	}}
	set(joining)
	srv, err := sidecar.New(sidecar.Config{
		Endpoints:                    []string{"http://127.0.0.1:1"},
		InsecureAllowUnauthenticated: true,
		PollInterval:                 -1,
		Joining:                      joining,
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { hs.Close(); _ = srv.Close() })
	return hs.URL, dataVolume
}

// get answers a GET as etcd-wrapper reads it: status code and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// initStatus is the wrapper's poll of /initialization/status.
func initStatus(t *testing.T, url string) string {
	t.Helper()
	code, body := get(t, url+"/initialization/status")
	if code != http.StatusOK {
		t.Fatalf("/initialization/status answered %d %s", code, body)
	}
	return body
}

func TestMemberStartsOnlyOnceAdmitted(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	url, _ := joiningSidecar(t)
	cl := sidecar.NewClient(url, nil)

	st, err := cl.Join(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.Waiting()).To(BeTrue())
	g.Expect(st.Member).To(Equal("etcd-main-3"))
	g.Expect(st.PeerURLs).To(Equal([]string{"http://etcd-main-3.etcd-main-peer.ns.svc:2380"}))

	// The wrapper's loop, as etcd-wrapper runs it against backup-restore.
	g.Expect(initStatus(t, url)).To(Equal(sidecar.InitNew))
	code, _ := get(t, url+"/initialization/start?mode=full")
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(initStatus(t, url)).To(Equal(sidecar.InitProgress))
	g.Expect(initStatus(t, url)).To(Equal(sidecar.InitProgress), "still waiting for the controller")
	code, body := get(t, url+"/config")
	g.Expect(code).To(Equal(http.StatusServiceUnavailable))
	g.Expect(body).To(ContainSubstring(sidecar.ReasonNotAdmitted))

	cluster := "etcd-main-0=http://etcd-main-0.etcd-main-peer.a.svc:2380,etcd-main-3=http://etcd-main-3.etcd-main-peer.ns.svc:2380"
	st, err = cl.Admit(ctx, sidecar.Admission{State: "existing", InitialCluster: cluster, MemberID: "8e9e05c52164694d"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.Admission.MemberID).To(Equal("8e9e05c52164694d"))

	g.Expect(initStatus(t, url)).To(Equal(sidecar.InitSuccessful))
	// A wrapper that restarts needs no trigger: the admitted member may
	// start at its first poll, a second sooner (the wrapper pauses a
	// second after every poll).
	g.Expect(initStatus(t, url)).To(Equal(sidecar.InitSuccessful), "admitted: no trigger needed")
	code, body = get(t, url+"/config")
	g.Expect(code).To(Equal(http.StatusOK))
	cfg := map[string]any{}
	g.Expect(yaml.Unmarshal([]byte(body), &cfg)).To(Succeed())
	g.Expect(cfg).To(HaveKeyWithValue("name", "etcd-main-3"))
	g.Expect(cfg).To(HaveKeyWithValue("initial-cluster", cluster))
	g.Expect(cfg).To(HaveKeyWithValue("initial-cluster-state", "existing"))
	g.Expect(cfg).To(HaveKeyWithValue("initial-advertise-peer-urls", "http://etcd-main-3.etcd-main-peer.ns.svc:2380"))
	g.Expect(cfg).To(HaveKeyWithValue("advertise-client-urls", "http://etcd-main-3.etcd-main-peer.ns.svc:2379"))
}

// With a client gate, etcd serves its clients on the gate's backend and
// still advertises its client URL, which the gate serves.
func TestGatedMemberListensBehindTheGate(t *testing.T) {
	g := NewWithT(t)
	url, _ := joiningSidecarListening(t, "http://127.0.0.1:12379")
	cfg := admittedConfig(t, g, url)
	g.Expect(cfg).To(HaveKeyWithValue("listen-client-urls", "http://127.0.0.1:12379"))
	g.Expect(cfg).To(HaveKeyWithValue("advertise-client-urls", "http://etcd-main-3.etcd-main-peer.ns.svc:2379"))
}

// admittedConfig admits the joining sidecar at url's member into a
// cluster with etcd-main-0 and returns the configuration it then serves to
// etcd-wrapper.
func admittedConfig(t *testing.T, g Gomega, url string) map[string]any {
	t.Helper()
	cluster := "etcd-main-0=http://etcd-main-0.etcd-main-peer.a.svc:2380,etcd-main-3=http://etcd-main-3.etcd-main-peer.ns.svc:2380"
	_, err := sidecar.NewClient(url, nil).Admit(context.Background(), sidecar.Admission{State: "existing", InitialCluster: cluster})
	g.Expect(err).NotTo(HaveOccurred())
	code, body := get(t, url+"/config")
	g.Expect(code).To(Equal(http.StatusOK))
	cfg := map[string]any{}
	g.Expect(yaml.Unmarshal([]byte(body), &cfg)).To(Succeed())
	return cfg
}

// TestServedConfigSetsMaxLearners: druid's etcd.conf.yaml has no
// max-learners; a sidecar told one (--etcd-max-learners) puts it into the
// configuration etcd-wrapper starts etcd with, and keeps the rest.
func TestServedConfigSetsMaxLearners(t *testing.T) {
	g := NewWithT(t)
	config := func(set func(*sidecar.Joining)) map[string]any {
		url, _ := joiningSidecarWith(t, set)
		return admittedConfig(t, g, url)
	}
	plain := config(func(*sidecar.Joining) {})
	g.Expect(plain).NotTo(HaveKey("max-learners"), "etcd's default unless told")
	three := config(func(j *sidecar.Joining) { j.MaxLearners = 3 })
	g.Expect(three).To(HaveKeyWithValue("max-learners", BeNumerically("==", 3)))
	// Each sidecar has a data volume of its own.
	for _, cfg := range []map[string]any{plain, three} {
		g.Expect(cfg).To(HaveKey("data-dir"))
		delete(cfg, "data-dir")
	}
	delete(three, "max-learners")
	g.Expect(three).To(Equal(plain), "every other key as druid's file and the admission say")
}

func TestAdmissionRefusals(t *testing.T) {
	ctx := context.Background()
	own := "etcd-main-3=http://etcd-main-3.etcd-main-peer.ns.svc:2380"
	for _, tc := range []struct {
		name   string
		a      sidecar.Admission
		reason string
		want   string
	}{
		{"a state etcd does not know", sidecar.Admission{State: "join", InitialCluster: own}, sidecar.ReasonInvalidArgument, `state "join"`},
		{"an initial cluster without the member", sidecar.Admission{State: "existing", InitialCluster: "etcd-main-0=http://etcd-main-0:2380"}, sidecar.ReasonInvalidArgument, "lacks etcd-main-3=http://etcd-main-3.etcd-main-peer.ns.svc:2380"},
		{"an empty initial cluster", sidecar.Admission{State: "new"}, sidecar.ReasonInvalidArgument, "is not name=peerURL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			url, _ := joiningSidecar(t)
			cl := sidecar.NewClient(url, nil)
			_, err := cl.Admit(ctx, tc.a)
			g.Expect(sidecar.IsReason(err, tc.reason)).To(BeTrue(), "%v", err)
			g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
			st, err := cl.Join(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(st.Waiting()).To(BeTrue(), "nothing was admitted")
		})
	}

	t.Run("malformed JSON", func(t *testing.T) {
		g := NewWithT(t)
		url, _ := joiningSidecar(t)
		req, _ := http.NewRequest(http.MethodPut, url+"/v1/join", strings.NewReader(`{"state":`))
		resp, err := http.DefaultClient.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		_ = resp.Body.Close()
		g.Expect(resp.StatusCode).To(Equal(http.StatusBadRequest))
		st, err := sidecar.NewClient(url, nil).Join(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(st.Waiting()).To(BeTrue())
	})

	t.Run("a member that has data", func(t *testing.T) {
		// It starts from its own log at once; an admission would change
		// nothing, and a bootstrap over it would fork the cluster.
		g := NewWithT(t)
		url, data := joiningSidecar(t)
		wal := filepath.Join(data, "new.etcd", "member", "wal")
		g.Expect(os.MkdirAll(wal, 0o700)).To(Succeed())
		g.Expect(os.WriteFile(filepath.Join(wal, "0000000000000000-0000000000000000.wal"), []byte("x"), 0o600)).To(Succeed())
		cl := sidecar.NewClient(url, nil)
		_, err := cl.Admit(ctx, sidecar.Admission{State: "new", InitialCluster: own})
		g.Expect(sidecar.IsReason(err, sidecar.ReasonHasData)).To(BeTrue(), "%v", err)
		st, err := cl.Join(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(st.HasData).To(BeTrue())
		g.Expect(st.Admission).To(BeNil())
		g.Expect(filepath.Join(data, "druid-stretch-admission.json")).NotTo(BeAnExistingFile())

		g.Expect(initStatus(t, url)).To(Equal(sidecar.InitSuccessful), "the first poll, before any trigger")
		code, body := get(t, url+"/config")
		g.Expect(code).To(Equal(http.StatusOK))
		g.Expect(body).To(ContainSubstring("initial-cluster-state: existing"))
	})
}

// A member admitted to join the existing cluster is never admitted to
// bootstrap one afterwards: not by a repeated call, not by a second
// controller, not after its pod is recreated on the same volume. Renewing
// its join (the membership changed before it started) stays possible.
func TestAdmissionToExistingIsSticky(t *testing.T) {
	ctx := context.Background()
	const (
		own      = "etcd-main-3=http://etcd-main-3.etcd-main-peer.ns.svc:2380"
		existing = "etcd-main-0=http://etcd-main-0.etcd-main-peer.ns.svc:2380," + own
	)
	admissionFile := filepath.Join(t.TempDir(), "druid-stretch-admission.json")
	onVolume := func(j *sidecar.Joining) { j.AdmissionFile = admissionFile }
	g := NewWithT(t)
	url, _ := joiningSidecarWith(t, onVolume)
	cl := sidecar.NewClient(url, nil)
	joined := sidecar.Admission{State: "existing", InitialCluster: existing, MemberID: "8e9e05c52164694d"}
	_, err := cl.Admit(ctx, joined)
	g.Expect(err).NotTo(HaveOccurred())

	for _, tc := range []struct {
		name string
		url  func() string
		a    sidecar.Admission
	}{
		{"the same call with state new", func() string { return url }, sidecar.Admission{State: "new", InitialCluster: existing}},
		{"a bootstrap of the member alone", func() string { return url }, sidecar.Admission{State: "new", InitialCluster: own}},
		{"a bootstrap after the pod was recreated", func() string { u, _ := joiningSidecarWith(t, onVolume); return u }, sidecar.Admission{State: "new", InitialCluster: own}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			cl := sidecar.NewClient(tc.url(), nil)
			_, err := cl.Admit(ctx, tc.a)
			g.Expect(sidecar.IsReason(err, sidecar.ReasonAdmittedToExisting)).To(BeTrue(), "%v", err)
			st, err := cl.Join(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(st.Admission).To(Equal(&joined), "the admission is unchanged")
		})
	}

	t.Run("a renewed join is admitted", func(t *testing.T) {
		g := NewWithT(t)
		renewed := sidecar.Admission{State: "existing", InitialCluster: existing + ",etcd-main-4=http://etcd-main-4.etcd-main-peer.ns.svc:2380", MemberID: joined.MemberID}
		_, err := cl.Admit(ctx, renewed)
		g.Expect(err).NotTo(HaveOccurred())
		st, err := cl.Join(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(st.Admission).To(Equal(&renewed))
		code, body := get(t, url+"/config")
		g.Expect(code).To(Equal(http.StatusOK))
		g.Expect(body).To(ContainSubstring("initial-cluster-state: existing"))
	})

	t.Run("an unreadable admission is not overwritten", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(os.WriteFile(admissionFile, []byte(`{"state":`), 0o600)).To(Succeed())
		_, err := cl.Admit(ctx, sidecar.Admission{State: "new", InitialCluster: own})
		g.Expect(sidecar.IsReason(err, sidecar.ReasonJoinStateUnreadable)).To(BeTrue(), "%v", err)
		g.Expect(os.ReadFile(admissionFile)).To(Equal([]byte(`{"state":`)))
	})
}

// The controller adds the next learner once this one's etcd has asked the
// cluster for its membership (rule 2); GET /v1/join tells how long ago the
// wrapper took the configuration it started etcd with, also once etcd has
// written its log, and forgets it once the wrapper initialises again (its
// etcd stopped).
func TestJoinTellsWhenEtcdTookItsConfiguration(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	url, data := joiningSidecar(t)
	cl := sidecar.NewClient(url, nil)
	configuredFor := func() float64 {
		t.Helper()
		st, err := cl.Join(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		return st.ConfiguredForSeconds
	}

	g.Expect(initStatus(t, url)).To(Equal(sidecar.InitNew))
	code, _ := get(t, url+"/config")
	g.Expect(code).To(Equal(http.StatusServiceUnavailable))
	g.Expect(configuredFor()).To(BeZero(), "a refused /config starts no etcd")

	cluster := "etcd-main-0=http://etcd-main-0.etcd-main-peer.a.svc:2380,etcd-main-3=http://etcd-main-3.etcd-main-peer.ns.svc:2380"
	_, err := cl.Admit(ctx, sidecar.Admission{State: "existing", InitialCluster: cluster, MemberID: "8e9e05c52164694d"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(initStatus(t, url)).To(Equal(sidecar.InitSuccessful))
	g.Expect(configuredFor()).To(BeZero(), "admitted, but the wrapper has not taken its configuration")

	code, _ = get(t, url+"/config")
	g.Expect(code).To(Equal(http.StatusOK))
	first := configuredFor()
	g.Expect(first).To(BeNumerically(">", 0))
	g.Expect(configuredFor()).To(BeNumerically(">", first), "counted from the fetch")

	g.Expect(initStatus(t, url)).To(Equal(sidecar.InitSuccessful))
	g.Expect(configuredFor()).To(BeZero(), "the wrapper initialises again: the etcd it started is gone")

	code, _ = get(t, url+"/config")
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(configuredFor()).To(BeNumerically(">", 0))
	wal := filepath.Join(data, "new.etcd", "member", "wal")
	g.Expect(os.MkdirAll(wal, 0o700)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(wal, "0000000000000000-0000000000000000.wal"), []byte("x"), 0o600)).To(Succeed())
	g.Expect(configuredFor()).To(BeNumerically(">", 0), "its etcd wrote its log: it runs with the configuration it joined with")
	g.Expect(initStatus(t, url)).To(Equal(sidecar.InitSuccessful))
	code, _ = get(t, url+"/config")
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(configuredFor()).To(BeZero(), "a configuration to restart from its log is no join")
}
