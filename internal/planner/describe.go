package planner

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Describe summarises a membership for status and logs, e.g.
// "3 voters (a: 2, b: 1, leader a-1), 1 learner (b-3)".
func Describe(members []Member) string {
	if len(members) == 0 {
		return "no members"
	}
	sides := map[string]int{}
	var leader string
	var down, learners []string
	for _, m := range members {
		name := (&member{Member: m, name: m.Name}).label()
		if m.Learner {
			learners = append(learners, name)
			continue
		}
		sides[m.Side]++
		if m.Leader {
			leader = name
		}
		if !m.Healthy {
			down = append(down, name)
		}
	}
	voters := len(members) - len(learners)
	var parts []string
	for _, side := range slices.Sorted(maps.Keys(sides)) {
		parts = append(parts, fmt.Sprintf("%s: %d", sideLabel(side), sides[side]))
	}
	if leader != "" {
		parts = append(parts, "leader "+leader)
	} else {
		parts = append(parts, "no leader")
	}
	if len(down) > 0 {
		slices.Sort(down)
		parts = append(parts, "down "+strings.Join(down, " "))
	}
	s := fmt.Sprintf("%d %s (%s)", voters, plural(voters, "voter"), strings.Join(parts, ", "))
	if len(learners) > 0 {
		slices.Sort(learners)
		s += fmt.Sprintf(", %d %s (%s)", len(learners), plural(len(learners), "learner"), strings.Join(learners, " "))
	}
	return s
}

func sideLabel(side string) string {
	if side == "" {
		return "no side"
	}
	return side
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// Detail lists each member with what the planner weighs of it, for logs:
// e.g. "a-0 voter leader healthy 1m0s; b-1 learner unstarted connected
// 2.5s replicating".
func Detail(members []Member) string {
	var out []string
	for _, m := range members {
		f := []string{(&member{Member: m, name: m.Name}).label()}
		if m.Side != "" {
			f = append(f, "side "+m.Side)
		}
		if m.Learner {
			f = append(f, "learner")
		} else {
			f = append(f, "voter")
		}
		flag := func(on bool, word string) {
			if on {
				f = append(f, word)
			}
		}
		flag(m.Leader, "leader")
		if m.Healthy {
			f = append(f, "healthy "+m.HealthyFor.String())
		}
		flag(m.Learner && m.CaughtUp, "caught-up")
		flag(m.Unstarted, "unstarted")
		flag(m.Unanswered, "unanswered")
		if m.ConnectedFor > 0 {
			f = append(f, "connected "+m.ConnectedFor.String())
		}
		flag(m.Replicating, "replicating")
		flag(m.BehindAtLeader, "behind-at-leader")
		if m.ConfiguredFor > 0 {
			f = append(f, "configured "+m.ConfiguredFor.String())
		}
		if m.Problem != "" {
			f = append(f, "problem "+m.Problem)
		}
		out = append(out, strings.Join(f, " "))
	}
	return strings.Join(out, "; ")
}
