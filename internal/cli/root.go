// Package cli wires the druid-stretch subcommands. Each subcommand lives in a
// file of its own and only parses flags; the work is done by the packages it
// calls.
package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Main runs the command line and returns the process exit code. extra are
// subcommands beside the shipped ones (the demo and the benchmark, which
// the binary's main adds from internal/democli: they pull in the real test
// sites, which the shipped parts must not depend on).
func Main(args []string, extra ...*cobra.Command) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCommand()
	root.AddCommand(extra...)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "druid-stretch:", err)
		return 1
	}
	return 0
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "druid-stretch",
		Short:         "Cross-cluster etcd membership for etcd-druid",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		// subcommands are added here, one constructor per file
		newSidecarCommand(),
		newBackupRestoreConfigCommand(),
		newMigrateCommand(),
		newControllerCommand(),
		newRebalanceCommand(),
		newImageCommand(),
	)
	return root
}
