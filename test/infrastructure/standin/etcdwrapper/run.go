package etcdwrapper

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Options are the paths and intervals that the real wrapper hard-codes.
// Main uses the real values; tests point them at temporary folders and
// shorten the intervals.
type Options struct {
	// ExitCodeFile records the signal that ended the last run.
	ExitCodeFile string
	// ValidationMarkerFile is etcd-custom-image's legacy marker, removed
	// on initialisation.
	ValidationMarkerFile string
	// ConfigFile receives the configuration fetched from backup-restore.
	ConfigFile string
	// ListenHost is the wrapper server's host; empty means every interface.
	ListenHost string
	// PollInterval is the pause between initialisation polls and between
	// configuration fetch attempts.
	PollInterval time.Duration
	// ReadinessInterval is the pause between readiness checks.
	ReadinessInterval time.Duration
}

// defaultExitCodeFile is on the data volume, so it outlives the container.
const defaultExitCodeFile = "/var/etcd/data/exit_code"

// DefaultOptions are the real wrapper's paths and intervals; home is the
// user's home folder, where the etcd configuration is written.
func DefaultOptions(home string) Options {
	return Options{
		ExitCodeFile:         defaultExitCodeFile,
		ValidationMarkerFile: "/var/etcd/data/validation_marker",
		ConfigFile:           filepath.Join(home, "etcd.conf.yaml"),
		PollInterval:         time.Second,
		ReadinessInterval:    2 * time.Second,
	}
}

// wrapperReadHeaderTimeout is the wrapper server's header timeout.
const wrapperReadHeaderTimeout = 5 * time.Second

// Run initialises etcd through backup-restore, starts it embedded, serves
// /readyz and /stop, and blocks until ctx ends, POST /stop arrives, or etcd
// stops or fails; each of those returns nil after closing etcd. It returns
// an error when etcd cannot be initialised or started, or when the wrapper
// server fails. Every goroutine Run starts has ended when it returns.
func Run(ctx context.Context, c Config, o Options, log *zap.Logger) error {
	log.Info("Initializing application", zap.Any("config", c))
	if err := c.BackupRestore.Validate(); err != nil {
		return err
	}
	br, err := newBackupRestoreClient(c.BackupRestore)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	etcdCfg, err := initialise(ctx, br, o, log)
	br.close()
	if err != nil {
		return err
	}
	if err := chmodFiles(etcdCfg.Dir, 0o600); err != nil {
		return fmt.Errorf("failed to change file permissions: %w", err)
	}

	client, err := newEtcdClient(ctx, c, etcdCfg, log)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	// Deferred first, so it runs last: the goroutines end before the
	// client and etcd close.
	defer func() {
		if err := client.Close(); err != nil {
			log.Error("failed to close etcd client", zap.Error(err))
		}
	}()
	defer wg.Wait()
	defer cancel()

	r := &readiness{}
	wg.Go(func() { r.poll(ctx, client, o.ReadinessInterval, log) })

	stop, serveFailed, err := serve(&wg, c, o, etcdCfg, r, cancel, log)
	if err != nil {
		return err
	}
	defer stop()

	e, err := embed.StartEtcd(etcdCfg)
	if err != nil {
		return err
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		log.Info("etcd server is now ready to serve client requests")
	case <-e.Server.StopNotify():
		log.Error("etcd server has been aborted, received notification on StopNotify channel")
	case <-time.After(c.EtcdReadyTimeout):
		log.Error("timeout waiting for ReadyNotify signal, not waiting any longer")
	}
	// etcd started: the next start's validation mode must not rely on an
	// older run's orderly exit.
	if err := removeIfExists(o.ExitCodeFile); err != nil {
		log.Warn("failed to clean-up last captured exit code", zap.Error(err))
	}

	select {
	case <-ctx.Done():
		log.Error("application context has been cancelled", zap.Error(ctx.Err()))
	case <-e.Server.StopNotify():
		log.Error("etcd server has been aborted, received notification on StopNotify channel")
	case err := <-e.Err():
		log.Error("error received on etcd Err channel", zap.Error(err))
	case err := <-serveFailed:
		// The real wrapper exits 1 through a fatal log here.
		return err
	}
	return nil
}

// serve starts the wrapper's HTTP server, HTTPS with etcd's server
// certificate when etcd's client URL uses TLS. stop closes it; the serving
// goroutine is counted in wg and reports a failure other than closing on
// failed.
func serve(wg *sync.WaitGroup, c Config, o Options, etcdCfg *embed.Config, r *readiness, cancel context.CancelFunc, log *zap.Logger) (stop func(), failed <-chan error, err error) {
	mux := http.NewServeMux()
	mux.Handle("/readyz", r)
	mux.HandleFunc("/stop", func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			return
		}
		log.Info("received stop request, stopping etcd-wrapper...")
		cancel()
		w.WriteHeader(http.StatusOK)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: wrapperReadHeaderTimeout}
	useTLS := clientTLSEnabled(etcdCfg)
	if useTLS {
		cert, err := tls.LoadX509KeyPair(etcdCfg.ClientTLSInfo.CertFile, etcdCfg.ClientTLSInfo.KeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("loading etcd's server certificate for the wrapper server: %w", err)
		}
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(o.ListenHost, strconv.Itoa(c.WrapperPort)))
	if err != nil {
		return nil, nil, fmt.Errorf("failed to start http server: %w", err)
	}
	log.Info("Starting HTTP server", zap.String("addr", ln.Addr().String()), zap.Bool("tls", useTLS))
	errc := make(chan error, 1)
	wg.Go(func() {
		var err error
		if useTLS {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("wrapper server: %w", err)
			return
		}
		log.Info("HTTP server closed gracefully.")
	})
	return func() {
		if err := srv.Close(); err != nil {
			log.Error("unable to stop HTTP server", zap.Error(err))
		}
	}, errc, nil
}
