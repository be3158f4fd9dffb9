package etcdwrapper

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// initStatus is backup-restore's initialisation state as the wrapper reads
// it from GET /initialization/status.
type initStatus int

const (
	// statusUnknown: the status could not be fetched.
	statusUnknown initStatus = iota
	// statusNew: nothing started; the wrapper must trigger initialisation.
	statusNew
	// statusInProgress: any other answer, backup-restore's "Progress" and
	// "Failed" included. After serving "Failed" backup-restore resets itself
	// to "New", so the next poll triggers a fresh attempt.
	statusInProgress
	// statusSuccessful: the data directory is ready. backup-restore resets
	// itself to "New" after serving it, so the wrapper must stop polling.
	statusSuccessful
)

func (s initStatus) String() string {
	switch s {
	case statusNew:
		return "New"
	case statusInProgress:
		return "InProgress"
	case statusSuccessful:
		return "Successful"
	default:
		return "Unknown"
	}
}

// parseInitStatus maps the body of an /initialization/status answer.
func parseInitStatus(body string) initStatus {
	switch body {
	case "New":
		return statusNew
	case "Successful":
		return statusSuccessful
	default:
		return statusInProgress
	}
}

// validationMode is the ?mode= of /initialization/start: how thoroughly
// backup-restore checks the existing data directory.
type validationMode string

const (
	sanityValidation validationMode = "sanity"
	fullValidation   validationMode = "full"
)

// backupRestoreClient speaks the initialisation protocol of
// etcd-backup-restore's HTTP server.
type backupRestoreClient struct {
	http    *http.Client
	baseURL string
}

// brRequestTimeout bounds every request to backup-restore, as in the real
// wrapper.
const brRequestTimeout = time.Minute

func newBackupRestoreClient(c BackupRestoreConfig) (*backupRestoreClient, error) {
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.TLSEnabled {
		pem, err := os.ReadFile(c.CACertBundlePath)
		if err != nil {
			return nil, fmt.Errorf("reading backup-restore CA bundle: %w", err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tlsConf.RootCAs = pool
		tlsConf.ServerName = c.host()
	}
	return &backupRestoreClient{
		http:    &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf}, Timeout: brRequestTimeout},
		baseURL: c.baseURL(),
	}, nil
}

// initializationStatus asks GET /initialization/status.
func (b *backupRestoreClient) initializationStatus(ctx context.Context) (initStatus, error) {
	body, err := b.get(ctx, "/initialization/status")
	if err != nil {
		return statusUnknown, err
	}
	return parseInitStatus(string(body)), nil
}

// triggerInitialization asks GET /initialization/start?mode=...; the real
// wrapper uses GET, and backup-restore's handler accepts any method.
func (b *backupRestoreClient) triggerInitialization(ctx context.Context, mode validationMode) error {
	_, err := b.get(ctx, "/initialization/start?mode="+string(mode))
	return err
}

// etcdConfig fetches GET /config: etcd's YAML configuration with this
// member's name, URLs, initial cluster and cluster state filled in.
func (b *backupRestoreClient) etcdConfig(ctx context.Context) ([]byte, error) {
	return b.get(ctx, "/config")
}

// close drops the kept-alive connections, and with them their goroutines.
func (b *backupRestoreClient) close() { b.http.CloseIdleConnections() }

func (b *backupRestoreClient) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.baseURL+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusCreated, http.StatusAccepted:
		return body, nil
	}
	return nil, fmt.Errorf("backup-restore answered GET %s with %s", path, resp.Status)
}
