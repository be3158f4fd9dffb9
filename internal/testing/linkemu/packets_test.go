package linkemu

import (
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// chanDevice is a packet device of the test: what the line writes to it
// arrives on out, what the test sends on in the line reads, one datagram
// per call, as from a TUN device.
type chanDevice struct {
	in, out   chan []byte
	closed    chan struct{}
	closeOnce sync.Once
}

func newChanDevice() *chanDevice {
	return &chanDevice{in: make(chan []byte), out: make(chan []byte, 64), closed: make(chan struct{})}
}

func (d *chanDevice) Read(b []byte) (int, error) {
	select {
	case p := <-d.in:
		return copy(b, p), nil
	case <-d.closed:
		return 0, io.EOF
	}
}

func (d *chanDevice) Write(b []byte) (int, error) {
	select {
	case d.out <- append([]byte(nil), b...):
		return len(b), nil
	case <-d.closed:
		return 0, io.ErrClosedPipe
	}
}

func (d *chanDevice) Close() error {
	d.closeOnce.Do(func() { close(d.closed) })
	return nil
}

func TestPacketLineDelaysEachDatagramInOrder(t *testing.T) {
	g := NewWithT(t)
	a, b := newChanDevice(), newChanDevice()
	l := NewPacketLine(a, b)
	t.Cleanup(func() { _ = l.Close() })
	const delay = 60 * time.Millisecond
	l.SetDelay(delay)
	g.Expect(l.Delay()).To(Equal(delay))

	// Datagrams sent in a burst each arrive no earlier than their own
	// delay, in the order sent, unchanged.
	sent := map[string]time.Time{}
	for i := range 5 {
		msg := fmt.Sprintf("packet %d", i)
		sent[msg] = time.Now()
		a.in <- []byte(msg)
	}
	for i := range 5 {
		var got []byte
		g.Eventually(b.out).WithTimeout(5 * time.Second).Should(Receive(&got))
		msg := fmt.Sprintf("packet %d", i)
		g.Expect(string(got)).To(Equal(msg))
		g.Expect(time.Since(sent[msg])).To(BeNumerically(">=", delay), "the delay of %q", msg)
	}

	// The other direction too.
	start := time.Now()
	b.in <- []byte("reply")
	g.Eventually(a.out).WithTimeout(5 * time.Second).Should(Receive(Equal([]byte("reply"))))
	g.Expect(time.Since(start)).To(BeNumerically(">=", delay))

	aToB, bToA := l.Stats()
	g.Expect(aToB).To(Equal(PacketStats{Packets: 5, Bytes: 5 * int64(len("packet 0"))}))
	g.Expect(bToA).To(Equal(PacketStats{Packets: 1, Bytes: int64(len("reply"))}))
}

func TestPacketLineSetDelayAppliesToLaterDatagrams(t *testing.T) {
	g := NewWithT(t)
	a, b := newChanDevice(), newChanDevice()
	l := NewPacketLine(a, b)
	t.Cleanup(func() { _ = l.Close() })
	l.SetDelay(time.Hour)
	a.in <- []byte("held")
	g.Consistently(b.out).WithTimeout(100 * time.Millisecond).ShouldNot(Receive())
	// Lowering the delay does not overtake what is in flight: the line
	// keeps the order it read in.
	l.SetDelay(0)
	b.in <- []byte("fast")
	g.Eventually(a.out).WithTimeout(5 * time.Second).Should(Receive(Equal([]byte("fast"))))
	g.Expect(b.out).NotTo(Receive())
	l.SetDelay(-time.Second)
	g.Expect(l.Delay()).To(BeZero(), "a negative delay is none")
}

func TestPacketLineCloseEndsEverything(t *testing.T) {
	g := NewWithT(t)
	a, b := newChanDevice(), newChanDevice()
	l := NewPacketLine(a, b)
	l.SetDelay(time.Hour)
	a.in <- []byte("in flight")
	done := make(chan error, 1)
	go func() { done <- l.Close() }()
	g.Eventually(done).WithTimeout(5*time.Second).Should(Receive(BeNil()), "Close returns with a datagram held")
	g.Expect(a.closed).To(BeClosed())
	g.Expect(b.closed).To(BeClosed())
	g.Expect(b.out).NotTo(Receive(), "what was in flight is dropped")
	g.Expect(l.Close()).To(Succeed(), "closing twice")
}

func TestPacketLinePartitionDropsUntilHeal(t *testing.T) {
	g := NewWithT(t)
	a, b := newChanDevice(), newChanDevice()
	l := NewPacketLine(a, b)
	t.Cleanup(func() { _ = l.Close() })
	l.SetDelay(100 * time.Millisecond)

	// A datagram in flight when the line is cut is lost, as is one sent
	// either way while it is cut.
	a.in <- []byte("in flight")
	l.Partition()
	g.Expect(l.Partitioned()).To(BeTrue())
	b.in <- []byte("while cut")
	g.Eventually(func() [2]int64 {
		aToB, bToA := l.Stats()
		return [2]int64{aToB.Dropped, bToA.Dropped}
	}).WithTimeout(5 * time.Second).Should(Equal([2]int64{1, 1}))
	g.Expect(a.out).To(BeEmpty())
	g.Expect(b.out).To(BeEmpty())

	// Healed, the line carries again.
	l.Heal()
	g.Expect(l.Partitioned()).To(BeFalse())
	a.in <- []byte("after")
	g.Eventually(b.out).WithTimeout(5 * time.Second).Should(Receive(Equal([]byte("after"))))
	aToB, bToA := l.Stats()
	g.Expect(aToB.Packets).To(Equal(int64(1)))
	g.Expect(bToA.Packets).To(BeZero())
}
