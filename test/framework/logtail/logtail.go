// Package logtail picks the last matching lines of a log file, for a failed
// test to print: a CI log keeps a test's output but not the files it wrote.
package logtail

import (
	"bufio"
	"os"
)

// maxLine is the length a line is cut to: a JSON log line can carry a
// whole object, and a few hundred characters say what happened.
const maxLine = 400

// Last returns the last n lines of the file at path that match keep, each
// cut to maxLine characters.
func Last(path string, n int, keep func(line string) bool) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var last []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !keep(line) {
			continue
		}
		if len(line) > maxLine {
			line = line[:maxLine] + "…"
		}
		last = append(last, line)
		if len(last) > n {
			last = last[1:]
		}
	}
	return last, sc.Err()
}
