package sidecar_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestRetirementRecords writes, lists and deletes retirement records through
// two members' sidecars on a real cluster, and reads the keys back from etcd
// itself: a record by one holder is neither overwritten nor deleted by
// another, and the lock guards every write whose caller names itself.
func TestRetirementRecords(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, 3, clusterOptions{})
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	a, b := tc.client(tc.Members[0]), tc.client(tc.Members[1])

	list, err := a.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(list.Retired).To(BeEmpty())
	g.Expect(list.Retired).NotTo(BeNil(), "an empty list is [] on the wire, not null")

	// Without the lock header nothing is checked (an operator with curl).
	res, err := a.Retire(ctx, "seed-a-etcd-0", "seed-b", sidecar.CallOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Changed).To(BeTrue())
	res, err = b.Retire(ctx, "seed-a-etcd-0", "seed-b", sidecar.CallOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Changed).To(BeFalse(), "a repeat through another sidecar changes nothing")

	_, err = b.Retire(ctx, "seed-a-etcd-0", "seed-a", sidecar.CallOptions{})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonRetiredByOther)).To(BeTrue(), "got %v", err)
	g.Expect(rawKeys(g, tc.Members[2])).To(Equal(map[string]string{"/druid-stretch/retired/seed-a-etcd-0": "seed-b"}))

	// A holder that names itself must hold the lock.
	_, err = a.Retire(ctx, "seed-a-etcd-1", "seed-b", sidecar.CallOptions{LockHolder: "seed-b"})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonLockNotHeld)).To(BeTrue(), "got %v", err)
	_, err = a.AcquireLock(ctx, "seed-a", "", 30*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = a.Retire(ctx, "seed-a-etcd-1", "seed-b", sidecar.CallOptions{LockHolder: "seed-b"})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonLockHeld)).To(BeTrue(), "got %v", err)
	_, err = a.Unretire(ctx, "seed-a-etcd-0", sidecar.CallOptions{LockHolder: "seed-a"})
	g.Expect(sidecar.IsReason(err, sidecar.ReasonRetiredByOther)).To(BeTrue(), "seed-a may not delete seed-b's record: %v", err)
	g.Expect(a.ReleaseLock(ctx, "seed-a", "")).To(Succeed())
	_, err = a.AcquireLock(ctx, "seed-b", "", 30*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = a.Retire(ctx, "seed-a-etcd-1", "seed-b", sidecar.CallOptions{LockHolder: "seed-b"})
	g.Expect(err).NotTo(HaveOccurred())

	list, err = b.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(list.Retired).To(Equal([]sidecar.RetiredMember{{Name: "seed-a-etcd-0", By: "seed-b"}, {Name: "seed-a-etcd-1", By: "seed-b"}}))
	g.Expect(list.Members).To(HaveLen(3), "records change no membership")

	res, err = b.Unretire(ctx, "seed-a-etcd-0", sidecar.CallOptions{LockHolder: "seed-b"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Changed).To(BeTrue())
	g.Expect(res.Retired.By).To(Equal("seed-b"))
	res, err = b.Unretire(ctx, "seed-a-etcd-0", sidecar.CallOptions{LockHolder: "seed-b"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Changed).To(BeFalse(), "deleting a missing record is a no-op")
	g.Expect(rawKeys(g, tc.Members[0])).To(Equal(map[string]string{"/druid-stretch/retired/seed-a-etcd-1": "seed-b"}))
}

// TestRetirementRecordsRefuseBadInput shows that bad names, bodies and
// missing client certificates change nothing.
func TestRetirementRecordsRefuseBadInput(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, 1, clusterOptions{})
	g := NewWithT(t)
	m := tc.Members[0]
	base := m.SidecarURL + "/v1/retired/"
	for _, c := range []struct {
		name, method, url, body string
		withCert                bool
		code                    int
		reason                  string
	}{
		{"no client certificate", http.MethodPut, base + "x", `{"by":"h"}`, false, http.StatusUnauthorized, sidecar.ReasonUnauthorized},
		{"bad member name", http.MethodPut, base + "a%20b", `{"by":"h"}`, true, http.StatusBadRequest, sidecar.ReasonInvalidName},
		{"empty holder", http.MethodPut, base + "x", `{"by":""}`, true, http.StatusBadRequest, sidecar.ReasonInvalidName},
		{"unknown field", http.MethodPut, base + "x", `{"by":"h","owner":"h"}`, true, http.StatusBadRequest, sidecar.ReasonMalformedRequest},
		{"no body", http.MethodPut, base + "x", ``, true, http.StatusBadRequest, sidecar.ReasonMalformedRequest},
		{"delete without certificate", http.MethodDelete, base + "x", ``, false, http.StatusUnauthorized, sidecar.ReasonUnauthorized},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			code, reason, err := rawCall(tc.httpClient(m, c.withCert), c.method, c.url, c.body, nil)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(code).To(Equal(c.code))
			g.Expect(reason).To(Equal(c.reason))
		})
	}
	g.Expect(rawKeys(g, m)).To(BeEmpty())
}

// rawKeys reads the retirement keys straight from etcd.
func rawKeys(g Gomega, via *localetcd.Member) map[string]string {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{via.LocalClientURL}, TLS: via.ClientTLSConfig(), DialTimeout: 5 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, "/druid-stretch/retired/", clientv3.WithPrefix())
	g.Expect(err).NotTo(HaveOccurred())
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}
