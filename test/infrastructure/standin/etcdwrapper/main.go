package etcdwrapper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Main runs `etcd-wrapper start-etcd [flags]` (args without the program
// name) and returns the process exit code: 0 after an orderly end, 1 when
// the command is missing or etcd could not be started, 2 on bad flags.
// A second SIGTERM/SIGINT exits 1 at once.
func Main(args []string) int {
	if len(args) < 1 || args[0] != Command {
		printHelp(os.Stderr)
		return 1
	}
	log, err := newLogger()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error creating zap logger:", err)
		return 1
	}
	defer func() { _ = log.Sync() }()

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer func() {
		// Stop first: no signal is delivered to sigs after Stop returns.
		signal.Stop(sigs)
		close(sigs)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go onSignals(sigs, defaultExitCodeFile, cancel, func() { os.Exit(1) }, log)

	c, fs, err := ParseFlags(args[1:])
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		log.Error("error parsing command flags", zap.Error(err))
		return 2
	}
	logFlags(fs, log)

	home, err := os.UserHomeDir()
	if err != nil {
		log.Error("error during start or run of etcd", zap.Error(err))
		return 1
	}
	// Files etcd creates are for its own user only.
	syscall.Umask(0o077)
	if err := Run(ctx, c, DefaultOptions(home), log); err != nil {
		log.Error("error during start or run of etcd", zap.Error(err))
		return 1
	}
	return 0
}

// onSignals records the first shutdown signal in exitCodeFile (so that the
// next start asks only for a sanity validation) and cancels the run; a
// second signal forces exit. It returns when sigs closes.
func onSignals(sigs <-chan os.Signal, exitCodeFile string, cancel context.CancelFunc, exit func(), log *zap.Logger) {
	sig, ok := <-sigs
	if !ok {
		return
	}
	if err := captureExitCode(sig, exitCodeFile); err != nil {
		log.Error("failed to capture exit code", zap.Error(err))
	}
	log.Info("caught shutdown signal", zap.String("signal", sig.String()))
	cancel()
	if _, ok := <-sigs; ok {
		exit()
	}
}

// newLogger is the real wrapper's logger: zap's production JSON with ISO
// 8601 times and string durations, at info level.
func newLogger() (*zap.Logger, error) {
	cfg := zap.NewProductionConfig()
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	cfg.EncoderConfig.EncodeDuration = zapcore.StringDurationEncoder
	cfg.Level = zap.NewAtomicLevelAt(zapcore.InfoLevel)
	return cfg.Build()
}

func logFlags(fs *pflag.FlagSet, log *zap.Logger) {
	var b strings.Builder
	fs.VisitAll(func(f *pflag.Flag) {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %s", f.Name, f.Value)
	})
	log.Info("Running with flags: " + b.String())
}

func printHelp(w io.Writer) {
	var c Config
	fs := pflag.NewFlagSet(Command, pflag.ContinueOnError)
	c.AddFlags(fs)
	_, _ = fmt.Fprintf(w, "\nNAME:\n%s - Starts an embedded etcd after etcd-backup-restore initialised its data directory\n\nUSAGE:\n\tetcd-wrapper %s [flags]\n\nFLAGS:\n%s", Command, Command, fs.FlagUsages())
}
