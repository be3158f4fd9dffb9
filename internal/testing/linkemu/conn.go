package linkemu

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// maxHeldBytes bounds what a held client may send before the proxy stops
// reading it (the rest stays in the kernel's buffers, as on a real path).
const maxHeldBytes = 1 << 20

// proxyConn is one client connection and, once admitted, its connection to the target.
type proxyConn struct {
	link   *Link
	client net.Conn
	gates  []*gate // set once, before admission

	ctx    context.Context // done when the connection is aborted
	cancel context.CancelFunc
	once   sync.Once

	mu     sync.Mutex
	server net.Conn
	pipes  []*pipe
}

func newProxyConn(l *Link, client net.Conn) *proxyConn {
	ctx, cancel := context.WithCancel(context.Background())
	return &proxyConn{link: l, client: client, ctx: ctx, cancel: cancel}
}

// delay is the connection's current one-way delay, read per chunk so that
// SetDelay takes effect on open connections.
func (pc *proxyConn) delay() time.Duration {
	var d time.Duration
	for _, g := range pc.gates {
		d += time.Duration(g.delay.Load())
	}
	return d
}

// abort closes both sockets and wakes every goroutine of the connection.
// Calling it again does nothing.
func (pc *proxyConn) abort() {
	pc.once.Do(func() {
		pc.cancel()
		_ = pc.client.Close()
		pc.mu.Lock()
		server, pipes := pc.server, pc.pipes
		pc.mu.Unlock()
		if server != nil {
			_ = server.Close()
		}
		for _, p := range pipes {
			p.stop()
		}
	})
}

// setServer attaches the target connection, or closes it if the connection
// was aborted while dialling (abort reads server under the same lock).
func (pc *proxyConn) setServer(server net.Conn) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.ctx.Err() != nil {
		_ = server.Close()
		return false
	}
	pc.server = server
	return true
}

// admit waits until no gate of the connection is partitioned. While held,
// the client is read ahead: a client that gives up is noticed by its EOF and
// dropped, and what a waiting client sent is returned, to be forwarded first.
func (pc *proxyConn) admit() (pending []byte, ok bool) {
	var ahead *readAhead
	var finished <-chan struct{} // the read-ahead's end; nil (never ready) until one runs
	defer func() {
		if !ok && ahead != nil {
			pc.abort()
			<-ahead.done // the read-ahead goroutine ends with the socket
		}
	}()
	for {
		healed := admitOrWait(pc.link.fab, pc, pc.gates)
		if healed == nil {
			break
		}
		if ahead == nil {
			pc.link.held.Add(1)
			defer pc.link.held.Add(-1)
			ahead = startReadAhead(pc.client)
			finished = ahead.done
		}
		select {
		case <-healed:
		case <-finished:
			if ahead.err != nil {
				return nil, false // the client gave up or reset
			}
			finished = nil // buffer full: keep holding, without reading
		case <-pc.ctx.Done():
			return nil, false
		}
	}
	if ahead == nil {
		return nil, true
	}
	pending, err := ahead.stop()
	if err != nil {
		release(pc.link.fab, pc, pc.gates)
		return nil, false
	}
	return pending, true
}

// readAhead reads a held client in the background.
type readAhead struct {
	conn net.Conn
	buf  []byte
	err  error // set before done is closed; nil if it stopped because buf is full
	done chan struct{}
}

func startReadAhead(c net.Conn) *readAhead {
	ra := &readAhead{conn: c, done: make(chan struct{})}
	go func() {
		defer close(ra.done)
		chunk := make([]byte, 4096)
		for len(ra.buf) < maxHeldBytes {
			n, err := c.Read(chunk)
			ra.buf = append(ra.buf, chunk[:n]...)
			if err != nil {
				ra.err = err
				return
			}
		}
	}()
	return ra
}

// stop interrupts the read (a past deadline is the one portable way to wake
// a blocked Read without closing the socket) and returns what was read. The
// error is non-nil if the client had gone.
func (ra *readAhead) stop() ([]byte, error) {
	_ = ra.conn.SetReadDeadline(time.Unix(1, 0))
	<-ra.done
	if err := ra.conn.SetReadDeadline(time.Time{}); err != nil {
		return nil, err
	}
	if ra.err != nil && !errors.Is(ra.err, os.ErrDeadlineExceeded) {
		return nil, ra.err
	}
	return ra.buf, nil
}

// forward runs both directions until both have ended or one fails.
func (pc *proxyConn) forward(pending []byte) {
	l := pc.link
	up := newPipe(pc, pc.client, pc.server, &l.toTarget, &l.bytesToTarget)
	down := newPipe(pc, pc.server, pc.client, &l.fromTarget, &l.bytesFromTarget)
	pc.mu.Lock()
	if pc.ctx.Err() != nil {
		pc.mu.Unlock()
		return
	}
	pc.pipes = []*pipe{up, down}
	pc.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		up.run(pending)
	}()
	down.run(nil)
	wg.Wait()
}
