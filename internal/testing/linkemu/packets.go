package linkemu

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// packetQueue bounds the packets in flight per direction of a PacketLine. At
// 90 ms one way and 1500-byte packets it allows about 65 MB/s, far above what
// an etcd member sends; a reader that finds the queue full waits, and the
// device's own queue then drops, as a congested router does.
const packetQueue = 4096

// maxPacket is the largest datagram a PacketLine reads: a TUN device hands
// over one IP packet per read, at most 64 KiB.
const maxPacket = 1 << 16

// PacketLine joins two packet devices (the two ends of a routed link, for
// example TUN devices in two network namespaces) and carries every datagram
// one way after a fixed delay: each is stamped when it is read and written to
// the other end at stamp + delay, in the order it was read. Unlike a Link,
// which proxies TCP connections to one address, a PacketLine delays
// everything routed over it, TCP handshakes and UDP included, so the round
// trip between the two sides is twice the delay for every protocol.
type PacketLine struct {
	a, b    io.ReadWriteCloser
	delay   atomic.Int64
	done    chan struct{}
	wg      sync.WaitGroup
	stats   [2]packetStats // 0: a to b, 1: b to a
	closing sync.Once
	// cut drops every datagram, read or in flight, until Heal.
	cut atomic.Bool
}

type packetStats struct {
	packets, bytes, writeErrors, dropped atomic.Int64
}

// PacketStats counts what one direction of a PacketLine carried.
type PacketStats struct {
	Packets, Bytes int64
	// WriteErrors counts datagrams the receiving device refused (a device
	// that is down); they are dropped, as on a wire.
	WriteErrors int64
	// Dropped counts datagrams a partition (Partition) dropped.
	Dropped int64
}

type packet struct {
	due  time.Time
	data []byte
}

// NewPacketLine starts carrying datagrams between a and b with no delay.
// Each Read of a or b must return one whole datagram and each Write must
// take one, as TUN devices do. The line owns both: Close closes them.
func NewPacketLine(a, b io.ReadWriteCloser) *PacketLine {
	l := &PacketLine{a: a, b: b, done: make(chan struct{})}
	l.direction(a, b, &l.stats[0])
	l.direction(b, a, &l.stats[1])
	return l
}

// SetDelay sets the one-way delay of both directions; datagrams read after
// the call get it.
func (l *PacketLine) SetDelay(oneWay time.Duration) { l.delay.Store(int64(max(oneWay, 0))) }

// Delay is the one-way delay.
func (l *PacketLine) Delay() time.Duration { return time.Duration(l.delay.Load()) }

// Partition cuts the line: every datagram read from now on, and every one
// still in flight, is dropped until Heal, as a link that went down loses
// what it carried. Connections across it see silence, not a reset.
func (l *PacketLine) Partition() { l.cut.Store(true) }

// Heal ends a Partition; datagrams read after the call are carried again.
func (l *PacketLine) Heal() { l.cut.Store(false) }

// Partitioned tells whether the line is cut.
func (l *PacketLine) Partitioned() bool { return l.cut.Load() }

// Stats reports what went from a to b and from b to a.
func (l *PacketLine) Stats() (aToB, bToA PacketStats) {
	get := func(s *packetStats) PacketStats {
		return PacketStats{Packets: s.packets.Load(), Bytes: s.bytes.Load(), WriteErrors: s.writeErrors.Load(), Dropped: s.dropped.Load()}
	}
	return get(&l.stats[0]), get(&l.stats[1])
}

// Close stops the line, drops the datagrams in flight, closes both ends and
// waits for its goroutines. Closing twice does nothing.
func (l *PacketLine) Close() error {
	var err error
	l.closing.Do(func() {
		close(l.done)
		// Closing the ends is what returns a reader blocked in Read.
		err = errors.Join(l.a.Close(), l.b.Close())
		l.wg.Wait()
	})
	return err
}

func (l *PacketLine) direction(src, dst io.ReadWriter, st *packetStats) {
	q := make(chan packet, packetQueue)
	l.wg.Add(2)
	go func() {
		defer l.wg.Done()
		buf := make([]byte, maxPacket)
		for {
			n, err := src.Read(buf)
			if err != nil {
				return // closed
			}
			if l.cut.Load() {
				st.dropped.Add(1)
				continue
			}
			p := packet{due: time.Now().Add(l.Delay()), data: append([]byte(nil), buf[:n]...)}
			select {
			case q <- p:
			case <-l.done:
				return
			}
		}
	}()
	go func() {
		defer l.wg.Done()
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		for {
			var p packet
			select {
			case p = <-q:
			case <-l.done:
				return
			}
			if wait := time.Until(p.due); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-l.done:
					return
				}
			}
			if l.cut.Load() {
				st.dropped.Add(1)
				continue
			}
			if _, err := dst.Write(p.data); err != nil {
				st.writeErrors.Add(1)
				continue
			}
			st.packets.Add(1)
			st.bytes.Add(int64(len(p.data)))
		}
	}()
}
