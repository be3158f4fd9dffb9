package livemove

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

// Roles renders the members of the cluster and their roles from the more
// recent of the two observations, each marked with its cluster:
// "etcd-main-0 (A) Leader, etcd-main-3 (B) Learner". "" before any
// observation.
func Roles(src, dst *v1alpha1.Etcd) string {
	type view struct {
		e    *v1alpha1.Etcd
		mine string // the label of the view's own members
		ext  string
	}
	var best *view
	for _, v := range []view{{src, "A", "B"}, {dst, "B", "A"}} {
		if v.e == nil || v.e.Status.Membership == nil || len(v.e.Status.Membership.Members) == 0 {
			continue
		}
		if best == nil || observedAt(v.e).After(observedAt(best.e)) {
			best = &v
		}
	}
	if best == nil {
		return ""
	}
	var parts []string
	for _, m := range best.e.Status.Membership.Members {
		label := "?"
		switch {
		case members.IsOwn(best.e, m):
			label = best.mine
		case m.Origin == v1alpha1.MemberOriginExternal:
			label = best.ext
		}
		name := m.Name
		if name == "" {
			name = "(unstarted " + strings.Join(m.PeerURLs, ",") + ")"
		}
		role := string(m.Role)
		if !m.Healthy {
			role += ", unhealthy"
		}
		parts = append(parts, fmt.Sprintf("%s (%s) %s", name, label, role))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

func observedAt(e *v1alpha1.Etcd) time.Time {
	if t := e.Status.Membership.ObservedTime; t != nil {
		return t.Time
	}
	return time.Time{}
}

// ProgressPrinter writes events as lines to a terminal: each step's start
// and end, and while waiting, the phase, the controllers' report and the
// members whenever one of them changes.
type ProgressPrinter struct {
	mu    sync.Mutex
	out   io.Writer
	start time.Time
	last  string
}

// NewProgressPrinter prints to out, with times relative to now.
func NewProgressPrinter(out io.Writer) *ProgressPrinter {
	return &ProgressPrinter{out: out, start: time.Now()}
}

// Print is an Options.Progress.
func (p *ProgressPrinter) Print(e Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at := e.At.Sub(p.start).Seconds()
	switch e.Kind {
	case StepStarted:
		_, _ = fmt.Fprintf(p.out, "%7.2fs  step %s: starting (%s)\n", at, e.Step, e.Phase)
	case StepDone:
		_, _ = fmt.Fprintf(p.out, "%7.2fs  step %s: done in %.2fs, now %s\n", at, e.Step, e.Duration.Seconds(), e.Phase)
		if r := Roles(e.Source, e.Destination); r != "" {
			_, _ = fmt.Fprintf(p.out, "          members: %s\n", r)
		}
	case WriteWaiting:
		_, _ = fmt.Fprintf(p.out, "%7.2fs  step %s: %s\n", at, e.Step, e.Message)
	case StepWaiting:
		line := string(e.Phase) + " | " + Roles(e.Source, e.Destination)
		if line == p.last {
			return
		}
		p.last = line
		_, _ = fmt.Fprintf(p.out, "%7.2fs  step %s: %s\n", at, e.Step, e.Phase)
		if r := Roles(e.Source, e.Destination); r != "" {
			_, _ = fmt.Fprintf(p.out, "          members: %s\n", r)
		}
	}
}
