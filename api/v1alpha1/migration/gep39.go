package migration

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
)

// Stage is a stage of Gardener's live control plane migration (GEP-39),
// named after the shoot condition gardenlet sets when it is done. Each
// stage that touches etcd is a write of druid's own Etcd fields and a
// wait; druid-stretch's controllers read those fields (see
// stretchv1alpha1.FromBootstrap) and carry the membership, so gardenlet
// writes no field of druid-stretch's:
//
//  1. SourceEtcdPreparedForPeerJoin: the source advertises the peer URLs
//     the destination reaches its members by (PrepareSourceForPeerJoin).
//     Wait: SourcePreparedForPeerJoin.
//  2. DestinationEtcdPeersJoined: the destination Etcd is created with the
//     same name, its own spec.memberNamePrefix, ordinals from 0, replicas
//     N-1, its own additional peer URLs and
//     spec.etcd.bootstrapWithExistingCluster naming the source's members
//     (NewJoiningDestination, JoinDestinationPeers); then replicas N. The
//     destination's controller adds its members as learners and promotes
//     all but the last, which stays a learner: the source's N voters keep
//     the quorum alone, so a partition between the seeds stalls no write
//     of the source's. Wait: DestinationPeersJoined.
//  3. MigrateExtensionsNeededBeforeKubeAPIServer,
//     DestinationKubeAPIServerReady, MigrateDNSRecords: gardenlet's, no
//     etcd write. The source's clients move to the destination's
//     kube-apiserver.
//  4. EtcdMigrationComplete: spec.etcd.bootstrapWithExistingCluster is
//     unset once druid recorded the join (CompleteEtcdMigration). The
//     destination's controller retires the source's members: its learner
//     promoted in the same call as the first removal (one tie), the leader
//     moved once, the source's clients drained before each removal.
//     Wait: EtcdMigrationCompleted.
//  5. SourceSeedCleanup: the source scales to zero (CleanupSource) before
//     gardenlet deletes it; its members are gone from etcd already.
type Stage string

// The stages of a GEP-39 move that write an Etcd, in order.
const (
	StageSourceEtcdPreparedForPeerJoin Stage = "SourceEtcdPreparedForPeerJoin"
	StageDestinationEtcdPeersJoined    Stage = "DestinationEtcdPeersJoined"
	StageEtcdMigrationComplete         Stage = "EtcdMigrationComplete"
	StageSourceSeedCleanup             Stage = "SourceSeedCleanup"
)

// Stages are the stages of a GEP-39 move that write an Etcd, in order.
var Stages = []Stage{StageSourceEtcdPreparedForPeerJoin, StageDestinationEtcdPeersJoined, StageEtcdMigrationComplete, StageSourceSeedCleanup}

// PrepareSourceForPeerJoin makes the source's members advertise the peer
// URLs the destination reaches them by, in druid's own
// spec.etcd.additionalAdvertisePeerURLs (see Advertise).
func PrepareSourceForPeerJoin(src *v1alpha1.Etcd, addr Addresses) error {
	return Advertise(src, addr)
}

// SourcePreparedForPeerJoin reports whether every member of the source
// advertises additional peer URLs and etcd knows it by them, as the
// source's controller observed them: only then can the destination's
// members reach the source's.
func SourcePreparedForPeerJoin(src *v1alpha1.Etcd) bool {
	if !Converged(src) {
		return false
	}
	entries := advertised(src)
	for _, name := range members.LocalMemberNames(src) {
		i := slices.IndexFunc(entries, func(a druidv1alpha1.MemberPeerURLs) bool { return a.MemberName == name })
		m := observedMember(src, name)
		if i < 0 || len(entries[i].URLs) == 0 || m == nil {
			return false
		}
		for _, u := range entries[i].URLs {
			if !slices.Contains(m.PeerURLs, u) {
				return false
			}
		}
	}
	return true
}

func observedMember(e *v1alpha1.Etcd, name string) *v1alpha1.ObservedMember {
	for i, m := range observed(e) {
		if m.Name == name {
			return &observed(e)[i]
		}
	}
	return nil
}

// NewJoiningDestination is the destination Etcd of a GEP-39 move of src:
// the same name, namespace and druid spec, its members named with prefix
// (gardenlet uses the destination seed's name) on ordinals from 0, and
// none of the source's additional peer URLs or bootstrap. druid-stretch's
// fields stay unset. Fill it with JoinDestinationPeers before creating it.
func NewJoiningDestination(src *v1alpha1.Etcd, prefix string) *v1alpha1.Etcd {
	dst := destinationOf(src)
	dst.Spec.MemberNamePrefix = &prefix
	dst.Spec.Etcd.AdditionalAdvertisePeerURLs = nil
	dst.Spec.Etcd.BootstrapWithExistingCluster = nil
	return dst
}

// JoinDestinationPeers sets what the destination joins with, for the
// write that creates it (replicas N-1) and the one that scales it to N:
// spec.replicas, the additional peer URLs its members are reached by
// (addr), and, at creation, spec.etcd.bootstrapWithExistingCluster naming
// the source's members with the peer URLs etcd knows them by (as the
// source's controller observed them) and the source's client endpoints.
// druid admits the bootstrap field only when the Etcd is created: a
// destination that has one keeps it as it is.
func JoinDestinationPeers(dst, src *v1alpha1.Etcd, replicas int32, clientEndpoints []string, addr Addresses) error {
	if dst.Spec.MemberNamePrefix == nil || *dst.Spec.MemberNamePrefix == "" {
		return errors.New("migration: the destination has no spec.memberNamePrefix: its members would take the source's names (both count ordinals from 0)")
	}
	if dst.Spec.Etcd.BootstrapWithExistingCluster == nil && dst.CreationTimestamp.IsZero() {
		b, err := BootstrapFrom(src, clientEndpoints)
		if err != nil {
			return err
		}
		dst.Spec.Etcd.BootstrapWithExistingCluster = b
	}
	dst.Spec.Replicas = replicas
	return Advertise(dst, addr)
}

// BootstrapFrom is spec.etcd.bootstrapWithExistingCluster for joining
// src's cluster: src's own members, each with the peer URLs etcd knows it
// by (src's controller's last observation), sorted by name, and
// clientEndpoints. Before
// src's controller has observed all of its members, it is an error.
func BootstrapFrom(src *v1alpha1.Etcd, clientEndpoints []string) (*druidv1alpha1.BootstrapWithExistingCluster, error) {
	if len(clientEndpoints) == 0 {
		return nil, errors.New("migration: no client endpoints of the source: backup-restore of a joining pod and druid need them")
	}
	b := &druidv1alpha1.BootstrapWithExistingCluster{ClientEndpoints: slices.Clone(clientEndpoints)}
	for _, m := range observed(src) {
		if !members.IsOwn(src, m) {
			continue
		}
		if m.Name == "" || len(m.PeerURLs) == 0 {
			return nil, fmt.Errorf("migration: source member %s has not started yet: its name and peer URLs are not known", m.ID)
		}
		b.Members = append(b.Members, druidv1alpha1.BootstrapExistingMember{Name: m.Name, PeerURLs: slices.Clone(m.PeerURLs)})
	}
	// By name: the same source gives the same field, whatever order the
	// controller observed its members in.
	slices.SortFunc(b.Members, func(x, y druidv1alpha1.BootstrapExistingMember) int { return strings.Compare(x.Name, y.Name) })
	if len(b.Members) != int(src.Spec.Replicas) {
		return nil, fmt.Errorf("migration: the source's controller observed %d of its %d members: wait until it has observed them all", len(b.Members), src.Spec.Replicas)
	}
	return b, nil
}

// DestinationPeersJoined reports whether the destination's controller
// converged with all of the destination's members in the cluster (the
// last a learner while the source is kept, see
// stretchv1alpha1.FromBootstrap).
func DestinationPeersJoined(dst *v1alpha1.Etcd) bool {
	if !Converged(dst) || dst.Spec.Etcd.BootstrapWithExistingCluster == nil {
		return false
	}
	_, all := localVoters(dst)
	return all == int(dst.Spec.Replicas)
}

// CompleteEtcdMigration unsets spec.etcd.bootstrapWithExistingCluster, the
// signal to remove the source's members. It refuses while druid has not
// recorded the join (status.bootstrapWithExistingCluster, written once
// BootstrappedWithExistingCluster is True): unset before that, nothing
// would name the source's members any more, and druid-stretch, which
// removes no member it cannot name, would keep them for good.
func CompleteEtcdMigration(dst *v1alpha1.Etcd) error {
	if dst.Spec.Etcd.BootstrapWithExistingCluster == nil {
		return nil
	}
	if st := dst.Status.BootstrapWithExistingCluster; st == nil || len(st.Members) == 0 {
		return errors.New("migration: druid has not recorded the join yet (status.bootstrapWithExistingCluster is empty; condition BootstrappedWithExistingCluster not True): unsetting spec.etcd.bootstrapWithExistingCluster now would leave the source's members unnamed, and they would stay")
	}
	dst.Spec.Etcd.BootstrapWithExistingCluster = nil
	return nil
}

// EtcdMigrationCompleted reports whether the destination's controller
// converged with the source's members retired: the destination's N
// members vote and no member of the source is left.
func EtcdMigrationCompleted(dst *v1alpha1.Etcd) bool {
	return dst.Spec.Etcd.BootstrapWithExistingCluster == nil && SourceRetired(dst)
}

// CleanupSource scales the source to zero (FinishSource): its members are
// gone from etcd, so this stops its pods before gardenlet deletes it.
func CleanupSource(src *v1alpha1.Etcd) { FinishSource(src) }

// StageOf reads where a GEP-39 move stands from the two Etcds (dst nil
// before it exists): the stage under way or next, with a sentence why; ""
// once the source's members are retired and the source has no replicas.
func StageOf(src, dst *v1alpha1.Etcd) (Stage, string) {
	switch {
	case dst == nil && src == nil:
		return StageSourceEtcdPreparedForPeerJoin, "there is neither a source nor a destination Etcd"
	case dst == nil && !SourcePreparedForPeerJoin(src):
		return StageSourceEtcdPreparedForPeerJoin, "etcd does not know every source member by the additional peer URLs the source advertises yet"
	case dst == nil:
		return StageDestinationEtcdPeersJoined, "the source is prepared; there is no destination Etcd yet"
	case dst.Spec.Etcd.BootstrapWithExistingCluster != nil && !DestinationPeersJoined(dst):
		_, all := localVoters(dst)
		return StageDestinationEtcdPeersJoined, fmt.Sprintf("%d of the destination's %d members are in the cluster", all, dst.Spec.Replicas)
	case dst.Spec.Etcd.BootstrapWithExistingCluster != nil && dst.Status.BootstrapWithExistingCluster == nil:
		return StageEtcdMigrationComplete, "the destination joined; druid has not recorded the join yet (condition BootstrappedWithExistingCluster)"
	case dst.Spec.Etcd.BootstrapWithExistingCluster != nil:
		return StageEtcdMigrationComplete, "the destination joined and druid recorded it; spec.etcd.bootstrapWithExistingCluster is still set, so the source's members are kept"
	case !EtcdMigrationCompleted(dst):
		v, all := localVoters(dst)
		return StageEtcdMigrationComplete, fmt.Sprintf("the source's members are being retired: %d of the destination's %d members vote, %d members in all", v, all, len(observed(dst)))
	case src != nil && src.Spec.Replicas > 0:
		return StageSourceSeedCleanup, "the source's members are retired; the source still has replicas"
	}
	return "", "the destination holds the cluster; the source has no replicas"
}
