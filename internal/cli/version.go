package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/druid-stretch/druid-stretch/internal/version"
)

// NewVersionCommand prints the build: version, commit, Go and etcd client
// versions, as text, JSON or YAML.
func NewVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, Go and etcd client versions of this binary",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := version.Get()
			out := cmd.OutOrStdout()
			switch output {
			case "text":
				_, err := fmt.Fprintln(out, info)
				return err
			case "json", "yaml":
				return printStructured(out, output, info)
			default:
				return usageError(fmt.Errorf("-o %q: want text, json or yaml", output))
			}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text, json or yaml")
	return cmd
}
