package etcdwrapper

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.uber.org/zap/zaptest"

	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
)

// fakeBackupRestore answers like the initialisation handlers of
// etcd-backup-restore v0.44.1's HTTP server: /initialization/start moves
// "New" to "Progress" (and is ignored otherwise); /initialization/status
// serves the status and resets "Successful" and "Failed" to "New" once
// served; /config serves etcd's configuration. The real server finishes an
// initialisation asynchronously; the fake finishes it right after the first
// "Progress" it serves, with the next of outcomes ("Successful" when none
// are left), so each test sees the same sequence. The real etcdbrctl is
// exercised by the test site's end-to-end tests.
type fakeBackupRestore struct {
	mu       sync.Mutex
	status   string
	outcomes []string
	pending  string
	// modes records the ?mode= of every accepted start.
	modes []string
	// config is served on /config after configFailures failed requests.
	config         []byte
	configFailures int
	// statusFailures failed answers precede the real ones.
	statusFailures int
}

func newFakeBackupRestore(config string, outcomes ...string) *fakeBackupRestore {
	return &fakeBackupRestore{status: "New", outcomes: outcomes, config: []byte(config)}
}

func (f *fakeBackupRestore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case "/initialization/start":
		if f.status == "New" {
			f.status = "Progress"
			f.modes = append(f.modes, r.URL.Query().Get("mode"))
			f.pending = "Successful"
			if len(f.outcomes) > 0 {
				f.pending, f.outcomes = f.outcomes[0], f.outcomes[1:]
			}
		}
		w.WriteHeader(http.StatusOK)
	case "/initialization/status":
		if f.statusFailures > 0 {
			f.statusFailures--
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte(f.status))
		switch f.status {
		case "Successful", "Failed":
			f.status = "New"
		case "Progress":
			f.status = f.pending
		}
	case "/config":
		if f.configFailures > 0 {
			f.configFailures--
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = w.Write(f.config)
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeBackupRestore) startModes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.modes...)
}

// testOptions points the wrapper's files at a temporary folder and polls
// fast.
func testOptions(t *testing.T) Options {
	dir := t.TempDir()
	return Options{
		ExitCodeFile:         filepath.Join(dir, "exit_code"),
		ValidationMarkerFile: filepath.Join(dir, "validation_marker"),
		ConfigFile:           filepath.Join(dir, "etcd.conf.yaml"),
		ListenHost:           "127.0.0.1",
		PollInterval:         10 * time.Millisecond,
		ReadinessInterval:    50 * time.Millisecond,
	}
}

// backupRestoreConfigFor addresses srv, over TLS with srv's certificate as
// the CA bundle when srv has one.
func backupRestoreConfigFor(t *testing.T, srv *httptest.Server) BackupRestoreConfig {
	t.Helper()
	g := NewWithT(t)
	c := BackupRestoreConfig{HostPort: strings.TrimPrefix(strings.TrimPrefix(srv.URL, "http://"), "https://")}
	if srv.TLS != nil {
		c.TLSEnabled = true
		c.CACertBundlePath = filepath.Join(t.TempDir(), "bundle.crt")
		g.Expect(os.WriteFile(c.CACertBundlePath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)).To(Succeed())
	}
	g.Expect(c.Validate()).To(Succeed())
	return c
}

// brClientFor is a backup-restore client for srv.
func brClientFor(t *testing.T, srv *httptest.Server) *backupRestoreClient {
	t.Helper()
	br, err := newBackupRestoreClient(backupRestoreConfigFor(t, srv))
	g := NewWithT(t)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(br.close)
	return br
}

const minimalEtcdConfig = `name: etcd-main-0
data-dir: /var/etcd/data/new.etcd
initial-cluster: etcd-main-0=http://etcd-main-0.etcd-main-peer.default.svc:2380
initial-advertise-peer-urls: http://etcd-main-0.etcd-main-peer.default.svc:2380
initial-cluster-state: new
`

func TestParseInitStatus(t *testing.T) {
	g := NewWithT(t)
	// backup-restore v0.44.1 serves New, Progress, Successful and Failed.
	g.Expect(parseInitStatus("New")).To(Equal(statusNew))
	g.Expect(parseInitStatus("Successful")).To(Equal(statusSuccessful))
	g.Expect(parseInitStatus("Progress")).To(Equal(statusInProgress))
	g.Expect(parseInitStatus("Failed")).To(Equal(statusInProgress))
	g.Expect(parseInitStatus("")).To(Equal(statusInProgress))
	g.Expect(parseInitStatus("successful")).To(Equal(statusInProgress))
}

func TestInitialiseHappyPath(t *testing.T) {
	g := NewWithT(t)
	fake := newFakeBackupRestore(minimalEtcdConfig)
	srv := httptest.NewServer(fake)
	defer srv.Close()
	o := testOptions(t)
	g.Expect(os.WriteFile(o.ValidationMarkerFile, []byte("legacy"), 0o600)).To(Succeed())

	cfg, err := initialise(context.Background(), brClientFor(t, srv), o, zaptest.NewLogger(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.Name).To(Equal("etcd-main-0"))
	g.Expect(cfg.Dir).To(Equal("/var/etcd/data/new.etcd"))
	g.Expect(cfg.ClusterState).To(Equal("new"))
	g.Expect(fake.startModes()).To(Equal([]string{"full"}))
	g.Expect(o.ValidationMarkerFile).NotTo(BeAnExistingFile())
	info, err := os.Stat(o.ConfigFile)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.Mode().Perm()).To(Equal(os.FileMode(0o600)))
	g.Expect(os.ReadFile(o.ConfigFile)).To(BeEquivalentTo(minimalEtcdConfig))
}

func TestInitialiseRetriesAfterFailedInitialisation(t *testing.T) {
	g := NewWithT(t)
	fake := newFakeBackupRestore(minimalEtcdConfig, "Failed", "Failed", "Successful")
	fake.statusFailures = 2
	srv := httptest.NewServer(fake)
	defer srv.Close()

	_, err := initialise(context.Background(), brClientFor(t, srv), testOptions(t), zaptest.NewLogger(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fake.startModes()).To(Equal([]string{"full", "full", "full"}))
}

// etcd-wrapper leaves its loop on the first Successful, triggered or not
// (its loop runs while the status is not Successful): druid-stretch's
// sidecar answers so for a member that may start at once.
func TestInitialiseNeedsNoTriggerWhenAlreadySuccessful(t *testing.T) {
	g := NewWithT(t)
	fake := newFakeBackupRestore(minimalEtcdConfig)
	fake.status = "Successful"
	srv := httptest.NewServer(fake)
	defer srv.Close()

	cfg, err := initialise(context.Background(), brClientFor(t, srv), testOptions(t), zaptest.NewLogger(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.Name).To(Equal("etcd-main-0"))
	g.Expect(fake.startModes()).To(BeEmpty(), "no initialisation was triggered")
}

func TestInitialiseAsksForSanityAfterOrderlyExit(t *testing.T) {
	g := NewWithT(t)
	fake := newFakeBackupRestore(minimalEtcdConfig)
	srv := httptest.NewServer(fake)
	defer srv.Close()
	o := testOptions(t)
	g.Expect(captureExitCode(os.Interrupt, o.ExitCodeFile)).To(Succeed())

	_, err := initialise(context.Background(), brClientFor(t, srv), o, zaptest.NewLogger(t))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fake.startModes()).To(Equal([]string{"sanity"}))
}

func TestInitialiseRetriesConfig(t *testing.T) {
	t.Run("succeeds within five attempts", func(t *testing.T) {
		g := NewWithT(t)
		fake := newFakeBackupRestore(minimalEtcdConfig)
		fake.configFailures = configFetchAttempts - 1
		srv := httptest.NewServer(fake)
		defer srv.Close()
		_, err := initialise(context.Background(), brClientFor(t, srv), testOptions(t), zaptest.NewLogger(t))
		g.Expect(err).NotTo(HaveOccurred())
	})
	t.Run("gives up after five attempts", func(t *testing.T) {
		g := NewWithT(t)
		fake := newFakeBackupRestore(minimalEtcdConfig)
		fake.configFailures = configFetchAttempts
		srv := httptest.NewServer(fake)
		defer srv.Close()
		_, err := initialise(context.Background(), brClientFor(t, srv), testOptions(t), zaptest.NewLogger(t))
		g.Expect(err).To(MatchError(ContainSubstring("500")))
	})
	t.Run("rejects configuration etcd cannot parse", func(t *testing.T) {
		g := NewWithT(t)
		srv := httptest.NewServer(newFakeBackupRestore("name: [unclosed"))
		defer srv.Close()
		_, err := initialise(context.Background(), brClientFor(t, srv), testOptions(t), zaptest.NewLogger(t))
		g.Expect(err).To(HaveOccurred())
	})
}

func TestInitialiseStopsWhenCancelled(t *testing.T) {
	g := NewWithT(t)
	// A backup-restore that never finishes: every poll sees "Progress".
	fake := newFakeBackupRestore(minimalEtcdConfig)
	fake.pending = "Progress"
	fake.status = "Progress"
	srv := httptest.NewServer(fake)
	defer srv.Close()
	br, o, log := brClientFor(t, srv), testOptions(t), zaptest.NewLogger(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := initialise(ctx, br, o, log)
		done <- err
	}()
	cancel()
	var err error
	g.Eventually(done).Should(Receive(&err))
	g.Expect(errors.Is(err, context.Canceled)).To(BeTrue())
}

func TestBackupRestoreTLS(t *testing.T) {
	g := NewWithT(t)
	srv := httptest.NewTLSServer(newFakeBackupRestore(minimalEtcdConfig))
	defer srv.Close()

	status, err := brClientFor(t, srv).initializationStatus(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(status).To(Equal(statusNew))

	// A bundle that did not sign the server's certificate is refused.
	other, err := pki.NewCA("other")
	g.Expect(err).NotTo(HaveOccurred())
	c := BackupRestoreConfig{HostPort: strings.TrimPrefix(srv.URL, "https://"), TLSEnabled: true, CACertBundlePath: filepath.Join(t.TempDir(), "other.crt")}
	g.Expect(os.WriteFile(c.CACertBundlePath, other.CertPEM(), 0o600)).To(Succeed())
	br, err := newBackupRestoreClient(c)
	g.Expect(err).NotTo(HaveOccurred())
	defer br.close()
	_, err = br.initializationStatus(context.Background())
	g.Expect(err).To(MatchError(ContainSubstring("certificate")))
}

func TestChooseValidationMode(t *testing.T) {
	tests := []struct {
		name     string
		exitCode *string
		want     validationMode
	}{
		{name: "first start", want: fullValidation},
		{name: "SIGTERM", exitCode: new("terminated"), want: sanityValidation},
		{name: "SIGINT with newline", exitCode: new("interrupt\n"), want: sanityValidation},
		{name: "anything else", exitCode: new("killed"), want: fullValidation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			o := testOptions(t)
			if tt.exitCode != nil {
				g.Expect(os.WriteFile(o.ExitCodeFile, []byte(*tt.exitCode), 0o600)).To(Succeed())
			}
			g.Expect(chooseValidationMode(o.ExitCodeFile, o.ValidationMarkerFile, zaptest.NewLogger(t))).To(Equal(tt.want))
		})
	}
	t.Run("unreadable exit code", func(t *testing.T) {
		g := NewWithT(t)
		o := testOptions(t)
		g.Expect(os.Mkdir(o.ExitCodeFile, 0o700)).To(Succeed())
		g.Expect(chooseValidationMode(o.ExitCodeFile, o.ValidationMarkerFile, zaptest.NewLogger(t))).To(Equal(fullValidation))
	})
}
