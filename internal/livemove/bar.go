package livemove

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
)

// ProgressBar draws a move as a bar over its steps, for a terminal: the
// line of the step under way is redrawn in place while it waits, and kept
// when the step ends.
type ProgressBar struct {
	mu    sync.Mutex
	out   io.Writer
	steps []move.Step
	start time.Time
	open  bool // a line is drawn without its newline
}

// NewProgressBar draws on out the progress over steps (Remaining of the
// phase the move starts from), times relative to now.
func NewProgressBar(out io.Writer, steps []move.Step) *ProgressBar {
	return &ProgressBar{out: out, steps: steps, start: time.Now()}
}

// barWidth is the bar's length in characters.
const barWidth = 24

// Print is an Options.Progress.
func (b *ProgressBar) Print(e Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := max(len(b.steps), 1)
	done := slices.Index(b.steps, e.Step)
	if done < 0 {
		done = 0
	}
	word := "waiting"
	switch e.Kind {
	case StepStarted:
		word = "starting"
	case StepDone:
		done++
		word = fmt.Sprintf("done in %.1fs", e.Duration.Seconds())
	case WriteWaiting:
		word = "waiting for the API server to admit a write"
	}
	filled := done * barWidth / n
	line := fmt.Sprintf("[%s%s] %d/%d %s: %s, %s, %s", strings.Repeat("#", filled), strings.Repeat("-", barWidth-filled),
		done, len(b.steps), e.Step, word, e.Phase, e.At.Sub(b.start).Round(time.Second))
	// \r and the erase-line sequence redraw the line in place.
	_, _ = fmt.Fprintf(b.out, "\r\033[K%s", line)
	b.open = true
	if e.Kind == StepDone {
		_, _ = fmt.Fprintln(b.out)
		b.open = false
	}
}

// Close ends a line still being redrawn.
func (b *ProgressBar) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open {
		_, _ = fmt.Fprintln(b.out)
		b.open = false
	}
}
