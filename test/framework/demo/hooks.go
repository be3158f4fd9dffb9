package demo

import (
	"time"

	"github.com/druid-stretch/druid-stretch/internal/planner"
	"github.com/druid-stretch/druid-stretch/internal/sidecarcluster"
)

// config is the membership configuration of a cluster's controller: its
// executor reports every step to the log, before the sidecar call and with
// the call's timing after it.
func (l *stepLog) config(c *Cluster) sidecarcluster.Config {
	return sidecarcluster.Config{OnStep: func(step planner.Step, res *sidecarcluster.Result) {
		ev := StepEvent{Cluster: c.Name, Kind: step.Kind, Member: step.Member, ID: step.ID, Start: time.Now()}
		if res != nil {
			ev.Start, ev.End = res.Start, res.Start.Add(res.Duration)
			ev.Outcome, ev.Changed = res.Outcome, res.Changed
		}
		l.add(ev)
	}}
}
