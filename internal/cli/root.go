// Package cli wires the druid-stretch subcommands. Each subcommand lives in a
// file of its own and only parses flags; the work is done by the packages it
// calls.
package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/druid-stretch/druid-stretch/internal/version"
)

// Exit codes of every command (docs/usage.md). A command that stops
// on an error exits ExitFailure; one that was called wrongly, ExitUsage; a
// migration whose step did not finish in time, ExitNotFinished.
const (
	ExitOK          = 0
	ExitFailure     = 1
	ExitUsage       = 2
	ExitNotFinished = 3
)

// usage marks an error as the caller's: a bad flag value or combination.
type usage struct{ error }

func (u usage) Unwrap() error { return u.error }

func usageError(err error) error { return usage{err} }

// Main runs the druid-stretch command line and returns the process exit
// code.
func Main(args []string) int {
	return Run(newRootCommand(), args)
}

// Run executes root with args until it returns or SIGINT or SIGTERM cancels
// its context, and returns the process exit code. druid-stretch-dev's main
// runs its own root through it.
func Run(root *cobra.Command, args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, root.Name()+":", err)
		return exitCode(err)
	}
	return ExitOK
}

// exitCode maps err to the process exit code.
func exitCode(err error) int {
	var (
		u usage
		n notFinished
	)
	switch {
	case errors.As(err, &u):
		return ExitUsage
	case errors.As(err, &n):
		return ExitNotFinished
	}
	return ExitFailure
}

// NewRoot is a root command named name: --version, and flag errors that
// exit ExitUsage. The shipped binary and druid-stretch-dev build theirs on it.
func NewRoot(name, short string) *cobra.Command {
	root := &cobra.Command{
		Use:           name,
		Short:         short,
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	// Unknown flags and bad flag values are the caller's mistake.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	return root
}

// NewRootCommand is the shipped binary's root command, for tools and tests
// that read its command tree (the docs tests check every flag they cite).
func NewRootCommand() *cobra.Command { return newRootCommand() }

// newRootCommand is the shipped binary's root: the controller, the sidecar
// and the migration, nothing for development.
func newRootCommand() *cobra.Command {
	root := NewRoot("druid-stretch", "Cross-cluster etcd membership for etcd-druid")
	root.AddCommand(
		// subcommands are added here, one constructor per file
		newSidecarCommand(),
		newBackupRestoreConfigCommand(),
		newMigrateCommand(),
		newControllerCommand(),
		newRebalanceCommand(),
		NewVersionCommand(),
	)
	return root
}
