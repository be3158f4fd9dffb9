package sidecar_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd/etcdtest"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestNoSpaceAlarmIsNamed: while etcd's NOSPACE alarm is raised (a
// member's backend over its quota, as a full disk leaves it), the lock that
// every change needs cannot be written; the sidecar says so by name, with a
// retry hint, and leaves the lock and the membership as they were. Once the
// alarm is disarmed the same call succeeds.
func TestNoSpaceAlarmIsNamed(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	tc := &testCluster{etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("etcd", 3)})}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	via := tc.Members[0]
	c := tc.client(via)

	disarm := tc.NoSpaceAlarm(g, via)
	before := tc.membership(g, via)
	token := lockToken(0)
	_, err := c.AcquireLock(ctx, "seed-b", token, time.Minute)
	var se *sidecar.Error
	g.Expect(errors.As(err, &se)).To(BeTrue(), "got %v", err)
	g.Expect(se.Reason).To(Equal(sidecar.ReasonNoSpace))
	g.Expect(se.StatusCode).To(Equal(http.StatusServiceUnavailable))
	g.Expect(se.RetryAfter).To(BeNumerically(">=", 5*time.Second))
	g.Expect(se.Message).To(ContainSubstring("NOSPACE alarm is raised"))
	g.Expect(se.Message).To(ContainSubstring("disarm"))
	list, err := c.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(list.Lock).To(BeNil(), "no lock was written")
	g.Expect(tc.membership(g, via)).To(Equal(before))

	disarm()
	lock, err := c.AcquireLock(ctx, "seed-b", token, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lock.Holder).To(Equal("seed-b"))
}
