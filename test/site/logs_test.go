package site

import (
	"strings"
	"testing"

	"github.com/druid-stretch/druid-stretch/test/framework/logtail"
)

// excerptLines is how many lines of a site's log a failed test prints:
// enough for druid-stretch's last steps and errors, few enough for the end
// of a CI log, where only a failed test's last lines are printed again.
const excerptLines = 30

// logExcerpt prints the last steps and errors of druid-stretch's
// controller and webhooks in a site's log, so that a CI log, which loses
// the site's folder, still says what the controller did last.
func logExcerpt(t *testing.T, what, path string) {
	t.Helper()
	last, err := logtail.Last(path, excerptLines, func(line string) bool {
		return strings.Contains(line, `"logger":"site.druid-stretch`) &&
			(strings.Contains(line, "step") || strings.Contains(line, `"level":"error"`))
	})
	if err != nil {
		t.Logf("reading the log of %s: %v", what, err)
	}
	t.Logf("druid-stretch's last %d steps and errors in the log of %s:\n%s", len(last), what, strings.Join(last, "\n"))
}
