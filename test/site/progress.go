package site

import (
	"context"
	"regexp"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
)

// Progress is one stretch of time in which a site's membership controller
// said the same thing about a change under way: its EtcdMembership's
// MembershipProgressing condition, True, with one reason and one message
// (the durations in a message, which grow while it waits, aside): the
// step it takes, or what the step waits for, such as etcd's 5 s strict
// reconfiguration check ("... connected for 3.1s of 5s"), a learner's
// start, its catch-up, or etcd's refusal it retries. It names what a
// move's time went on.
type Progress struct {
	// Site is the site's ClusterIdentity.
	Site string
	// Reason is the condition's reason, a word such as WaitingForLearner.
	Reason string
	// Message is the condition's message as first seen.
	Message string
	// Start is when the report was first seen, End when another one
	// replaced it (or the recording stopped).
	Start, End time.Time
}

// ProgressRecorder polls the EtcdMembership of one Etcd on several sites
// and records what their controllers report of the changes under way.
type ProgressRecorder struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once

	mu      sync.Mutex
	reports []Progress
	open    map[string]int // site -> index in reports of the report standing there
}

// progressPollInterval is how often a ProgressRecorder reads the statuses:
// the controllers look again at a changing membership every 250 ms.
const progressPollInterval = 200 * time.Millisecond

// RecordProgress starts recording the progress reports of key's
// EtcdMembership on sites, until Stop.
func RecordProgress(sites []*Site, key client.ObjectKey) *ProgressRecorder {
	r := &ProgressRecorder{stop: make(chan struct{}), done: make(chan struct{}), open: map[string]int{}}
	go func() {
		defer close(r.done)
		t := time.NewTicker(progressPollInterval)
		defer t.Stop()
		for {
			for _, s := range sites {
				r.poll(s, key)
			}
			select {
			case <-r.stop:
				return
			case <-t.C:
			}
		}
	}()
	return r
}

func (r *ProgressRecorder) poll(s *Site, key client.ObjectKey) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m := &stretchv1alpha1.EtcdMembership{}
	if err := s.Client.Get(ctx, key, m); err != nil {
		// Not created yet, or gone: nothing is under way there now.
		r.see(s.opts.ClusterIdentity, nil, time.Now())
		return
	}
	var c *metav1.Condition
	if m.Status.Membership != nil {
		c = meta.FindStatusCondition(m.Status.Membership.Conditions, v1alpha1.ConditionMembershipProgressing)
	}
	r.see(s.opts.ClusterIdentity, c, time.Now())
}

// see records the Progressing condition c of site's controller, seen at
// now: a report goes on while the condition says the same, and ends when
// it says something else or nothing.
func (r *ProgressRecorder) see(site string, c *metav1.Condition, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.open[site]
	if ok {
		p := &r.reports[i]
		if c != nil && c.Status == metav1.ConditionTrue && c.Reason == p.Reason && sameProgress(c.Message, p.Message) {
			p.End = now
			return
		}
		p.End = now
		delete(r.open, site)
	}
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason == "" {
		return
	}
	r.open[site] = len(r.reports)
	r.reports = append(r.reports, Progress{Site: site, Reason: c.Reason, Message: c.Message, Start: now, End: now})
}

// durations are Go durations as a message prints them ("3.1s",
// "185.99ms", "1m0s").
var durations = regexp.MustCompile(`\d+(\.\d+)?(ns|µs|us|ms|s|m|h)(\d+(\.\d+)?(ns|µs|us|ms|s|m|h))*`)

// sameProgress tells whether two messages report the same thing: equal
// but for the durations in them.
func sameProgress(a, b string) bool {
	return durations.ReplaceAllString(a, "D") == durations.ReplaceAllString(b, "D")
}

// Stop ends the recording and returns the reports seen, in the order they
// began. Safe to call twice.
func (r *ProgressRecorder) Stop() []Progress {
	r.once.Do(func() { close(r.stop) })
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Progress(nil), r.reports...)
}
