package livemove

import (
	"context"
	"errors"
	"fmt"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
)

// GEP39 makes a Mover write GEP-39's stages (move.Stage) instead of
// druid-stretch's own steps: druid's fields only, as gardenlet writes them.
type GEP39 struct {
	// DestinationPrefix is the destination's spec.memberNamePrefix
	// (gardenlet: the destination seed's name). Required.
	DestinationPrefix string
	// SourceClientEndpoints are the source's client endpoints as the
	// destination reaches them, for spec.etcd.bootstrapWithExistingCluster.
	// Required.
	SourceClientEndpoints []string
}

func (g *GEP39) check() error {
	var errs []error
	if g.DestinationPrefix == "" {
		errs = append(errs, errors.New("migration: GEP-39 needs the destination's member name prefix (gardenlet uses the destination seed's name)"))
	}
	if len(g.SourceClientEndpoints) == 0 {
		errs = append(errs, errors.New("migration: GEP-39 needs the source's client endpoints as the destination reaches them"))
	}
	return errors.Join(errs...)
}

// moveGEP39 runs GEP-39's stages in order. Each stage's write is the same
// when repeated and each wait ends at once when its state holds, so a move
// interrupted anywhere resumes by running it again.
func (m *Mover) moveGEP39(ctx context.Context) error {
	g := m.o.GEP39
	src, dst, _, err := m.Read(ctx)
	if err != nil {
		return err
	}
	if src == nil {
		return fmt.Errorf("migration: there is no source Etcd %s/%s", m.o.Namespace, m.o.Name)
	}
	n := src.Spec.Replicas
	retired := dst != nil && move.EtcdMigrationCompleted(dst)
	if !retired {
		if n < 1 {
			return fmt.Errorf("migration: the source Etcd %s/%s has no replicas to move", src.Namespace, src.Name)
		}
		if err := m.run(ctx, move.Step(move.StageSourceEtcdPreparedForPeerJoin), src, dst, m.prepareSourceForPeerJoin); err != nil {
			return err
		}
		if src, dst, _, err = m.Read(ctx); err != nil {
			return err
		}
		if err := m.run(ctx, move.Step(move.StageDestinationEtcdPeersJoined), src, dst, func(ctx context.Context, src, dst *v1alpha1.Etcd) error {
			return m.joinDestinationPeers(ctx, src, dst, n, g)
		}); err != nil {
			return err
		}
		if m.o.SwitchClients != nil && !m.switched {
			if err := m.run(ctx, move.StepSwitchClients, src, dst, func(ctx context.Context, _, _ *v1alpha1.Etcd) error {
				if err := m.o.SwitchClients(ctx); err != nil {
					return fmt.Errorf("migration: switching the source site's clients to the destination: %w", err)
				}
				m.switched = true
				return nil
			}); err != nil {
				return err
			}
		}
		if src, dst, _, err = m.Read(ctx); err != nil {
			return err
		}
		if err := m.run(ctx, move.Step(move.StageEtcdMigrationComplete), src, dst, m.completeEtcdMigration); err != nil {
			return err
		}
	}
	if src, dst, _, err = m.Read(ctx); err != nil {
		return err
	}
	if src == nil || src.Spec.Replicas == 0 {
		return nil
	}
	return m.run(ctx, move.Step(move.StageSourceSeedCleanup), src, dst, m.cleanupSource)
}

func (m *Mover) prepareSourceForPeerJoin(ctx context.Context, _, _ *v1alpha1.Etcd) error {
	var advErr error
	if err := m.patch(ctx, m.o.Source, "source", func(e *v1alpha1.Etcd) { advErr = move.PrepareSourceForPeerJoin(e, m.o.SourceAddresses) }); err != nil || advErr != nil {
		return errors.Join(advErr, err)
	}
	return m.wait(ctx, move.Step(move.StageSourceEtcdPreparedForPeerJoin), func(src, _ *v1alpha1.Etcd) bool { return move.SourcePreparedForPeerJoin(src) })
}

// joinDestinationPeers creates the destination with n-1 replicas, waits
// for them, and scales it to n, as GEP-39 does (3 -> 3+2 -> 3+3).
func (m *Mover) joinDestinationPeers(ctx context.Context, src, dst *v1alpha1.Etcd, n int32, g *GEP39) error {
	first := max(n-1, 1)
	if dst == nil {
		t := move.NewJoiningDestination(src, g.DestinationPrefix)
		if err := move.JoinDestinationPeers(t, src, first, g.SourceClientEndpoints, m.o.DestinationAddresses); err != nil {
			return err
		}
		move.RequestDruidReconcile(t)
		if err := m.create(ctx, t); err != nil {
			return err
		}
	}
	step := move.Step(move.StageDestinationEtcdPeersJoined)
	if err := m.wait(ctx, step, func(_, dst *v1alpha1.Etcd) bool {
		return dst != nil && (dst.Spec.Replicas > first || move.DestinationPeersJoined(dst))
	}); err != nil {
		return err
	}
	var joinErr error
	if err := m.patch(ctx, m.o.Destination, "destination", func(e *v1alpha1.Etcd) {
		joinErr = move.JoinDestinationPeers(e, src, n, g.SourceClientEndpoints, m.o.DestinationAddresses)
	}); err != nil || joinErr != nil {
		return errors.Join(joinErr, err)
	}
	return m.wait(ctx, step, func(_, dst *v1alpha1.Etcd) bool { return move.DestinationPeersJoined(dst) })
}

// completeEtcdMigration waits for druid's record of the join, unsets the
// bootstrap field and waits until the source's members are retired.
func (m *Mover) completeEtcdMigration(ctx context.Context, _, _ *v1alpha1.Etcd) error {
	step := move.Step(move.StageEtcdMigrationComplete)
	if err := m.wait(ctx, step, func(_, dst *v1alpha1.Etcd) bool {
		return dst != nil && (dst.Status.BootstrapWithExistingCluster != nil || dst.Spec.Etcd.BootstrapWithExistingCluster == nil)
	}); err != nil {
		return fmt.Errorf("waiting for druid to record the join (condition BootstrappedWithExistingCluster): %w", err)
	}
	var completeErr error
	if err := m.patch(ctx, m.o.Destination, "destination", func(e *v1alpha1.Etcd) { completeErr = move.CompleteEtcdMigration(e) }); err != nil || completeErr != nil {
		return errors.Join(completeErr, err)
	}
	return m.wait(ctx, step, func(_, dst *v1alpha1.Etcd) bool { return move.EtcdMigrationCompleted(dst) })
}

func (m *Mover) cleanupSource(ctx context.Context, _, _ *v1alpha1.Etcd) error {
	if err := m.patch(ctx, m.o.Source, "source", move.CleanupSource); err != nil {
		return err
	}
	return m.wait(ctx, move.Step(move.StageSourceSeedCleanup), func(src, _ *v1alpha1.Etcd) bool { return src == nil || move.Converged(src) })
}
