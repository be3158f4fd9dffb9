package devcli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/druid-stretch/druid-stretch/test/framework/image"
)

// newImageCommand writes the druid-stretch container image as a tarball, so
// that an image can be built where no Docker engine runs.
func newImageCommand() *cobra.Command {
	var o image.Options
	cmd := &cobra.Command{
		Use:   "image --output FILE.tar",
		Short: "Write the druid-stretch container image (FROM scratch) as a docker-loadable tarball",
		Long: `Write a FROM-scratch image holding a static Linux druid-stretch binary at
/druid-stretch (the entrypoint), user 65532:65532, as a tarball for
docker load -i, kind load image-archive or crane push. The platform is the
binary's. Timestamps are SOURCE_DATE_EPOCH, or the Unix epoch when unset, so
the same binary and version give the same digest. make image builds the
binary (CGO_ENABLED=0) and runs this.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Created, err = image.SourceDateEpoch(os.Getenv("SOURCE_DATE_EPOCH")); err != nil {
				return err
			}
			if o.Binary == "" {
				if o.Binary, err = os.Executable(); err != nil {
					return fmt.Errorf("finding this executable (pass --binary): %w", err)
				}
			}
			if o.Tag == "" {
				o.Tag = image.Title + ":" + o.Version
			}
			res, err := image.Write(o)
			if err != nil {
				return err
			}
			_, _ = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s %s, digest %s, image ID %s, %d bytes\n",
				o.Output, res.Tag, res.Platform, res.Digest, res.ImageID, res.Size)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.Output, "output", "o", "", "path of the image tarball to write (its directory must exist)")
	f.StringVar(&o.Binary, "binary", "", "static Linux druid-stretch binary to ship (default: this executable)")
	f.StringVar(&o.Version, "version", "dev", "org.opencontainers.image.version label")
	f.StringVar(&o.Revision, "revision", "", "org.opencontainers.image.revision label: the commit the binary was built from")
	f.StringVar(&o.Tag, "tag", "", "reference the tarball loads as (default druid-stretch:VERSION)")
	_ = cmd.MarkFlagRequired("output")
	return cmd
}
