package livemove

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
)

func TestRemainingSteps(t *testing.T) {
	tests := []struct {
		phase move.MovePhase
		sw    ClientSwitch
		want  []move.Step
	}{
		{move.PhaseNotStarted, NoClientSwitch, []move.Step{"prepare-source", "join-destination", "retire-source", "finish"}},
		{move.PhaseNotStarted, SwitchBeforeRetire, []move.Step{"prepare-source", "join-destination", "switch-clients", "retire-source", "finish"}},
		{move.PhaseNotStarted, SwitchWhenHeld, []move.Step{"prepare-source", "join-destination", "retire-source", "switch-clients", "finish"}},
		{move.PhaseJoiningDestination, NoClientSwitch, []move.Step{"join-destination", "retire-source", "finish"}},
		{move.PhaseDestinationJoined, SwitchBeforeRetire, []move.Step{"switch-clients", "retire-source", "finish"}},
		{move.PhaseDestinationJoined, SwitchWhenHeld, []move.Step{"retire-source", "switch-clients", "finish"}},
		{move.PhaseDestinationJoined, NoClientSwitch, []move.Step{"retire-source", "finish"}},
		{move.PhaseRetiringSource, SwitchWhenHeld, []move.Step{"retire-source", "switch-clients", "finish"}},
		{move.PhaseSourceHeld, SwitchBeforeRetire, []move.Step{"switch-clients", "finish"}},
		{move.PhaseSourceHeld, SwitchWhenHeld, []move.Step{"switch-clients", "finish"}},
		{move.PhaseFinishing, NoClientSwitch, []move.Step{"finish"}},
		{move.PhaseCompleted, NoClientSwitch, []move.Step{}},
		{move.PhaseAborting, NoClientSwitch, nil},
		{move.PhaseInconsistent, NoClientSwitch, nil},
	}
	for _, tc := range tests {
		g := NewWithT(t)
		g.Expect(Remaining(tc.phase, tc.sw)).To(Equal(tc.want), "%s, client switch %d", tc.phase, tc.sw)
		for _, s := range tc.want {
			g.Expect(Describe(s)).NotTo(BeEmpty(), "%s", s)
		}
	}
	g := NewWithT(t)
	// Every phase a move passes through has its step first, as the move
	// itself picks it.
	for _, p := range []move.MovePhase{move.PhaseNotStarted, move.PhaseSourcePrepared, move.PhaseRetiringSource, move.PhaseSourceRetired} {
		g.Expect(Remaining(p, NoClientSwitch)[0]).To(Equal(p.Step()), "%s", p)
	}
	g.Expect(RemainingAbort(move.PhaseAborting)).To(Equal([]move.Step{move.StepAbort}))
	g.Expect(RemainingAbort(move.PhaseAborted)).To(BeEmpty())
}

func TestProgressBar(t *testing.T) {
	g := NewWithT(t)
	var out strings.Builder
	steps := Remaining(move.PhaseNotStarted, NoClientSwitch)
	b := NewProgressBar(&out, steps)
	at := b.start
	b.Print(Event{Kind: StepStarted, Step: move.StepPrepareSource, Phase: move.PhaseNotStarted, At: at})
	b.Print(Event{Kind: StepWaiting, Step: move.StepPrepareSource, Phase: move.PhasePreparingSource, At: at.Add(2 * time.Second)})
	b.Print(Event{Kind: StepDone, Step: move.StepPrepareSource, Phase: move.PhaseSourcePrepared, At: at.Add(3 * time.Second), Duration: 3 * time.Second})
	b.Print(Event{Kind: StepWaiting, Step: move.StepJoinDestination, Phase: move.PhaseJoiningDestination, At: at.Add(4 * time.Second)})
	b.Close()
	g.Expect(out.String()).To(Equal(
		"\r\033[K[------------------------] 0/4 prepare-source: starting, NotStarted, 0s" +
			"\r\033[K[------------------------] 0/4 prepare-source: waiting, PreparingSource, 2s" +
			"\r\033[K[######------------------] 1/4 prepare-source: done in 3.0s, SourcePrepared, 3s\n" +
			"\r\033[K[######------------------] 1/4 join-destination: waiting, JoiningDestination, 4s\n"))
}
