package linkemu

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// WAN is a set of sites on one machine with a delay and a partition switch
// between each pair of sites. Processes are placed in sites with
// RegisterProcess, code of this process with Dialer; ports are placed in
// sites with Front. See the package doc for how a connection's source site
// is found (Linux only). It is safe for concurrent use.
type WAN struct {
	fab fabric

	mu     sync.Mutex
	local  string
	sites  map[int]string // registered pid -> site
	pairs  map[sitePair]*gate
	fronts map[*Link]struct{}
	// sources are the loopback addresses Dialer binds to, one per site:
	// a connection from one of them comes from its site, whatever
	// process opened it.
	sources map[string]string // source IP -> site
	closed  bool
}

// sitePair is an unordered pair of different sites: a < b.
type sitePair struct{ a, b string }

func pairOf(a, b string) sitePair {
	if b < a {
		a, b = b, a
	}
	return sitePair{a, b}
}

// NewWAN returns a WAN with no delays, no partitions and the local site "".
func NewWAN() *WAN {
	return &WAN{
		sites:   map[int]string{},
		pairs:   map[sitePair]*gate{},
		fronts:  map[*Link]struct{}{},
		sources: map[string]string{},
	}
}

// pair returns the gate between two different sites, creating it on first use.
func (w *WAN) pair(a, b string) *gate {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := pairOf(a, b)
	g, ok := w.pairs[p]
	if !ok {
		g = newGate(&w.fab)
		w.pairs[p] = g
	}
	return g
}

// SetDelay sets the one-way delay between sites a and b, both ways, for bytes
// read from now on, open connections included. Within one site there is never
// a delay, so SetDelay(a, a, d) does nothing.
func (w *WAN) SetDelay(a, b string, oneWay time.Duration) {
	if a == b {
		return
	}
	w.pair(a, b).setDelay(oneWay)
}

// Delay is the one-way delay between sites a and b (0 within one site).
func (w *WAN) Delay(a, b string) time.Duration {
	if a == b {
		return 0
	}
	return time.Duration(w.pair(a, b).delay.Load())
}

// Partition cuts every connection between sites a and b and holds new ones
// until Heal(a, b). A site cannot be cut from itself: Partition(a, a) does nothing.
func (w *WAN) Partition(a, b string) {
	if a == b {
		return
	}
	w.pair(a, b).partition()
}

// Heal ends a partition between sites a and b.
func (w *WAN) Heal(a, b string) {
	if a == b {
		return
	}
	w.pair(a, b).heal()
}

// Partitioned tells whether sites a and b are cut from each other.
func (w *WAN) Partitioned(a, b string) bool {
	return a != b && w.pair(a, b).isPartitioned()
}

// RegisterProcess places the process pid in site: connections it opens to a
// front from now on come from that site. Register a child right after it
// starts, before it can dial.
func (w *WAN) RegisterProcess(pid int, site string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sites[pid] = site
}

// UnregisterProcess forgets pid (call it when the process has exited: pids are reused).
func (w *WAN) UnregisterProcess(pid int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.sites, pid)
}

// SetLocalSite names the site of connections from this process, from
// unregistered processes and of connections whose source cannot be found.
func (w *WAN) SetLocalSite(site string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.local = site
}

// Dialer returns a dialer whose connections come from site: it binds to a
// loopback address of the site's own (127.77.<n>.1, one per site, handed out
// on first use), which every front of this WAN places in site. It is how
// code of this process (a controller, a sidecar) sits in a site, where
// RegisterProcess places child processes. The address needs no setup: Linux
// routes all of 127.0.0.0/8 to the loopback device. Fronts listen on
// 127.0.0.1, so the dialer reaches fronts and 127.0.0.1 ports alike.
func (w *WAN) Dialer(site string) *net.Dialer {
	w.mu.Lock()
	defer w.mu.Unlock()
	ip := ""
	for a, s := range w.sources {
		if s == site {
			ip = a
		}
	}
	if ip == "" {
		// 127.77.0.0/16: far from 127.0.0.1 and from the 127.0.0.53 of a
		// local resolver; one /24 per site, in the order sites ask.
		ip = fmt.Sprintf("127.77.%d.1", len(w.sources)+1)
		w.sources[ip] = site
	}
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
}

// sourceSite finds the site a connection to a front comes from.
func (w *WAN) sourceSite(c net.Conn) string {
	w.mu.Lock()
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if site, ok := w.sources[a.IP.String()]; ok {
			w.mu.Unlock()
			return site
		}
	}
	local := w.local
	pids := make([]int, 0, len(w.sites))
	for pid := range w.sites {
		pids = append(pids, pid)
	}
	w.mu.Unlock()
	pid, ok := dialerPid(c, pids)
	if !ok {
		return local
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if site, ok := w.sites[pid]; ok {
		return site
	}
	return local // unregistered during the lookup
}

// Front starts a Link located in site, in front of target. Each connection
// through it takes its delay and partition state from the pair (source site,
// site), following later SetDelay, Partition and Heal calls. The Link's own
// settings (SetDelay, Partition, ...) apply on top, to every source.
func (w *WAN) Front(site, target string) (*Link, error) {
	w.mu.Lock()
	closed := w.closed
	w.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("linkemu: front in site %q for %s: %w", site, target, errWANClosed)
	}
	l, err := listen(target, Options{}, &w.fab, func(c net.Conn) []*gate {
		src := w.sourceSite(c)
		if src == site {
			return nil
		}
		return []*gate{w.pair(src, site)}
	})
	if err != nil {
		return nil, fmt.Errorf("linkemu: front in site %q: %w", site, err)
	}
	l.onClose = func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.fronts, l)
	}
	w.mu.Lock()
	if w.closed { // closed while the front was starting
		w.mu.Unlock()
		_ = l.Close()
		return nil, fmt.Errorf("linkemu: front in site %q for %s: %w", site, target, errWANClosed)
	}
	w.fronts[l] = struct{}{}
	w.mu.Unlock()
	return l, nil
}

var errWANClosed = errors.New("WAN is closed")

// Close closes every front and refuses new ones.
func (w *WAN) Close() error {
	w.mu.Lock()
	w.closed = true
	fronts := make([]*Link, 0, len(w.fronts))
	for l := range w.fronts {
		fronts = append(fronts, l)
	}
	w.mu.Unlock()
	var errs []error
	for _, l := range fronts {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}
