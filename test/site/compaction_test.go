package site

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A snapshot kind backup-restore does not serve is refused before any
// pod is asked, with the kind named.
func TestTriggerSnapshotRefusesAnUnknownKind(t *testing.T) {
	g := NewWithT(t)
	before := time.Now()
	d := (&Site{}).TriggerSnapshot(context.Background(), client.ObjectKey{Namespace: MoveNamespace, Name: MoveEtcdName}, "incremental")
	g.Expect(d.Err).To(MatchError(ContainSubstring(`a snapshot of kind "incremental"`)))
	g.Expect(d.Pod).To(BeEmpty(), "no backup-restore took it")
	g.Expect(d.At).To(BeTemporally(">=", before))
}
