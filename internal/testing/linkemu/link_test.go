package linkemu

import (
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func listenT(t *testing.T, target string, opts Options) *Link {
	t.Helper()
	l, err := Listen(target, opts)
	if err != nil {
		t.Fatalf("Listen(%q): %v", target, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func dialT(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestListenRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target string
		opts   Options
		want   string
	}{
		{"empty target", "", Options{}, `target ""`},
		{"target without port", "127.0.0.1", Options{}, `target "127.0.0.1"`},
		{"target with empty port", "127.0.0.1:", Options{}, `target "127.0.0.1:"`},
		{"negative delay", "127.0.0.1:1", Options{Delay: -time.Millisecond}, "delay -1ms"},
		{"negative bandwidth", "127.0.0.1:1", Options{BandwidthBytesPerSec: -5}, "bandwidth -5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			l, err := Listen(tc.target, tc.opts)
			g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
			g.Expect(l).To(BeNil())
		})
	}
}

func TestDelayAppliesToEachDirection(t *testing.T) {
	for _, delay := range []time.Duration{0, 40 * time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) {
			g := NewWithT(t)
			srv := startStamp(t, 64)
			l := listenT(t, srv.addr(), Options{Delay: delay})
			c := dialT(t, l.Addr())
			for range 3 {
				up, down, err := stampRoundTrip(c, 64)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(up).To(BeNumerically(">=", delay), "client to target")
				g.Expect(down).To(BeNumerically(">=", delay), "target to client")
			}
			// Counted after the write returns, which may be after the client read.
			g.Eventually(l.Stats).Should(And(
				HaveField("BytesToTarget", BeEquivalentTo(3*64)),
				HaveField("BytesFromTarget", BeEquivalentTo(3*64)),
			))
		})
	}
}

func TestSetDelayChangesOpenConnections(t *testing.T) {
	g := NewWithT(t)
	srv := startStamp(t, 64)
	l := listenT(t, srv.addr(), Options{})
	c := dialT(t, l.Addr())
	_, _, err := stampRoundTrip(c, 64)
	g.Expect(err).NotTo(HaveOccurred())

	l.SetDelay(60 * time.Millisecond)
	g.Expect(l.Delay()).To(Equal(60 * time.Millisecond))
	up, down, err := stampRoundTrip(c, 64)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(up).To(BeNumerically(">=", 60*time.Millisecond))
	g.Expect(down).To(BeNumerically(">=", 60*time.Millisecond))

	l.SetDelay(-time.Second)
	g.Expect(l.Delay()).To(BeZero(), "a negative delay counts as none")
}

func TestBandwidthCap(t *testing.T) {
	const size = 384 << 10
	const bps = 1 << 20 // so the transfer takes at least 375 ms
	for _, tc := range []struct {
		name       string
		toTarget   bool // else the target sends
		setLive    bool // SetBandwidth on the running link, else Options
		wantStatFn func(Stats) int64
	}{
		{"to target, set at start", true, false, func(s Stats) int64 { return s.BytesToTarget }},
		{"from target, set live", false, true, func(s Stats) int64 { return s.BytesFromTarget }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			received := make(chan time.Time, 1)
			var srv *testServer
			if tc.toTarget {
				srv = startServer(t, func(c net.Conn) {
					if n, _ := io.Copy(io.Discard, c); n == size {
						received <- time.Now()
					}
				})
			} else {
				srv = startServer(t, func(c net.Conn) {
					_, _ = c.Write(make([]byte, size))
				})
			}
			opts := Options{BandwidthBytesPerSec: bps}
			if tc.setLive {
				opts = Options{}
			}
			l := listenT(t, srv.addr(), opts)
			if tc.setLive {
				l.SetBandwidth(bps)
			}
			c := dialT(t, l.Addr())
			start := time.Now()
			if tc.toTarget {
				_, err := c.Write(make([]byte, size))
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(c.(*net.TCPConn).CloseWrite()).To(Succeed())
				g.Eventually(received, 10*time.Second).Should(Receive())
			} else {
				n, err := io.Copy(io.Discard, c)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(n).To(BeEquivalentTo(size))
			}
			elapsed := time.Since(start)
			t.Logf("%d KiB at %d KiB/s took %v", size>>10, bps>>10, elapsed)
			g.Expect(elapsed).To(BeNumerically(">=", time.Duration(size)*time.Second/bps*95/100))
			g.Eventually(func() int64 { return tc.wantStatFn(l.Stats()) }).Should(BeEquivalentTo(size))
		})
	}
}

func TestPartitionCutsHoldsAndHeals(t *testing.T) {
	g := NewWithT(t)
	srv := startEcho(t)
	l := listenT(t, srv.addr(), Options{})
	open := dialT(t, l.Addr())
	_, err := echoRoundTrip(open, "before", 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(srv.accepted.Load()).To(BeEquivalentTo(1))

	l.Partition()
	l.Partition() // twice changes nothing
	g.Expect(l.Partitioned()).To(BeTrue())

	// The open connection is cut.
	g.Expect(open.SetReadDeadline(time.Now().Add(5 * time.Second))).To(Succeed())
	_, err = open.Read(make([]byte, 1))
	g.Expect(err).To(HaveOccurred())
	g.Expect(isTimeout(err)).To(BeFalse(), "the open connection must be closed, not left hanging")

	// A new connection is accepted but gets no answer, and never reaches the target.
	waiting := dialT(t, l.Addr())
	_, err = echoRoundTrip(waiting, "held", 300*time.Millisecond)
	g.Expect(isTimeout(err)).To(BeTrue(), "want a timeout, got %v", err)
	gaveUp := dialT(t, l.Addr())
	_, err = gaveUp.Write([]byte("stale"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() int64 { return l.Stats().Held }).Should(BeEquivalentTo(2))
	_ = gaveUp.Close()
	g.Eventually(func() int64 { return l.Stats().Held }).Should(BeEquivalentTo(1), "a held client that gives up is dropped")
	g.Expect(srv.accepted.Load()).To(BeEquivalentTo(1))

	// Heal: the waiting client gets its answer, the one that gave up is not forwarded.
	l.Heal()
	g.Expect(l.Partitioned()).To(BeFalse())
	g.Expect(waiting.SetReadDeadline(time.Now().Add(5 * time.Second))).To(Succeed())
	buf := make([]byte, len("held"))
	_, err = io.ReadFull(waiting, buf)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(buf)).To(Equal("held"))
	fresh := dialT(t, l.Addr())
	_, err = echoRoundTrip(fresh, "after", 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(srv.accepted.Load()).To(BeEquivalentTo(3))
	g.Expect(l.Stats()).To(And(
		HaveField("Accepted", BeEquivalentTo(4)),
		HaveField("Held", BeEquivalentTo(0)),
	))
}

func TestDialErrorClosesClient(t *testing.T) {
	g := NewWithT(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	target := ln.Addr().String()
	_ = ln.Close() // nothing listens there now

	l := listenT(t, target, Options{})
	c := dialT(t, l.Addr())
	g.Expect(c.SetReadDeadline(time.Now().Add(5 * time.Second))).To(Succeed())
	_, err = c.Read(make([]byte, 1))
	g.Expect(err).To(HaveOccurred())
	g.Expect(isTimeout(err)).To(BeFalse())
	g.Expect(l.Stats().DialErrors).To(BeEquivalentTo(1))
}

// Not parallel: it counts the goroutines of the whole test binary.
func TestCloseEndsEveryConnectionAndGoroutine(t *testing.T) {
	g := NewWithT(t)
	srv := startEcho(t)
	base := runtime.NumGoroutine()

	busy := listenT(t, srv.addr(), Options{Delay: 50 * time.Millisecond, BandwidthBytesPerSec: 64 << 10})
	forwarding := dialT(t, busy.Addr())
	_, err := echoRoundTrip(forwarding, "x", 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = forwarding.Write(make([]byte, 256<<10)) // in flight when Close comes
	g.Expect(err).NotTo(HaveOccurred())

	cut := listenT(t, srv.addr(), Options{})
	cut.Partition()
	held := dialT(t, cut.Addr())
	g.Eventually(func() int64 { return cut.Stats().Held }).Should(BeEquivalentTo(1))

	g.Expect(busy.Close()).To(Succeed())
	g.Expect(cut.Close()).To(Succeed())
	g.Expect(busy.Close()).To(Succeed(), "a second Close does nothing")

	for _, c := range []net.Conn{forwarding, held} {
		g.Expect(c.SetReadDeadline(time.Now().Add(5 * time.Second))).To(Succeed())
		_, err := io.Copy(io.Discard, c)
		g.Expect(isTimeout(err)).To(BeFalse(), "the client must see its connection end")
	}
	_, err = net.Dial("tcp", busy.Addr())
	g.Expect(err).To(HaveOccurred(), "the listener is closed")
	g.Eventually(runtime.NumGoroutine, 5*time.Second).Should(BeNumerically("<=", base))
}
