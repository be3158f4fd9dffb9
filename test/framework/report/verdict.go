package report

import (
	"fmt"
	"strings"
)

// TargetSeconds is the target of the tie and of the longest write gap of a
// live move: under a second. A target, not a guarantee: a busy machine
// stretches both, so a report names a miss without calling the move
// broken.
const TargetSeconds = 1.0

// Broken lists the guarantees the run did not keep, one phrase each: a
// request failed at a kube-apiserver, an acknowledged write was lost, a
// history is not linearizable, an etcd member panicked or exited fatally.
// Empty: every guarantee held.
func (r Report) Broken() []string {
	var out []string
	for _, s := range r.KubeAPIServers {
		if s.Failed > 0 {
			out = append(out, fmt.Sprintf("%d failed requests at %s's kube-apiserver", s.Failed, s.Name))
		}
	}
	if h := r.APIHistory; h != nil {
		if h.LostAcknowledgedWrites > 0 {
			out = append(out, fmt.Sprintf("%d acknowledged writes of the kube-apiservers lost", h.LostAcknowledgedWrites))
		}
		if !h.Linearizable {
			out = append(out, fmt.Sprintf("the kube-apiservers' history is not linearizable (%s)", h.LinearizabilityResult))
		}
	}
	if r.LostAcknowledgedWrites > 0 {
		out = append(out, fmt.Sprintf("%d acknowledged writes of the own etcd client lost", r.LostAcknowledgedWrites))
	}
	if r.FinalReadMismatches > 0 {
		out = append(out, fmt.Sprintf("%d keys whose final value is not their last acknowledged write", r.FinalReadMismatches))
	}
	if r.LinearizabilityResult != "" && !r.Linearizable {
		out = append(out, fmt.Sprintf("the own etcd client's history is not linearizable (%s)", r.LinearizabilityResult))
	}
	if n := len(r.EtcdCrashes); n > 0 {
		out = append(out, fmt.Sprintf("%d etcd panics or fatal exits", n))
	}
	return out
}

// Missed lists the targets the run missed: the tie or a kube-apiserver's
// longest write gap at TargetSeconds or over it.
func (r Report) Missed() []string {
	var out []string
	if r.TieSeconds >= TargetSeconds {
		out = append(out, fmt.Sprintf("time in tie %.2f s", r.TieSeconds))
	}
	for _, s := range r.KubeAPIServers {
		if s.MaxWriteGapMs >= 1000*TargetSeconds {
			out = append(out, fmt.Sprintf("%s's longest write gap %.2f s", s.Name, s.MaxWriteGapMs/1000))
		}
	}
	return out
}

// Verdict is the report in one line: whether every guarantee held and
// which target was missed.
func (r Report) Verdict() string {
	var b strings.Builder
	if broken := r.Broken(); len(broken) > 0 {
		fmt.Fprintf(&b, "VERDICT: FAILED: %s", strings.Join(broken, "; "))
	} else {
		b.WriteString("VERDICT: every guarantee held: 0 failed requests at the kube-apiservers, 0 lost writes, linearizable, no etcd crash")
	}
	if missed := r.Missed(); len(missed) > 0 {
		fmt.Fprintf(&b, "; target of under %.0f s missed: %s", TargetSeconds, strings.Join(missed, ", "))
	} else {
		fmt.Fprintf(&b, "; tie %.2f s and every write gap under %.0f s", r.TieSeconds, TargetSeconds)
	}
	return b.String()
}
