package linkemu

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// helperEnv turns the test binary into a dialer child process, standing in
// for an etcd member that dials a front from its own process.
const helperEnv = "LINKEMU_TEST_DIALER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		runDialer(os.Stdin, os.Stdout)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runDialer answers "ping ADDR TIMEOUT_MS" lines with "rtt NANOS",
// "timeout" or "error ...", one new connection per line.
func runDialer(in io.Reader, out io.Writer) {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var addr string
		var timeoutMs int
		if _, err := fmt.Sscanf(sc.Text(), "ping %s %d", &addr, &timeoutMs); err != nil {
			_, _ = fmt.Fprintf(out, "error bad command %q\n", sc.Text())
			continue
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			_, _ = fmt.Fprintf(out, "error %v\n", err)
			continue
		}
		rtt, err := echoRoundTrip(c, "ping", time.Duration(timeoutMs)*time.Millisecond)
		_ = c.Close()
		switch {
		case isTimeout(err):
			_, _ = fmt.Fprintln(out, "timeout")
		case err != nil:
			_, _ = fmt.Fprintf(out, "error %v\n", err)
		default:
			_, _ = fmt.Fprintf(out, "rtt %d\n", rtt.Nanoseconds())
		}
	}
}

type dialerProcess struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startDialerProcess(t *testing.T) *dialerProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start dialer process: %v", err)
	}
	t.Cleanup(func() {
		_ = in.Close() // the helper ends at EOF; Kill covers a stuck one
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return &dialerProcess{cmd: cmd, in: in, out: bufio.NewScanner(out)}
}

// ping has the child process dial addr and echo one message; a timeout
// means nothing came back in time.
func (d *dialerProcess) ping(addr string, timeout time.Duration) (time.Duration, error) {
	if _, err := fmt.Fprintf(d.in, "ping %s %d\n", addr, timeout.Milliseconds()); err != nil {
		return 0, err
	}
	if !d.out.Scan() {
		return 0, fmt.Errorf("dialer process ended: %v", d.out.Err())
	}
	line := d.out.Text()
	switch {
	case line == "timeout":
		return 0, errTimeout
	case strings.HasPrefix(line, "rtt "):
		ns, err := strconv.ParseInt(strings.TrimPrefix(line, "rtt "), 10, 64)
		return time.Duration(ns), err
	default:
		return 0, errors.New(line)
	}
}

var errTimeout = errors.New("no answer in time")

func newWANT(t *testing.T) *WAN {
	w := NewWAN()
	t.Cleanup(func() { _ = w.Close() })
	return w
}

func frontT(t *testing.T, w *WAN, site, target string) *Link {
	t.Helper()
	l, err := w.Front(site, target)
	if err != nil {
		t.Fatalf("Front(%q, %q): %v", site, target, err)
	}
	return l
}

// TestWANSourceSiteFromProcess is the point of the WAN: a front tells a
// registered child process from this process although both dial from
// 127.0.0.1. Partitions make the classification visible without upper
// bounds on time: a connection from the cut site gets no answer.
func TestWANSourceSiteFromProcess(t *testing.T) {
	const delay = 80 * time.Millisecond
	g := NewWithT(t)
	w := newWANT(t)
	w.SetLocalSite("a")
	w.SetDelay("a", "b", delay)
	front := frontT(t, w, "a", startEcho(t).addr())
	child := startDialerProcess(t)
	w.RegisterProcess(child.cmd.Process.Pid, "b")

	rtt, err := child.ping(front.Addr(), 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rtt).To(BeNumerically(">=", 2*delay), "the child in site b crosses a-b")

	w.Partition("a", "b")
	_, err = child.ping(front.Addr(), 300*time.Millisecond)
	g.Expect(err).To(MatchError(errTimeout), "the child is in site b, cut from a")
	inProcess := dialT(t, front.Addr())
	_, err = echoRoundTrip(inProcess, "local", 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred(), "this process is in the local site a, same as the front")

	// This process follows the local site.
	w.SetLocalSite("b")
	fromB := dialT(t, front.Addr())
	_, err = echoRoundTrip(fromB, "from b", 300*time.Millisecond)
	g.Expect(isTimeout(err)).To(BeTrue(), "want a timeout, got %v", err)
	w.Heal("a", "b")
	g.Expect(fromB.SetReadDeadline(time.Now().Add(5 * time.Second))).To(Succeed())
	buf := make([]byte, len("from b"))
	_, err = io.ReadFull(fromB, buf)
	g.Expect(err).NotTo(HaveOccurred(), "the held connection is forwarded at heal")
	rtt, err = echoRoundTrip(dialT(t, front.Addr()), "b again", 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rtt).To(BeNumerically(">=", 2*delay))

	// An unregistered process is in the local site too.
	w.UnregisterProcess(child.cmd.Process.Pid)
	w.SetLocalSite("a")
	w.Partition("a", "b")
	_, err = child.ping(front.Addr(), 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred(), "the unregistered child is in the local site a")
}

func TestWANDelayBetweenSites(t *testing.T) {
	g := NewWithT(t)
	w := newWANT(t)
	w.SetLocalSite("a")
	srv := startStamp(t, 64)
	toB := frontT(t, w, "b", srv.addr())
	toA := frontT(t, w, "a", srv.addr())

	w.SetDelay("a", "b", 50*time.Millisecond)
	w.SetDelay("a", "a", time.Second)
	g.Expect(w.Delay("a", "a")).To(BeZero(), "no delay within a site")
	g.Expect(w.Delay("b", "a")).To(Equal(50*time.Millisecond), "delays are symmetric")

	c := dialT(t, toB.Addr())
	up, down, err := stampRoundTrip(c, 64)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(up).To(BeNumerically(">=", 50*time.Millisecond))
	g.Expect(down).To(BeNumerically(">=", 50*time.Millisecond))

	// Live, on the open connection, set from the other end of the pair;
	// the front's own delay adds on top.
	w.SetDelay("b", "a", 70*time.Millisecond)
	toB.SetDelay(20 * time.Millisecond)
	up, down, err = stampRoundTrip(c, 64)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(up).To(BeNumerically(">=", 90*time.Millisecond))
	g.Expect(down).To(BeNumerically(">=", 90*time.Millisecond))

	// Within site a the pair is never crossed: a partition of a-b leaves it alone.
	w.Partition("a", "b")
	g.Expect(w.Partitioned("b", "a")).To(BeTrue())
	_, _, err = stampRoundTrip(dialT(t, toA.Addr()), 64)
	g.Expect(err).NotTo(HaveOccurred())
}

func TestWANPartitionCutsOnlyItsPair(t *testing.T) {
	g := NewWithT(t)
	w := newWANT(t)
	w.SetLocalSite("a")
	srv := startEcho(t)
	inB := frontT(t, w, "b", srv.addr())
	inC := frontT(t, w, "c", srv.addr())
	toB, toC := dialT(t, inB.Addr()), dialT(t, inC.Addr())
	for _, c := range []net.Conn{toB, toC} {
		_, err := echoRoundTrip(c, "hi", 5*time.Second)
		g.Expect(err).NotTo(HaveOccurred())
	}

	w.Partition("b", "a")
	g.Expect(toB.SetReadDeadline(time.Now().Add(5 * time.Second))).To(Succeed())
	_, err := toB.Read(make([]byte, 1))
	g.Expect(isTimeout(err)).To(BeFalse(), "a-b is cut, got %v", err)
	_, err = echoRoundTrip(toC, "still", 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred(), "a-c is not cut")
	g.Expect(inB.Partitioned()).To(BeFalse(), "the front itself is not partitioned, its pair is")

	w.Heal("a", "b")
	_, err = echoRoundTrip(dialT(t, inB.Addr()), "back", 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
}

func TestWANCloseClosesFronts(t *testing.T) {
	g := NewWithT(t)
	w := NewWAN()
	srv := startEcho(t)
	f1 := frontT(t, w, "a", srv.addr())
	f2 := frontT(t, w, "b", srv.addr())
	g.Expect(f2.Close()).To(Succeed(), "a front may be closed on its own")
	g.Expect(w.Close()).To(Succeed())
	for _, f := range []*Link{f1, f2} {
		_, err := net.Dial("tcp", f.Addr())
		g.Expect(err).To(HaveOccurred())
	}
	_, err := w.Front("a", srv.addr())
	g.Expect(err).To(MatchError(ContainSubstring("WAN is closed")))
	_, err = NewWAN().Front("a", "no-port")
	g.Expect(err).To(MatchError(ContainSubstring(`target "no-port"`)))
}

// TestWANDialerPlacesThisProcessInASite: two dialers of this one process,
// each placed in a site with Dialer, are told apart by a front (a partition
// of their pairs shows which site each came from), and the site's source
// address stays the same for later dialers of the site.
func TestWANDialerPlacesThisProcessInASite(t *testing.T) {
	g := NewWithT(t)
	w := newWANT(t)
	srv := startEcho(t)
	inB := frontT(t, w, "b", srv.addr())

	fromA, fromB, fromC := w.Dialer("a"), w.Dialer("b"), w.Dialer("c")
	g.Expect(w.Dialer("a").LocalAddr).To(Equal(fromA.LocalAddr), "one source address per site")
	g.Expect(fromA.LocalAddr).NotTo(Equal(fromC.LocalAddr))

	dial := func(d *net.Dialer) net.Conn {
		c, err := d.Dial("tcp", inB.Addr())
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	w.Partition("a", "b")
	_, err := echoRoundTrip(dial(fromA), "cut", 300*time.Millisecond)
	g.Expect(isTimeout(err)).To(BeTrue(), "a dialer placed in a crosses the cut a-b, got %v", err)
	_, err = echoRoundTrip(dial(fromB), "inside b", 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred(), "a dialer placed in b crosses nothing")
	_, err = echoRoundTrip(dial(fromC), "c-b is not cut", 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred())

	w.Heal("a", "b")
	_, err = echoRoundTrip(dial(fromA), "healed", 5*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
}
