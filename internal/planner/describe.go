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
