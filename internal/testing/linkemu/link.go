package linkemu

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Options are a Link's settings at start; each can be changed later.
type Options struct {
	// Delay is the one-way delay added in each direction (round trip: 2×Delay).
	Delay time.Duration
	// BandwidthBytesPerSec caps each direction; 0 means no cap.
	BandwidthBytesPerSec int64
}

// Stats are a Link's counters since Listen.
type Stats struct {
	Accepted        int64 // connections accepted
	Active          int64 // connections open now, held ones included
	Held            int64 // connections held by a partition now
	DialErrors      int64 // connections closed because the target could not be reached
	BytesToTarget   int64 // bytes delivered from clients to the target
	BytesFromTarget int64 // bytes delivered from the target to clients
}

// Link is a TCP proxy on 127.0.0.1 in front of one target, adding delay,
// a bandwidth cap and partitions. It is safe for concurrent use.
type Link struct {
	target string
	ln     net.Listener
	fab    *fabric
	own    *gate
	// route names the further gates a new connection crosses (a WAN's site
	// pair); nil for a lone Link.
	route   func(net.Conn) []*gate
	onClose func()

	toTarget, fromTarget pacer

	// Guarded by fab.mu.
	conns  map[*proxyConn]struct{}
	closed bool

	wg        sync.WaitGroup
	closeOnce sync.Once

	accepted, active, held, dialErrors atomic.Int64
	bytesToTarget, bytesFromTarget     atomic.Int64
}

// Listen starts a Link on a free 127.0.0.1 port in front of target
// (host:port). The target is dialled per connection, so it need not be up yet.
func Listen(target string, opts Options) (*Link, error) {
	return listen(target, opts, &fabric{}, nil)
}

func listen(target string, opts Options, fab *fabric, route func(net.Conn) []*gate) (*Link, error) {
	_, port, err := net.SplitHostPort(target)
	if err == nil && port == "" {
		err = errors.New("empty port")
	}
	if err != nil {
		return nil, fmt.Errorf("linkemu: target %q is not host:port: %w", target, err)
	}
	if opts.Delay < 0 {
		return nil, fmt.Errorf("linkemu: delay %v is negative", opts.Delay)
	}
	if opts.BandwidthBytesPerSec < 0 {
		return nil, fmt.Errorf("linkemu: bandwidth %d bytes/s is negative", opts.BandwidthBytesPerSec)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("linkemu: listen in front of %s: %w", target, err)
	}
	l := &Link{
		target: target,
		ln:     ln,
		fab:    fab,
		own:    newGate(fab),
		route:  route,
		conns:  map[*proxyConn]struct{}{},
	}
	l.own.setDelay(opts.Delay)
	l.SetBandwidth(opts.BandwidthBytesPerSec)
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Addr is the proxy's address (host:port) that clients dial instead of the target.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Target is the address the Link forwards to.
func (l *Link) Target() string { return l.target }

// SetDelay sets the one-way delay of each direction for bytes read from now
// on; a negative delay counts as 0. On a WAN front it adds to the site delay.
func (l *Link) SetDelay(d time.Duration) { l.own.setDelay(d) }

// Delay is the one-way delay set on the Link (without any WAN site delay).
func (l *Link) Delay() time.Duration { return time.Duration(l.own.delay.Load()) }

// SetBandwidth caps each direction at bps bytes per second; 0 or less removes the cap.
func (l *Link) SetBandwidth(bps int64) {
	l.toTarget.bps.Store(max(bps, 0))
	l.fromTarget.bps.Store(max(bps, 0))
}

// Partition cuts every connection through the Link and holds new ones
// silently (accepted, nothing forwarded, nothing answered) until Heal.
func (l *Link) Partition() { l.own.partition() }

// Heal ends a partition: held connections whose clients still wait are
// forwarded, and new ones pass again.
func (l *Link) Heal() { l.own.heal() }

// Partitioned tells whether the Link itself is partitioned (a WAN front may
// also be cut by its site pair, which this does not report).
func (l *Link) Partitioned() bool { return l.own.isPartitioned() }

// Stats returns the Link's counters.
func (l *Link) Stats() Stats {
	return Stats{
		Accepted:        l.accepted.Load(),
		Active:          l.active.Load(),
		Held:            l.held.Load(),
		DialErrors:      l.dialErrors.Load(),
		BytesToTarget:   l.bytesToTarget.Load(),
		BytesFromTarget: l.bytesFromTarget.Load(),
	}
}

// Close stops the listener, closes every connection and returns once all of
// the Link's goroutines have ended. Later calls do nothing.
func (l *Link) Close() error {
	var err error
	l.closeOnce.Do(func() {
		err = l.ln.Close()
		l.fab.mu.Lock()
		l.closed = true
		open := make([]*proxyConn, 0, len(l.conns))
		for pc := range l.conns {
			open = append(open, pc)
		}
		l.fab.mu.Unlock()
		for _, pc := range open {
			pc.abort()
		}
		l.wg.Wait()
		if l.onClose != nil {
			l.onClose()
		}
	})
	if err != nil {
		return fmt.Errorf("linkemu: close link %s -> %s: %w", l.Addr(), l.target, err)
	}
	return nil
}

func (l *Link) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of file descriptors and the like: let it pass rather than spin.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		l.accepted.Add(1)
		pc := newProxyConn(l, c)
		l.fab.mu.Lock()
		if l.closed {
			l.fab.mu.Unlock()
			_ = c.Close()
			continue
		}
		l.conns[pc] = struct{}{}
		l.active.Add(1)
		l.wg.Add(1)
		l.fab.mu.Unlock()
		go l.serve(pc)
	}
}

// serve runs one connection from accept to close.
func (l *Link) serve(pc *proxyConn) {
	defer l.wg.Done()
	defer func() {
		pc.abort()
		l.fab.mu.Lock()
		delete(l.conns, pc)
		l.fab.mu.Unlock()
		l.active.Add(-1)
	}()

	// Classify before admission: a WAN route reads /proc, which must not
	// stall the accept loop.
	pc.gates = []*gate{l.own}
	if l.route != nil {
		pc.gates = append(pc.gates, l.route(pc.client)...)
	}
	pending, ok := pc.admit()
	if !ok {
		return
	}
	defer release(l.fab, pc, pc.gates)

	var d net.Dialer
	server, err := d.DialContext(pc.ctx, "tcp", l.target)
	if err != nil {
		if pc.ctx.Err() == nil {
			l.dialErrors.Add(1)
		}
		return
	}
	if !pc.setServer(server) {
		return
	}
	pc.forward(pending)
}
