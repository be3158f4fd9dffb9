package site

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// statusWiper drops status.membership after every membership change a
// site's controller records, for as long as it runs: from the Etcd, as
// druid's compaction controller does with its full status update (it reads
// the Etcd into druid's type), and from the EtcdMembership, where druid
// never would, so that the controller has no record of its own left. The
// controller must go on from etcd's member list, the sidecars' step
// records and the pods, as if nothing happened.
type statusWiper struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	wiped []wipe
}

// wipe is one drop: the step whose record it dropped, on which site.
type wipe struct {
	site string
	step v1alpha1.MembershipStep
}

func (w wipe) String() string {
	return fmt.Sprintf("%s: %s %s", w.site, w.step.Kind, w.step.Member)
}

// wipeStatusAfterEveryStep starts a statusWiper on the Etcd key of each
// site. It polls every 20 ms: steps closer together than that may share
// one drop.
func wipeStatusAfterEveryStep(ctx context.Context, t *testing.T, key client.ObjectKey, sites ...*Site) *statusWiper {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	w := &statusWiper{cancel: cancel}
	for _, s := range sites {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			var last *v1alpha1.MembershipStep
			_ = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
				p, err := etcdview.Get(ctx, s.Client, key)
				if err != nil || p.Membership == nil {
					return false, nil // not there yet, or a read the site's API server dropped
				}
				st := p.View.Status.Membership
				if st == nil || st.LastStep == nil || st.LastStep.Outcome != v1alpha1.StepSucceeded {
					return false, nil
				}
				if last != nil && last.Kind == st.LastStep.Kind && last.Member == st.LastStep.Member && last.Time.Equal(&st.LastStep.Time) {
					return false, nil // wiped already, and not written again since
				}
				step := *st.LastStep
				if !dropStatus(ctx, s, p) {
					return false, nil
				}
				last = &step
				w.mu.Lock()
				w.wiped = append(w.wiped, wipe{site: s.opts.ClusterIdentity, step: step})
				w.mu.Unlock()
				t.Logf("%s: dropped status.membership after %s %s", s.opts.ClusterIdentity, step.Kind, step.Member)
				return false, nil
			})
		}()
	}
	return w
}

// stop ends the wiper and returns every drop it made, in order per site.
func (w *statusWiper) stop() []wipe {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.wiped)
}

// kinds are the step kinds of wipes, each once, in the order first seen.
func kinds(wipes []wipe) []v1alpha1.StepKind {
	var out []v1alpha1.StepKind
	for _, w := range wipes {
		if !slices.Contains(out, w.step.Kind) {
			out = append(out, w.step.Kind)
		}
	}
	return out
}

// dropStatus drops status.membership from the Etcd, as druid's full status
// update does, and from its EtcdMembership; false when a write failed (a
// conflict: the controller wrote meanwhile), to be read and tried again.
func dropStatus(ctx context.Context, s *Site, p *etcdview.Pair) bool {
	if p.Etcd.Status.Membership != nil {
		p.Etcd.Status.Membership = nil
		if err := s.Client.Status().Update(ctx, p.Etcd); err != nil {
			return false
		}
	}
	p.Membership.Status.Membership = nil
	return s.Client.Status().Update(ctx, p.Membership) == nil
}
