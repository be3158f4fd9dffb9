package demo

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
)

// leaderEvent is a raft role change of one member, as its etcd log states
// it: the member became leader (Leader) or stopped being one (a leader
// steps down by becoming follower, candidate or pre-candidate).
type leaderEvent struct {
	At     time.Time
	ID     string
	Leader bool
}

// roleChange matches raft's log line of a role change, e.g.
// "4fbd13c75de3725e became leader at term 3".
var roleChange = regexp.MustCompile(`^([0-9a-f]+) became (leader|follower|candidate|pre-candidate) at term \d+$`)

// parseLeaderEvent reads one line of etcd's JSON log.
func parseLeaderEvent(line []byte) (leaderEvent, bool) {
	if !bytes.Contains(line, []byte(" became ")) {
		return leaderEvent{}, false
	}
	var entry struct {
		TS  string `json:"ts"`
		Msg string `json:"msg"`
	}
	if json.Unmarshal(line, &entry) != nil {
		return leaderEvent{}, false
	}
	m := roleChange.FindStringSubmatch(entry.Msg)
	if m == nil {
		return leaderEvent{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, entry.TS)
	if err != nil {
		return leaderEvent{}, false
	}
	return leaderEvent{At: at, ID: m[1], Leader: m[2] == "leader"}, true
}

// readLeaderEvents collects the role changes of the members with the given
// IDs (lower-case hex) from the logs of members, sorted by time. The IDs
// keep out other clusters whose members shared a name (and so a log file).
func readLeaderEvents(members []*localetcd.Member, ids map[string]bool) ([]leaderEvent, error) {
	paths := make([]string, 0, len(members))
	for _, m := range members {
		paths = append(paths, m.LogPath)
	}
	return readLeaderEventsFrom(paths, ids)
}

// readLeaderEventsFrom is readLeaderEvents over etcd log files; a file that
// does not exist is skipped.
func readLeaderEventsFrom(paths []string, ids map[string]bool) ([]leaderEvent, error) {
	var out []leaderEvent
	for _, path := range paths {
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading etcd log %s: %w", path, err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
		for sc.Scan() {
			if ev, ok := parseLeaderEvent(sc.Bytes()); ok && ids[ev.ID] {
				out = append(out, ev)
			}
		}
		err = sc.Err()
		_ = f.Close()
		if err != nil {
			return nil, fmt.Errorf("reading etcd log %s: %w", path, err)
		}
	}
	slices.SortStableFunc(out, func(a, b leaderEvent) int { return a.At.Compare(b.At) })
	return out, nil
}

// leaderless is the time within [from, to] in which no member was leader,
// from the members' role changes in time order. Before the first leader
// counts as leaderless. A leader that left no line (killed) counts as
// leader until the next one is elected: this undercounts such a failover.
func leaderless(events []leaderEvent, from, to time.Time) time.Duration {
	var total time.Duration
	leader := ""
	since := time.Time{} // start of the current leaderless stretch
	account := func(end time.Time) {
		start := since
		if start.Before(from) {
			start = from
		}
		if end.After(to) {
			end = to
		}
		if end.After(start) {
			total += end.Sub(start)
		}
	}
	for _, ev := range events {
		switch {
		case ev.Leader && leader == "":
			account(ev.At)
			leader = ev.ID
		case ev.Leader:
			leader = ev.ID
		case ev.ID == leader:
			leader, since = "", ev.At
		}
	}
	if leader == "" {
		account(to)
	}
	return total
}

// idSet is a set of etcd member IDs, lower-case hex.
type idSet map[string]bool

func (s idSet) add(id string) {
	if id != "" {
		s[strings.ToLower(id)] = true
	}
}
