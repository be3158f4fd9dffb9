package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/druid-stretch/druid-stretch/controllers/webhook"
	"github.com/druid-stretch/druid-stretch/internal/testing/docscheck"
	"github.com/druid-stretch/druid-stretch/test/chart"
)

// portRowRE is a row of the ports table in docs/install.md:
// | `8080` | what | `--flag` | `druid-stretch command` |.
var portRowRE = regexp.MustCompile("^\\| `(\\d+)` \\|[^|]*\\| `(--[a-z-]+)` \\| `druid-stretch ([a-z -]+)` \\|$")

// TestDocsPorts: each row of the ports table is the default of the flag it
// names; the chart's sidecar.port is the controller's --sidecar-port
// default; and every sidecar URL in the docs uses that port.
func TestDocsPorts(t *testing.T) {
	root, all := docs(t)
	cmds := commands()
	rows := 0
	for _, d := range all {
		for line := range strings.Lines(d.Text) {
			m := portRowRE.FindStringSubmatch(strings.TrimSpace(line))
			if m == nil {
				continue
			}
			rows++
			c, ok := cmds[m[3]]
			if !ok {
				t.Errorf("%s: ports table names `druid-stretch %s`, which is no command", d.Path, m[3])
				continue
			}
			f, ok := flagsOf(c)[strings.TrimPrefix(m[2], "--")]
			if !ok {
				t.Errorf("%s: `druid-stretch %s` has no flag %s", d.Path, m[3], m[2])
				continue
			}
			if def := strings.TrimPrefix(f.DefValue, ":"); def != m[1] {
				t.Errorf("%s: ports table says %s of `druid-stretch %s` is %s, its default is %q", d.Path, m[2], m[3], m[1], f.DefValue)
			}
		}
	}
	if rows < 5 {
		t.Fatalf("found %d rows of the ports table in docs/install.md, want 5", rows)
	}

	sidecarPort := strconv.Itoa(int(webhook.DefaultSidecarPort))
	values, err := os.ReadFile(filepath.Join(root, "charts", "druid-stretch", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := chart.ParseValues(string(values))
	if err != nil {
		t.Fatal(err)
	}
	if got := v["sidecar"].(map[string]any)["port"]; strconv.Itoa(int(got.(float64))) != sidecarPort {
		t.Errorf("the chart's sidecar.port is %v, the controller's --sidecar-port default %s", got, sidecarPort)
	}

	urls := 0
	for _, d := range all {
		for _, b := range docscheck.Blocks(d.Text) {
			for _, m := range sidecarURLRE.FindAllStringSubmatch(b.Text, -1) {
				urls++
				if m[1] != sidecarPort {
					t.Errorf("%s:%d: a sidecar URL on port %s; the injected sidecar serves on %s", d.Path, b.Line, m[1], sidecarPort)
				}
			}
		}
	}
	if urls < 10 {
		t.Fatalf("found %d sidecar URLs in the docs' examples: the pattern no longer finds them", urls)
	}
}

// sidecarURLRE is a sidecar URL in an Etcd or a migrate command line.
var sidecarURLRE = regexp.MustCompile(`(?:sidecarURL: *"?|sidecar-url-template '?)https?://[^:/\s]+:(\d+)`)
