package membership

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	. "github.com/onsi/gomega"
)

// A removal waits for the member's clients to be drained only when its
// sidecar answers: a sidecar without a gate, or one that cannot be reached
// (the member's pod is gone), must not keep a member in the cluster.
func TestDrainBeforeRemoval(t *testing.T) {
	g := NewWithT(t)
	c, err := New(Config{Holder: "test"})
	g.Expect(err).NotTo(HaveOccurred())
	answer := func(code int, body string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_, _ = w.Write([]byte(body))
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	unreachable := "http://" + l.Addr().String()
	g.Expect(l.Close()).To(Succeed())

	for _, tc := range []struct {
		name, url string
		postponed bool
	}{
		{"drained", answer(http.StatusOK, `{"ready":false,"inFlight":0}`), false},
		{"no gate", answer(http.StatusNotFound, `{"reason":"NoClientGate","message":"no gate"}`), false},
		{"refused", answer(http.StatusServiceUnavailable, `{"reason":"EtcdUnavailable","message":"still in flight"}`), true},
		{"unreachable", unreachable, false},
	} {
		err := c.drainClients(context.Background(), []Endpoint{{Member: "m-1", URL: "http://127.0.0.1:1"}, {Member: "m-0", URL: tc.url}}, "m-0")
		if tc.postponed {
			g.Expect(err).To(MatchError(ContainSubstring("draining the clients of m-0")), tc.name)
		} else {
			g.Expect(err).NotTo(HaveOccurred(), tc.name)
		}
	}
}
