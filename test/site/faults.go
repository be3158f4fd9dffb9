package site

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/druid-stretch/druid-stretch/test/infrastructure/podnet"
)

// The faults a test puts into a running site: its druid or druid-stretch
// restarted as a Deployment restarts a pod, and the link to a peered site
// cut.

// addPeering records the link to peer, for Partition and Heal.
func (s *Site) addPeering(peer *Site, p *podnet.Peering) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peerings == nil {
		s.peerings = map[*Site]*podnet.Peering{}
	}
	s.peerings[peer] = p
}

func (s *Site) peering(peer *Site) (*podnet.Peering, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peerings[peer]
	if p == nil {
		return nil, fmt.Errorf("site %s is not peered with site %s: peer them first (Peer)", s.opts.ClusterIdentity, peer.opts.ClusterIdentity)
	}
	return p, nil
}

// Partition cuts the link between s and peer until Heal: every packet
// between their pods is dropped, both ways. Each site's own control plane
// and pods go on; only what crosses between the sites stops.
func (s *Site) Partition(peer *Site) error {
	p, err := s.peering(peer)
	if err != nil {
		return err
	}
	p.Partition()
	return nil
}

// Heal ends a Partition between s and peer and returns how many packets
// the link dropped in all its partitions so far, both ways: a cut that
// dropped nothing cut nothing.
func (s *Site) Heal(peer *Site) (dropped int64, err error) {
	p, err := s.peering(peer)
	if err != nil {
		return 0, err
	}
	p.Heal()
	return p.Dropped(), nil
}

// KillDruid kills the site's etcd-druid manager with SIGKILL (its whole
// process group, nothing flushed or released) and, after restartAfter,
// starts it again as its Deployment would, with the same configuration;
// it returns once the new process serves its metrics (druid pauses 10 s
// in its start-up).
func (s *Site) KillDruid(ctx context.Context, restartAfter time.Duration) error {
	d := s.druid
	if d == nil {
		return errors.New("the site runs no etcd-druid to kill")
	}
	d.mu.Lock()
	p := d.proc
	d.mu.Unlock()
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing etcd-druid (pid %d): %w", p.cmd.Process.Pid, err)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := pauseUntil(ctx, time.Now().Add(restartAfter)); err != nil {
		return err
	}
	if err := s.runDruid(ctx); err != nil {
		return fmt.Errorf("starting etcd-druid again: %w", err)
	}
	return nil
}

// RestartDruidStretch stops the site's druid-stretch manager (the
// controller and its webhooks), as a pod that ends does, and after
// restartAfter starts a new one from the same options, as the pod's
// replacement: a new process to the controller, with a new membership lock
// token under the same holder (the cluster identity), so that it takes
// over its predecessor's lock and step records. It returns once the new
// webhook server is ready.
func (s *Site) RestartDruidStretch(ctx context.Context, restartAfter time.Duration) error {
	if s.stretch == nil {
		return errors.New("the site runs no druid-stretch to restart")
	}
	if err := s.stretch.stop(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("stopping druid-stretch: %w", err)
	}
	if err := pauseUntil(ctx, time.Now().Add(restartAfter)); err != nil {
		return err
	}
	if err := s.stretch.run(ctx); err != nil {
		return fmt.Errorf("starting druid-stretch again: %w", err)
	}
	return nil
}
