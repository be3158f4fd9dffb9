package etcdwrapper

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// configFetchAttempts is how often the wrapper asks for /config before it
// gives up, pausing Options.PollInterval after each failure.
const configFetchAttempts = 5

// initialise drives backup-restore's initialisation to success, then fetches
// etcd's configuration, writes it to o.ConfigFile and loads it.
func initialise(ctx context.Context, br *backupRestoreClient, o Options, log *zap.Logger) (*embed.Config, error) {
	for {
		status, err := br.initializationStatus(ctx)
		if err != nil {
			log.Error("error while fetching initialization status", zap.Error(err))
		}
		log.Info("Fetched initialization status", zap.String("Status", status.String()))
		if status == statusNew {
			mode := chooseValidationMode(o.ExitCodeFile, o.ValidationMarkerFile, log)
			log.Info("Initialization status is New, triggering etcd initialization", zap.String("mode", string(mode)))
			if err := br.triggerInitialization(ctx, mode); err != nil {
				log.Error("error while triggering initialization to backup-restore", zap.Error(err))
			}
		}
		// Like the real wrapper, pause after every poll, the successful
		// one included.
		if err := pause(ctx, o.PollInterval); err != nil {
			return nil, err
		}
		if status == statusSuccessful {
			break
		}
	}
	log.Info("Etcd initialization succeeded")

	var lastErr error
	for attempt := 1; attempt <= configFetchAttempts; attempt++ {
		data, err := br.etcdConfig(ctx)
		if err == nil {
			if err := os.WriteFile(o.ConfigFile, data, 0o600); err != nil {
				return nil, fmt.Errorf("writing etcd configuration: %w", err)
			}
			log.Info("Fetched and written etcd configuration", zap.String("path", o.ConfigFile))
			return embed.ConfigFromFile(o.ConfigFile)
		}
		lastErr = err
		log.Info("fetching etcd configuration failed", zap.Int("attempt", attempt), zap.Error(err))
		if err := pause(ctx, o.PollInterval); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("fetching etcd configuration from backup-restore: %w", lastErr)
}

func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// chooseValidationMode asks for a cheap sanity check only when the previous
// run ended on SIGTERM or SIGINT (recorded by captureExitCode), i.e. etcd
// was shut down in order; anything else may have left the data directory
// damaged and gets a full validation. It also removes the legacy marker file
// of the older etcd-custom-image, as the real wrapper does.
func chooseValidationMode(exitCodeFile, legacyMarkerFile string, log *zap.Logger) validationMode {
	if err := removeIfExists(legacyMarkerFile); err != nil {
		log.Error("error in removing validation_marker file", zap.String("path", legacyMarkerFile), zap.Error(err))
	}
	data, err := os.ReadFile(exitCodeFile)
	if err == nil {
		switch strings.TrimSpace(string(data)) {
		case "terminated", "interrupt":
			log.Info("last captured exit code read, choosing sanity validation", zap.String("signal-captured", strings.TrimSpace(string(data))))
			return sanityValidation
		}
	}
	log.Info("no orderly shutdown recorded, choosing full validation", zap.String("exitCodeFile", exitCodeFile), zap.Error(err))
	return fullValidation
}

// captureExitCode records the signal that ends the wrapper ("terminated",
// "interrupt") for the next start's chooseValidationMode.
func captureExitCode(sig os.Signal, exitCodeFile string) error {
	return os.WriteFile(exitCodeFile, []byte(sig.String()), 0o600)
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// chmodFiles sets mode on every file below dir (not on directories). The
// real wrapper does this once to tighten files written before it set its
// umask; a missing dir is fine.
func chmodFiles(dir string, mode fs.FileMode) error {
	info, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return os.Chmod(path, mode)
	})
}
