package e2e

import (
	"strings"
	"testing"

	"github.com/druid-stretch/druid-stretch/test/framework/logtail"
)

// excerptLines is how many of the shared log's lines a failed test prints:
// enough for the pod runner's and the controllers' last decisions, few
// enough for the end of a CI log, where only a failed test's last lines
// are printed again.
const excerptLines = 40

// logExcerpt prints the last lines of the shared log (the controllers',
// pod runners' and clients' log, kept only on a failed run, on the machine
// that ran it) that name the namespace of the failed test, so that a CI
// log alone says what the pods and controllers did last.
func logExcerpt(t *testing.T, namespace string) {
	t.Helper()
	last, err := logtail.Last(logPath, excerptLines, func(line string) bool { return strings.Contains(line, namespace) })
	if err != nil {
		t.Logf("reading the log %s: %v", logPath, err)
	}
	t.Logf("the last %d lines of %s that name %s:\n%s", len(last), logPath, namespace, strings.Join(last, "\n"))
}
