package linkemu

import (
	"sync"
	"sync/atomic"
	"time"
)

// fabric is the lock shared by every gate and link that can be cut together:
// a lone Link owns one, a WAN shares one among all its fronts and site pairs.
// One lock makes "partition, then cut exactly the connections that were
// admitted" a single step, with no connection slipping through in between.
type fabric struct{ mu sync.Mutex }

// gate is one thing a connection passes that can delay or cut it: the Link
// itself, and for a WAN front the pair of sites the connection crosses. A
// connection's delay is the sum of its gates' delays, and it is held while any
// of them is partitioned.
type gate struct {
	fab   *fabric
	delay atomic.Int64 // one-way, in nanoseconds; read per chunk, so lock-free

	// Guarded by fab.mu.
	partitioned bool
	healed      chan struct{}           // closed by heal; held connections wait on it
	conns       map[*proxyConn]struct{} // admitted connections, which partition cuts
}

func newGate(fab *fabric) *gate {
	return &gate{fab: fab, conns: map[*proxyConn]struct{}{}}
}

func (g *gate) setDelay(d time.Duration) { g.delay.Store(int64(max(d, 0))) }

func (g *gate) isPartitioned() bool {
	g.fab.mu.Lock()
	defer g.fab.mu.Unlock()
	return g.partitioned
}

// partition holds new connections and cuts the admitted ones. The cut happens
// after the lock is released: closing sockets can take a moment and must not
// stall other links sharing the fabric.
func (g *gate) partition() {
	g.fab.mu.Lock()
	if g.partitioned {
		g.fab.mu.Unlock()
		return
	}
	g.partitioned = true
	g.healed = make(chan struct{})
	cut := make([]*proxyConn, 0, len(g.conns))
	for pc := range g.conns {
		cut = append(cut, pc)
	}
	g.fab.mu.Unlock()
	for _, pc := range cut {
		pc.abort()
	}
}

func (g *gate) heal() {
	g.fab.mu.Lock()
	defer g.fab.mu.Unlock()
	if !g.partitioned {
		return
	}
	g.partitioned = false
	close(g.healed)
}

// admitOrWait admits pc into all its gates at once, or returns the heal
// channel of a gate that holds it. Check and admission are one step under the
// fabric lock, so a partition either sees pc admitted (and cuts it) or pc sees
// the partition (and waits).
func admitOrWait(fab *fabric, pc *proxyConn, gates []*gate) (wait <-chan struct{}) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	for _, g := range gates {
		if g.partitioned {
			return g.healed
		}
	}
	for _, g := range gates {
		g.conns[pc] = struct{}{}
	}
	return nil
}

func release(fab *fabric, pc *proxyConn, gates []*gate) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	for _, g := range gates {
		delete(g.conns, pc)
	}
}
