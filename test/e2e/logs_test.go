package e2e

import (
	"bufio"
	"os"
	"strings"
	"testing"
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
	f, err := os.Open(logPath)
	if err != nil {
		t.Logf("no log excerpt: %v", err)
		return
	}
	defer func() { _ = f.Close() }()
	var last []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, namespace) {
			continue
		}
		if len(line) > 400 {
			line = line[:400] + "…"
		}
		last = append(last, line)
		if len(last) > excerptLines {
			last = last[1:]
		}
	}
	if err := sc.Err(); err != nil {
		t.Logf("reading the log %s: %v", logPath, err)
	}
	t.Logf("the last %d lines of %s that name %s:\n%s", len(last), logPath, namespace, strings.Join(last, "\n"))
}
