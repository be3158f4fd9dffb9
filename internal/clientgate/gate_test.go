package clientgate_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/clientgate"
)

// stalledBackend answers every gRPC call only once its release channel
// is closed, and reports each call as it arrives: it stands in for an
// etcd member whose answers are slow (a read index across a WAN link), so
// that a call is in flight at the gate for as long as the test wants.
type stalledBackend struct {
	arrived chan string
	release chan struct{}
}

func (b *stalledBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" { // the gate's probe: the member serves
		w.WriteHeader(http.StatusOK)
		return
	}
	b.arrived <- r.URL.Path
	<-b.release
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
	w.WriteHeader(http.StatusOK)
}

// startStalled runs a gate in front of a stalledBackend and returns the
// gate, its URL and the backend; everything ends with the test.
func startStalled(t *testing.T) (*clientgate.Gate, string, *stalledBackend) {
	t.Helper()
	b := &stalledBackend{arrived: make(chan string, 16), release: make(chan struct{})}
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	h2c.SetHTTP1(true) // as etcd: the gate probes /health over HTTP/1
	backend := &http.Server{Handler: b, Protocols: &h2c, ReadHeaderTimeout: 5 * time.Second}
	bl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = backend.Serve(bl) }()
	burl, err := url.Parse("http://" + bl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	gate, err := clientgate.New(clientgate.Options{Backend: burl})
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gate.Serve(gl) }()
	t.Cleanup(func() {
		select {
		case <-b.release:
		default:
			close(b.release)
		}
		_ = gate.Close()
		if err := <-served; err != nil {
			t.Errorf("gate: %v", err)
		}
		_ = backend.Close()
	})
	return gate, "http://" + gl.Addr().String(), b
}

// call sends one gRPC-framed call (an empty message) for method through
// the gate and reports its error, or nil once it was answered.
func call(gateURL, method string) <-chan error {
	done := make(chan error, 1)
	go func() {
		var h2c http.Protocols
		h2c.SetUnencryptedHTTP2(true)
		c := &http.Client{Transport: &http.Transport{Protocols: &h2c}, Timeout: 10 * time.Second}
		req, err := http.NewRequest(http.MethodPost, gateURL+method, strings.NewReader("\x00\x00\x00\x00\x00"))
		if err != nil {
			done <- err
			return
		}
		req.Header.Set("Content-Type", "application/grpc")
		resp, err := c.Do(req)
		if err == nil {
			err = resp.Body.Close()
		}
		done <- err
	}()
	return done
}

// returned reports whether done has delivered within a short wait.
func returned(done <-chan error, within time.Duration) bool {
	select {
	case err := <-done:
		return err == nil
	case <-time.After(within):
		return false
	}
}

// A hold waits for the proposals in flight, not for the reads: etcd
// drops the former at a leader transfer and answers the latter with a
// retryable "leader changed". New reads and proposals both wait out the
// hold.
func TestHoldWaitsForProposalsNotReads(t *testing.T) {
	g := NewWithT(t)
	gate, addr, backend := startStalled(t)

	read := call(addr, "/etcdserverpb.KV/Range")
	g.Eventually(backend.arrived).Should(Receive(Equal("/etcdserverpb.KV/Range")))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	release, err := gate.Hold(ctx, 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred(), "the hold returned with a read still in flight")
	g.Expect(gate.InFlight()).To(Equal(1), "the read is still in flight")

	// A read and a proposal sent during the hold wait at the gate.
	heldRead := call(addr, "/etcdserverpb.KV/Range")
	heldWrite := call(addr, "/etcdserverpb.KV/Txn")
	g.Consistently(backend.arrived).WithTimeout(300 * time.Millisecond).ShouldNot(Receive())
	release()
	g.Eventually(backend.arrived).Should(Receive())
	g.Eventually(backend.arrived).Should(Receive())
	close(backend.release)
	for _, done := range []<-chan error{read, heldRead, heldWrite} {
		g.Expect(returned(done, 5*time.Second)).To(BeTrue())
	}
}

// A hold returns only once the proposal in flight at its start has been
// answered: that proposal could be the one the old leader drops.
func TestHoldWaitsForAProposalInFlight(t *testing.T) {
	g := NewWithT(t)
	gate, addr, backend := startStalled(t)

	write := call(addr, "/etcdserverpb.KV/Txn")
	g.Eventually(backend.arrived).Should(Receive(Equal("/etcdserverpb.KV/Txn")))
	held := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		release, err := gate.Hold(ctx, 5*time.Second)
		if err == nil {
			release()
		}
		held <- err
	}()
	g.Consistently(held).WithTimeout(300*time.Millisecond).ShouldNot(Receive(), "the hold returned with a proposal in flight")
	close(backend.release)
	g.Eventually(held).WithTimeout(5 * time.Second).Should(Receive(BeNil()))
	g.Expect(returned(write, 5*time.Second)).To(BeTrue())
}

// A drain ends once its clients have closed their connections; one that
// keeps a connection it was told to leave, with no call on it, has it
// closed by the gate: the drain returns, and the connection is gone.
func TestDrainClosesAConnectionItsClientKeeps(t *testing.T) {
	g := NewWithT(t)
	gate, gateURL, backend := startStalled(t)
	close(backend.release) // every call is answered at once
	u, err := url.Parse(gateURL)
	g.Expect(err).NotTo(HaveOccurred())
	kept, err := net.Dial("tcp", u.Host) // connects, then sends nothing
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = kept.Close() }()
	// An answered call through the gate: the gate has accepted kept
	// before it (one listener, accepted in order).
	g.Expect(<-call(gateURL, "/etcdserverpb.Maintenance/Status")).To(Succeed())

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	g.Expect(gate.Drain(ctx)).To(Succeed())
	g.Expect(gate.Ready()).To(BeFalse())
	g.Expect(kept.SetReadDeadline(time.Now().Add(5 * time.Second))).To(Succeed())
	_, err = kept.Read(make([]byte, 1))
	g.Expect(err).To(MatchError(io.EOF), "the gate closed the connection its client kept")
}

// A drain returns only once the gate's listener is closed: a client that
// comes after it is refused, not served by a drained gate.
func TestDrainedGateTakesNoNewConnection(t *testing.T) {
	g := NewWithT(t)
	gate, gateURL, backend := startStalled(t)
	close(backend.release)
	u, err := url.Parse(gateURL)
	g.Expect(err).NotTo(HaveOccurred())
	// Served: the gate runs. The client's connection carries that one
	// call only, so the drain has nobody to wait for and returns at once.
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	c := &http.Client{Transport: &http.Transport{Protocols: &h2c, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := c.Post(gateURL+"/etcdserverpb.Maintenance/Status", "application/grpc", strings.NewReader("\x00\x00\x00\x00\x00"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.Body.Close()).To(Succeed())
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	g.Expect(gate.Drain(ctx)).To(Succeed())
	_, err = net.Dial("tcp", u.Host)
	g.Expect(err).To(MatchError(syscall.ECONNREFUSED))
}
