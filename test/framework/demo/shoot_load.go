package demo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/druid-stretch/druid-stretch/test/framework/apiload"
)

// shootStartTimeout bounds the wait for a shoot kube-apiserver's first
// /readyz 200 once its process runs. The destination's becomes ready while
// the leader is still in the source, 180 ms away: its bootstrap hooks read
// and write one request at a time across the sites, which took 2 minutes
// with two fault-matrix moves side by side on 2 cores and over 3 with more
// load beside them.
const shootStartTimeout = 6 * time.Minute

// shootServesPoll is how often B's members are checked for the first one
// that serves.
const shootServesPoll = 250 * time.Millisecond

// shootLoad is the judge a Rehearse adds at the API level: a shoot
// kube-apiserver per cluster (A's on the source's members, B's on the
// destination's once one of them serves) and client-go clients (apiload)
// through both for the whole move, as test/site's LiveMove runs them
// on real sites.
type shootLoad struct {
	a, b *shootAPIServer
	load *apiload.Load

	// B's start: bDone is closed once the goroutine that waits for B's
	// first serving member and starts B's kube-apiserver has ended, with
	// bErr its result.
	cancelB context.CancelFunc
	bDone   chan struct{}
	bErr    error

	// An abort's stop of B's kube-apiserver (keepAtSource): bStopped is
	// closed once it has ended, with bStopErr its result.
	bStopped chan struct{}
	bStopErr error

	show *liveView

	mu       sync.Mutex
	switched bool // A's clients went to B
}

// startShootLoad starts A's kube-apiserver on the source's serving
// members and the clients through it, waits until it serves, and starts
// the wait for B's, each server ready once its /readyz without the checks
// readyzExclude names answers 200. Close it.
func (e *Env) startShootLoad(ctx context.Context, show *liveView, readyzExclude []string) (_ *shootLoad, err error) {
	s := &shootLoad{bDone: make(chan struct{}), bStopped: make(chan struct{}), show: show}
	close(s.bDone)    // until B's wait runs, there is nothing to wait for
	close(s.bStopped) // nor a stop, until an abort begins one
	defer func() {
		if err != nil {
			err = errors.Join(err, s.close())
		}
	}()
	if s.a, err = e.newShootAPIServer(e.A); err != nil {
		return s, err
	}
	if s.b, err = e.newShootAPIServer(e.B); err != nil {
		return s, err
	}
	// A readiness probe of a member on a loaded machine can miss its short
	// timeout: ask again until one serves, for a while.
	var urls []string
	for deadline := time.Now().Add(30 * time.Second); len(urls) == 0 && time.Now().Before(deadline); {
		if urls, err = e.servingMembers(ctx, e.A); err != nil {
			return s, err
		}
		if len(urls) == 0 {
			time.Sleep(250 * time.Millisecond) // the interval between two rounds of probes
		}
	}
	if len(urls) == 0 {
		return s, errors.New("no member of the source serves (30 s of readiness probes): nothing to start cluster A's shoot kube-apiserver on")
	}
	show.printf("starting cluster A's shoot kube-apiserver on %d source members, and client-go clients through it ...", len(urls))
	if err := s.a.start(urls); err != nil {
		return s, err
	}
	s.load, err = apiload.New(apiload.Options{
		Servers:       []apiload.Server{{Name: s.a.Name, Config: s.a.Config}, {Name: s.b.Name, Config: s.b.Config}},
		ReadyzExclude: readyzExclude,
		Log:           e.Config.Logger.WithName("apiload"),
	})
	if err != nil {
		return s, err
	}
	startCtx, cancel := context.WithTimeout(ctx, shootStartTimeout)
	defer cancel()
	startCtx, stopWatch := s.a.untilExit(startCtx)
	defer stopWatch()
	if err := s.load.Start(startCtx); err != nil {
		return s, fmt.Errorf("cluster A's shoot kube-apiserver does not serve: %w", errors.Join(err, context.Cause(startCtx)))
	}

	bCtx, cancelB := context.WithCancel(context.WithoutCancel(ctx))
	s.cancelB, s.bDone = cancelB, make(chan struct{})
	go func() {
		defer close(s.bDone)
		s.bErr = e.startOnceEtcdServes(bCtx, s.b, e.B, show)
	}()
	return s, nil
}

// startOnceEtcdServes waits until a member of cluster c serves, then starts
// c's shoot kube-apiserver on c's serving members, as Gardener deploys a
// control plane's kube-apiserver once its etcd serves.
func (e *Env) startOnceEtcdServes(ctx context.Context, k *shootAPIServer, c *Cluster, show *liveView) error {
	tick := time.NewTicker(shootServesPoll)
	defer tick.Stop()
	for {
		urls, err := e.servingMembers(ctx, c)
		if err == nil && len(urls) > 0 {
			show.printf("starting cluster %s's shoot kube-apiserver on %d serving member(s) of its own", c.Name, len(urls))
			return k.start(urls)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for a serving member of cluster %s: %w", c.Name, ctx.Err())
		case <-tick.C:
		}
	}
}

// switchClients is the Mover's SwitchClients, as gardenlet switches a
// shoot's API endpoint: once B's kube-apiserver serves, A's clients move
// to it, and A's kube-apiserver stops once no request through it is in
// flight. The move goes on to remove source members only after it
// returned. Safe to repeat.
func (s *shootLoad) switchClients(ctx context.Context) error {
	select {
	case <-s.bDone:
	case <-ctx.Done():
		return ctx.Err()
	}
	if s.bErr != nil {
		return fmt.Errorf("starting cluster B's shoot kube-apiserver: %w", s.bErr)
	}
	s.mu.Lock()
	switched := s.switched
	s.mu.Unlock()
	if !switched {
		rctx, cancel := context.WithTimeout(ctx, shootStartTimeout)
		defer cancel()
		rctx, stopWatch := s.b.untilExit(rctx)
		defer stopWatch()
		if err := s.load.WaitReady(rctx, s.b.Name); err != nil {
			return errors.Join(err, context.Cause(rctx))
		}
		if err := s.load.Switch(ctx, s.a.Name, s.b.Name); err != nil {
			return err
		}
		s.mu.Lock()
		s.switched = true
		s.mu.Unlock()
	}
	return s.a.stop(ctx)
}

// keepAtSource is what an abort does to the shoot: its API endpoint stays
// at the source. B's clients move to A's kube-apiserver, and B's
// kube-apiserver, whose members the abort removes, stops. Call it before
// the abort, with A's clients not switched.
//
// It returns once B's clients have moved; B's kube-apiserver stops in the
// background (results and close wait for it). It serves nobody from then
// on, and its graceful stop in the middle of its start took 6-13 s, in
// which the destination's controller went on retiring the source: the
// abort began later than the moment it was asked for.
func (s *shootLoad) keepAtSource(ctx context.Context) error {
	start := time.Now()
	s.cancelB()
	<-s.bDone
	if !s.b.started() {
		return nil // B's never ran: its clients never sent a request
	}
	if err := s.load.Switch(ctx, s.b.Name, s.a.Name); err != nil {
		return err
	}
	s.show.printf("cluster B's clients moved to cluster A's kube-apiserver in %.2fs; stopping B's kube-apiserver", time.Since(start).Seconds())
	stopped := make(chan struct{})
	s.bStopped = stopped
	go func() {
		defer close(stopped)
		s.bStopErr = s.b.stop(context.WithoutCancel(ctx))
	}()
	return nil
}

// results stops the clients and checks their history.
func (s *shootLoad) results(ctx context.Context) (apiload.Results, error) {
	s.load.Stop()
	<-s.bStopped
	if s.bStopErr != nil {
		return apiload.Results{}, fmt.Errorf("stopping cluster B's kube-apiserver for the abort: %w", s.bStopErr)
	}
	return s.load.Results(ctx, apiload.VerifyOptions{LinearizabilityTimeout: 3 * time.Minute})
}

// mark records an event on the clients' clock.
func (s *shootLoad) mark(event string) { s.load.Mark(event) }

// close ends the clients, B's start and both kube-apiservers.
func (s *shootLoad) close() error {
	if s.cancelB != nil {
		s.cancelB()
	}
	<-s.bDone
	<-s.bStopped
	if s.load != nil {
		s.load.Stop()
	}
	var errs []error
	for _, k := range []*shootAPIServer{s.b, s.a} {
		if k != nil {
			errs = append(errs, k.stop(context.Background()))
		}
	}
	return errors.Join(errs...)
}
