package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/etcdconfig"
)

// This file makes the sidecar the server that etcd-druid's etcd-wrapper asks
// before it starts etcd, in the pods of an Etcd druid-stretch manages: the
// webhook points the wrapper's --backup-restore-host-port here instead of at
// etcd-backup-restore. The wrapper's protocol is backup-restore's:
//
//	GET /initialization/start?mode=…  start initialising (200)
//	GET /initialization/status        New | Progress | Successful | Failed, as text
//	GET /config                       the etcd configuration, as YAML
//
// backup-restore would decide on its own whether the member joins an
// existing cluster (adding it as a learner itself, after wiping its data
// directory) or bootstraps one (from druid's configuration, which lists only
// the ordinals 0..replicas-1 and never another Kubernetes cluster's
// members). Here the member starts only once druid-stretch's controller has
// admitted it, and with the initial cluster the controller gave:
//
//	GET /v1/join   what this member is: name, URLs, data present, admission
//	PUT /v1/join   admit it {"state","initialCluster","memberID","member"} (mutating)
//
// A member whose data directory holds etcd data starts at once: etcd then
// ignores the initial cluster and rejoins with what its log says.

// Initialisation states, backup-restore's words (the wrapper compares them).
const (
	InitNew        = "New"
	InitProgress   = "Progress"
	InitSuccessful = "Successful"
	InitFailed     = "Failed"
)

// ReasonHasData refuses to admit a member whose data directory holds etcd
// data: admitting it would change nothing, and a bootstrap over it would
// fork the cluster.
const ReasonHasData = "HasData"

// ReasonAdmittedToExisting refuses to admit a member to bootstrap a new
// cluster once it was admitted to join an existing one: the existing
// cluster counts it as a member, and a bootstrap would start a second
// cluster beside it.
const ReasonAdmittedToExisting = "AdmittedToExisting"

// ReasonWrongMember refuses an admission addressed to another member (its
// Member field names another than this sidecar's): the controller reached
// this pod under a name or a connection meant for another one, and an
// admission for that other member would make this one join under the
// other's learner ID.
const ReasonWrongMember = "WrongMember"

// ReasonNotAdmitted answers /config for a member the controller has not
// admitted and that has no data.
const ReasonNotAdmitted = "NotAdmitted"

// ReasonJoinStateUnreadable: the sidecar could not read what decides its
// member's start (druid's configuration, etcd's data directory, the
// admission file).
const ReasonJoinStateUnreadable = "JoinStateUnreadable"

// Joining makes the sidecar etcd-wrapper's initialisation and configuration
// server for its member (see Config.Joining).
type Joining struct {
	// EtcdConfigFile is druid's etcd.conf.yaml as mounted in the pod.
	EtcdConfigFile string
	// Member is this pod's member. Name is required; the URLs are used
	// only when druid's file has no entry for the member (a pod outside
	// ordinals 0..replicas-1).
	Member etcdconfig.Member
	// AdditionalPeerURLs are the member's spec.etcd.additionalAdvertisePeerURLs;
	// they are advertised after druid's (see etcdconfig.File.Resolve).
	AdditionalPeerURLs []string
	// AdmissionFile keeps the controller's admission across restarts of
	// the sidecar; it belongs on the data volume (default: admission.json
	// beside etcd's data directory), so it lives and dies with the data.
	AdmissionFile string
	// ListenClientURLs, when set, is where etcd serves its clients
	// (listen-client-urls, comma-separated): the client gate's backend,
	// with the gate on the advertised client port.
	ListenClientURLs string
	// MaxLearners, when above 0, is etcd's max-learners: how many learners
	// the cluster accepts at once (etcd's default is 1). druid's file has
	// no such key, so the configuration served to etcd-wrapper sets it.
	MaxLearners int
}

// Admission is the controller's word that a member may start, and with
// which initial cluster.
type Admission struct {
	// State is etcd's initial-cluster-state: "existing" for a learner the
	// controller added, "new" for a cluster the controller bootstraps.
	State string `json:"state"`
	// InitialCluster is etcd's initial-cluster (name=peerURL,…): every
	// member of the cluster, this one included.
	InitialCluster string `json:"initialCluster"`
	// MemberID is the hex ID of the learner the controller added, for the
	// record; empty for a bootstrap.
	MemberID string `json:"memberID,omitempty"`
	// Member is the name of the member the admission is for. A sidecar
	// of another member refuses it (ReasonWrongMember) and keeps what it
	// held. Empty (older controllers) is not checked.
	Member string `json:"member,omitempty"`
}

// JoinStatus is what GET /v1/join answers.
type JoinStatus struct {
	// Member, PeerURLs and ClientURLs are this member's, as etcd will
	// advertise them.
	Member     string   `json:"member"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	// HasData is true when etcd's data directory holds a write-ahead log:
	// the member starts without an admission.
	HasData bool `json:"hasData"`
	// Admission is the controller's, if any.
	Admission *Admission `json:"admission,omitempty"`
	// Initialization is the state the wrapper was last told.
	Initialization string `json:"initialization"`
	// ConfiguredForSeconds is how long ago etcd-wrapper took this member's
	// configuration to join with (an admission, no data), on the sidecar's
	// clock: its etcd runs with it since, and has asked the cluster for its
	// membership once one round trip to a voter has passed; once it has
	// data (its log, written after that check) it still runs with it. 0
	// when the wrapper has taken none since it last began to initialise
	// or since this sidecar started.
	ConfiguredForSeconds float64 `json:"configuredForSeconds,omitempty"`
}

// Waiting reports whether the member waits for the controller: no data and
// no admission.
func (s *JoinStatus) Waiting() bool { return !s.HasData && s.Admission == nil }

// joiner holds the wrapper-facing state.
type joiner struct {
	cfg  Joining
	file *etcdconfig.File
	self etcdconfig.Member

	mu    sync.Mutex
	state string // the wrapper's initialisation state
	// configured is when the wrapper last took a configuration to join
	// with; zero once it initialises again (its etcd stopped).
	configured time.Time
	// peerURLsChecked: advertisePeerURLs ran (once per process).
	peerURLsChecked bool
}

func newJoiner(cfg Joining) (*joiner, error) {
	if cfg.Member.Name == "" {
		return nil, errors.New("sidecar: Joining.Member.Name is required")
	}
	f, err := etcdconfig.Load(cfg.EtcdConfigFile)
	if err != nil {
		return nil, err
	}
	self, err := f.Resolve(cfg.Member, cfg.AdditionalPeerURLs...)
	if err != nil {
		return nil, err
	}
	if f.DataDir() == "" {
		return nil, fmt.Errorf("%s names no data-dir", cfg.EtcdConfigFile)
	}
	if cfg.AdmissionFile == "" {
		cfg.AdmissionFile = filepath.Join(filepath.Dir(filepath.Clean(f.DataDir())), "druid-stretch-admission.json")
	}
	return &joiner{cfg: cfg, file: f, self: self, state: InitNew}, nil
}

func (s *Server) joinRoutes(mux *http.ServeMux) {
	j := s.joiner
	mux.HandleFunc("GET /initialization/start", func(w http.ResponseWriter, r *http.Request) {
		j.mu.Lock()
		j.configured = time.Time{}
		if j.state == InitNew {
			j.state = InitProgress
			s.log.Info("etcd-wrapper asks to initialise", "member", j.self.Name, "mode", r.URL.Query().Get("mode"))
		}
		j.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /initialization/status", func(w http.ResponseWriter, _ *http.Request) {
		state := j.initializationStatus(s)
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, state)
	})
	mux.HandleFunc("GET /config", func(w http.ResponseWriter, r *http.Request) {
		s.advertisePeerURLs(r.Context())
		b, joining, err := j.config()
		if err != nil {
			var apiErr *Error
			if !errors.As(err, &apiErr) {
				apiErr = &Error{StatusCode: http.StatusInternalServerError, Reason: ReasonJoinStateUnreadable, Message: err.Error()}
			}
			s.log.Info("refused etcd-wrapper's /config", "member", j.self.Name, "reason", apiErr.Reason, "message", apiErr.Message)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(apiErr.StatusCode)
			_ = json.NewEncoder(w).Encode(errorBody{Reason: apiErr.Reason, Message: apiErr.Message})
			return
		}
		if joining {
			j.mu.Lock()
			j.configured = time.Now()
			j.mu.Unlock()
		}
		s.log.Info("served etcd's configuration", "member", j.self.Name, "joining", joining)
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(b)
	})
	s.handle(mux, "GET /v1/join", "", false, func(*http.Request) (int, any, *Error) {
		st, err := j.status()
		if err != nil {
			return 0, nil, &Error{StatusCode: http.StatusInternalServerError, Reason: ReasonJoinStateUnreadable, Message: err.Error()}
		}
		j.mu.Lock()
		st.Initialization = j.state
		if !j.configured.IsZero() {
			st.ConfiguredForSeconds = time.Since(j.configured).Seconds()
		}
		j.mu.Unlock()
		return http.StatusOK, st, nil
	})
	s.handle(mux, "PUT /v1/join", "admit", true, func(r *http.Request) (int, any, *Error) {
		setTarget(r, j.self.Name)
		var a Admission
		if apiErr := decodeJSON(r, &a); apiErr != nil {
			return 0, nil, apiErr
		}
		st, apiErr := j.admit(a)
		if apiErr != nil {
			return 0, nil, apiErr
		}
		s.log.Info("member admitted", "member", j.self.Name, "state", a.State, "initialCluster", a.InitialCluster, "memberID", a.MemberID)
		return http.StatusOK, st, nil
	})
}

// initializationStatus answers the wrapper's poll the way backup-restore
// does: Successful and Failed are told once, then the state is New again,
// so a wrapper that restarts initialises anew. A member that may start
// (admitted, or with data) is Successful at once, even before the wrapper
// triggered an initialisation: the sidecar validates and restores nothing,
// so the trigger would change nothing, and the wrapper, which pauses a
// second after every poll, starts etcd a poll earlier (etcd-wrapper
// leaves its loop on Successful whether or not it triggered).
func (j *joiner) initializationStatus(s *Server) string {
	j.mu.Lock()
	defer j.mu.Unlock()
	// The wrapper polls only while it initialises: the etcd that took the
	// last configuration no longer runs.
	j.configured = time.Time{}
	if j.state == InitProgress || j.state == InitNew {
		st, err := j.status()
		switch {
		case err != nil && j.state == InitProgress:
			s.log.Error(err, "initialising the member failed", "member", j.self.Name)
			j.state = InitFailed
		case err == nil && !st.Waiting():
			j.state = InitSuccessful
		}
	}
	state := j.state
	if state == InitSuccessful || state == InitFailed {
		j.state = InitNew
	}
	return state
}

func (j *joiner) status() (*JoinStatus, error) {
	hasData, err := walExists(j.file.DataDir())
	if err != nil {
		return nil, err
	}
	a, err := j.admission()
	if err != nil {
		return nil, err
	}
	return &JoinStatus{Member: j.self.Name, PeerURLs: j.self.PeerURLs, ClientURLs: j.self.ClientURLs, HasData: hasData, Admission: a}, nil
}

// config is etcd's configuration for this member: with the admission's
// initial cluster and state (joining), or, for a member that has data, with
// itself as the initial cluster (etcd reads its membership from its log
// then and ignores both).
func (j *joiner) config() (b []byte, joining bool, err error) {
	st, err := j.status()
	if err != nil {
		return nil, false, err
	}
	switch {
	case st.Admission != nil && !st.HasData:
		joining = true
		b, err = j.file.ForMember(j.self, st.Admission.InitialCluster, st.Admission.State)
	case st.HasData:
		b, err = j.file.ForMember(j.self, etcdconfig.FormatInitialCluster([]etcdconfig.Member{j.self}), etcdconfig.StateExisting)
	default:
		return nil, false, &Error{StatusCode: http.StatusServiceUnavailable, Reason: ReasonNotAdmitted,
			Message: fmt.Sprintf("member %s has no data and druid-stretch has not admitted it yet", j.self.Name)}
	}
	if err == nil && j.cfg.ListenClientURLs != "" {
		b, err = etcdconfig.With(b, etcdconfig.KeyListenClientURLs, j.cfg.ListenClientURLs)
	}
	if err == nil && j.cfg.MaxLearners > 0 {
		b, err = etcdconfig.With(b, etcdconfig.KeyMaxLearners, j.cfg.MaxLearners)
	}
	return b, joining, err
}

func (j *joiner) admit(a Admission) (*JoinStatus, *Error) {
	if a.State != etcdconfig.StateNew && a.State != etcdconfig.StateExisting {
		return nil, &Error{StatusCode: http.StatusBadRequest, Reason: ReasonInvalidArgument,
			Message: fmt.Sprintf("state %q: want %q or %q", a.State, etcdconfig.StateNew, etcdconfig.StateExisting)}
	}
	if a.Member != "" && a.Member != j.self.Name {
		return nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonWrongMember,
			Message: fmt.Sprintf("the admission is for member %s, and this is the sidecar of member %s: nothing is admitted (the caller reached this pod under a name or a connection meant for %s)", a.Member, j.self.Name, a.Member)}
	}
	// The same check etcd would make at start, made now so that the
	// controller hears of a bad initial cluster and the member never
	// starts with one.
	if _, err := j.file.ForMember(j.self, a.InitialCluster, a.State); err != nil {
		return nil, &Error{StatusCode: http.StatusBadRequest, Reason: ReasonInvalidArgument, Message: err.Error()}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	hasData, err := walExists(j.file.DataDir())
	if err != nil {
		return nil, &Error{StatusCode: http.StatusInternalServerError, Reason: ReasonJoinStateUnreadable, Message: err.Error()}
	}
	if hasData {
		return nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonHasData,
			Message: fmt.Sprintf("member %s already has etcd data in %s; it starts from its own log and needs no admission", j.self.Name, j.file.DataDir())}
	}
	// Sticky: a repeated admission (a second controller, a retried call, a
	// pod recreated on the same volume) may renew a join of the existing
	// cluster, never turn it into a bootstrap. An admission that cannot be
	// read is no proof of either, so nothing is admitted over it.
	held, err := j.admission()
	if err != nil {
		return nil, &Error{StatusCode: http.StatusInternalServerError, Reason: ReasonJoinStateUnreadable,
			Message: fmt.Sprintf("%v; refusing to admit member %s over an admission that cannot be read (remove %s only if the member never started)", err, j.self.Name, j.cfg.AdmissionFile)}
	}
	if held != nil && held.State == etcdconfig.StateExisting && a.State != etcdconfig.StateExisting {
		return nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonAdmittedToExisting,
			Message: fmt.Sprintf("member %s was admitted to join the existing cluster %q as learner %s; admitting it with state %q would bootstrap a second cluster beside that one: only a renewed admission with state %q is accepted",
				j.self.Name, held.InitialCluster, held.MemberID, a.State, etcdconfig.StateExisting)}
	}
	b, err := json.Marshal(a)
	if err != nil {
		return nil, &Error{StatusCode: http.StatusInternalServerError, Reason: ReasonInvalidArgument, Message: err.Error()}
	}
	if err := etcdconfig.WriteFile(j.cfg.AdmissionFile, b); err != nil {
		return nil, &Error{StatusCode: http.StatusInternalServerError, Reason: ReasonJoinStateUnreadable,
			Message: fmt.Sprintf("keeping the admission in %s: %v", j.cfg.AdmissionFile, err)}
	}
	return &JoinStatus{Member: j.self.Name, PeerURLs: j.self.PeerURLs, ClientURLs: j.self.ClientURLs, Admission: &a, Initialization: j.state}, nil
}

func (j *joiner) admission() (*Admission, error) {
	b, err := os.ReadFile(j.cfg.AdmissionFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the admission: %w", err)
	}
	var a Admission
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("the admission in %s: %w", j.cfg.AdmissionFile, err)
	}
	return &a, nil
}

// walExists reports whether etcd's data directory holds a write-ahead log
// file, etcd's own test for an existing member (wal.Exist).
func walExists(dataDir string) (bool, error) {
	entries, err := os.ReadDir(filepath.Join(dataDir, "member", "wal"))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading etcd's data directory: %w", err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".wal") {
			return true, nil
		}
	}
	return false, nil
}

// peerURLUpdateTimeout bounds advertisePeerURLs, which runs once per
// sidecar process: etcd-wrapper waits for /config that long at most, and
// the member stays down meanwhile. A cluster that answers does so within
// a round trip between the sites; one that does not (its client Service
// has no serving gate, late in a move) leaves the update to backup-restore.
const peerURLUpdateTimeout = 2 * time.Second

// advertisePeerURLs makes etcd know a member that has data by every peer
// URL it advertises now (druid's configuration with the Etcd's additional
// peer URLs, as resolved for this member), before etcd-wrapper starts it.
// etcd takes a member's peer URLs from its member list, never from its
// configuration, so URLs added to a running Etcd (GEP-39's first stage
// gives the source its additional peer URLs, and druid rolls its pods)
// reach the other members only by a member update. backup-restore makes
// that update once etcd runs and then restarts etcd through etcd-wrapper,
// under a client gate that still carries calls; made here, before etcd
// starts, it finds nothing left to change and etcd starts once. The rule
// is backup-restore's: update only when an advertised URL is missing, and
// then to exactly the advertised ones. It is a change of addresses, not of
// voters, so it needs no admission; when the cluster does not answer, etcd
// starts all the same and backup-restore's own update remains.
func (s *Server) advertisePeerURLs(ctx context.Context) {
	j := s.joiner
	j.mu.Lock()
	checked := j.peerURLsChecked
	j.peerURLsChecked = true
	j.mu.Unlock()
	if checked {
		return
	}
	if hasData, err := walExists(j.file.DataDir()); err != nil || !hasData {
		return
	}
	s.mu.Lock()
	peers := s.peers
	s.mu.Unlock()
	if peers == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, peerURLUpdateTimeout)
	defer cancel()
	// Serializable: any member that answers knows the peer URLs.
	list, err := peers.MemberList(ctx, clientv3.WithSerializable())
	if err != nil {
		s.log.Info("could not check the peer URLs etcd knows this member by; backup-restore checks them once etcd runs", "member", j.self.Name, "error", err.Error())
		return
	}
	for _, m := range list.Members {
		if m.Name != j.self.Name {
			continue
		}
		if !slices.ContainsFunc(j.self.PeerURLs, func(u string) bool { return !slices.Contains(m.PeerURLs, u) }) {
			return
		}
		if _, err := peers.MemberUpdate(ctx, m.ID, j.self.PeerURLs); err != nil {
			s.log.Info("could not update the peer URLs etcd knows this member by; backup-restore updates them once etcd runs", "member", j.self.Name, "known", m.PeerURLs, "advertised", j.self.PeerURLs, "error", err.Error())
			return
		}
		s.log.Info("etcd knows this member by the peer URLs it advertises now", "member", j.self.Name, "was", m.PeerURLs, "now", j.self.PeerURLs)
		return
	}
}
