package cli

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// maxInputBytes bounds a file a command reads (--file, or stdin for "-"):
// a spec lists a few sidecars and members, a few KiB; anything near this
// is the wrong file (a log, a device, /dev/zero), and reading it whole
// would hold the command's memory before the parser could refuse it.
const maxInputBytes = 4 << 20

// readInput reads the file path names for flag, or stdin when path is
// "-", refusing one larger than maxInputBytes before any of it is parsed.
func readInput(cmd *cobra.Command, flag, path string) ([]byte, error) {
	var (
		r    io.Reader
		name = path
	)
	if path == "-" {
		r, name = cmd.InOrStdin(), "stdin"
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, usageError(fmt.Errorf("--%s: %w", flag, err))
		}
		defer func() { _ = f.Close() }()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxInputBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--%s: reading %s: %w", flag, name, err)
	}
	if len(data) > maxInputBytes {
		return nil, usageError(fmt.Errorf("--%s: %s is larger than %d MiB, the bound of a command's input; nothing was parsed or changed (a spec is a few KiB: is it the right file?)", flag, name, maxInputBytes>>20))
	}
	return data, nil
}
