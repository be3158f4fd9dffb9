// Package docscheck reads what the docs claim about the code (metric
// tables, flags, ports, values examples), so that tests can hold the docs
// to the code. It parses Markdown as the docs write it: pipe tables, fenced
// code blocks and code spans.
package docscheck

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Doc is one Markdown file of the repository.
type Doc struct {
	// Path is relative to the repository root, e.g. docs/metrics.md.
	Path string
	// Text is the file's content.
	Text string
}

// Docs reads README.md and every Markdown file under docs/ in root.
func Docs(root string) ([]Doc, error) {
	paths := []string{filepath.Join(root, "README.md")}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			paths = append(paths, p)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	docs := make([]Doc, 0, len(paths))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return nil, err
		}
		docs = append(docs, Doc{Path: rel, Text: string(data)})
	}
	return docs, nil
}

// Metric is a row of a metrics table: | `name` | type | `label`, ... | help |.
type Metric struct {
	Name   string
	Type   string
	Labels []string
}

// Metrics returns the rows of every table in md whose first cell is a
// metric name in backticks starting with prefix; labels sorted.
func Metrics(md, prefix string) ([]Metric, error) {
	var out []Metric
	for line := range strings.Lines(md) {
		cells := tableCells(line)
		if len(cells) < 3 {
			continue
		}
		name, ok := codeSpan(cells[0])
		if !ok || !strings.HasPrefix(name, prefix) {
			continue
		}
		m := Metric{Name: name, Type: strings.TrimSpace(cells[1])}
		for l := range strings.SplitSeq(cells[2], ",") {
			l = strings.TrimSpace(l)
			if l == "" || l == "none" {
				continue
			}
			label, ok := codeSpan(l)
			if !ok {
				return nil, fmt.Errorf("metric %s: label %q is not in backticks", name, l)
			}
			m.Labels = append(m.Labels, label)
		}
		slices.Sort(m.Labels)
		out = append(out, m)
	}
	return out, nil
}

// tableCells splits a Markdown table row; nil for any other line and for
// the delimiter row.
func tableCells(line string) []string {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") || strings.HasPrefix(line, "|---") || strings.HasPrefix(line, "| ---") {
		return nil
	}
	return strings.Split(strings.Trim(line, "|"), "|")
}

// codeSpan returns the text of a cell that is exactly one code span.
func codeSpan(s string) (string, bool) {
	s = strings.TrimSpace(s)
	if len(s) < 2 || s[0] != '`' || s[len(s)-1] != '`' || strings.Count(s, "`") != 2 {
		return "", false
	}
	return s[1 : len(s)-1], true
}

// Block is a fenced code block.
type Block struct {
	// Lang is the info string after the opening fence (sh, yaml, ...).
	Lang string
	// Text is the block's content without the fences.
	Text string
	// Line is the 1-based line of the opening fence.
	Line int
}

// Blocks returns the fenced code blocks of md, indented ones (in lists)
// included, their indentation removed.
func Blocks(md string) []Block {
	var (
		out    []Block
		cur    *Block
		indent string
		n      int
	)
	sc := bufio.NewScanner(strings.NewReader(md))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if cur == nil {
			if strings.HasPrefix(trimmed, "```") {
				indent = line[:len(line)-len(trimmed)]
				cur = &Block{Lang: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), Line: n}
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") {
			out = append(out, *cur)
			cur = nil
			continue
		}
		cur.Text += strings.TrimPrefix(line, indent) + "\n"
	}
	return out
}

// flagRE matches a long flag that starts a word: --name, not shoot--p--s.
var flagRE = regexp.MustCompile("(?:^|[\\s`(\\[\"'])(--[a-z][a-z0-9]*(?:-[a-z0-9]+)*)")

// Flags returns every long flag (--name) md mentions, in code or prose,
// each once, with the line it first appears on.
func Flags(md string) map[string]int {
	out := map[string]int{}
	n := 0
	for line := range strings.Lines(md) {
		n++
		for _, m := range flagRE.FindAllStringSubmatch(line, -1) {
			if _, seen := out[m[1]]; !seen {
				out[m[1]] = n
			}
		}
	}
	return out
}

// Exposed reads a Prometheus text exposition (what /metrics serves) into
// rows like the docs' metric tables: each family with its type and the
// names of the labels its samples carry (le and quantile aside).
func Exposed(exposition io.Reader) ([]Metric, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(exposition)
	if err != nil {
		return nil, err
	}
	out := make([]Metric, 0, len(families))
	for name, f := range families {
		labels := map[string]bool{}
		for _, s := range f.Metric {
			for _, l := range s.Label {
				labels[l.GetName()] = true
			}
		}
		m := Metric{Name: name, Type: strings.ToLower(f.GetType().String())}
		for l := range labels {
			m.Labels = append(m.Labels, l)
		}
		slices.Sort(m.Labels)
		out = append(out, m)
	}
	return out, nil
}

// Scrape serves g through promhttp, the handler controller-runtime's
// metrics server and the sidecar serve /metrics with, reads it over HTTP
// and returns Exposed of the answer.
func Scrape(g prometheus.Gatherer) ([]Metric, error) {
	srv := httptest.NewServer(promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	return Exposed(resp.Body)
}
