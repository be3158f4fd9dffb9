//go:build linux

package podnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/druid-stretch/druid-stretch/internal/testing/linkemu"
)

// transitBase is where the /30 of each peering's link comes from; the
// addresses exist only inside the two switch namespaces.
var (
	transitBase = netip.MustParseAddr("169.254.0.0")
	peerings    atomic.Uint32
)

// Peering connects two pod networks the way two Kubernetes clusters are
// connected: each one's pods reach the other's pod IPs, and each one's DNS
// answers the names the other publishes under its zone (SetZone), as a
// cluster resolves another cluster's external DNS names. In-cluster names
// (pod and Service names under the cluster domain) stay each network's own.
//
// The link between the two switch namespaces is a TUN device in each,
// joined by a linkemu.PacketLine in this process: every packet between the
// sites crosses it, so SetDelay puts a round trip between them for every
// protocol, as the distance between two regions does (the kernels here have
// no netem).
type Peering struct {
	a, b   *Network
	line   *linkemu.PacketLine
	closed atomic.Bool
}

// Peer connects a and b, with no delay between them. Their pod CIDRs must
// not overlap. Close the Peering before either network.
func Peer(a, b *Network) (*Peering, error) {
	if a.prefix.Overlaps(b.prefix) {
		return nil, fmt.Errorf("podnet: cannot peer %s with %s: the pod networks overlap", a.prefix, b.prefix)
	}
	n := peerings.Add(1)
	if n >= 1<<14 {
		return nil, errors.New("podnet: out of transit addresses for peerings")
	}
	base := transitBase.As4()
	off := n * 4
	base[2], base[3] = byte(off>>8), byte(off)
	aIP := netip.AddrFrom4(base).Next()
	bIP := aIP.Next()
	aLink, bLink := fmt.Sprintf("peer%da", n), fmt.Sprintf("peer%db", n)

	aDev, err := a.openTUN(aLink)
	if err != nil {
		return nil, fmt.Errorf("podnet: peering link: %w", err)
	}
	bDev, err := b.openTUN(bLink)
	if err != nil {
		_ = aDev.Close()
		return nil, fmt.Errorf("podnet: peering link: %w", err)
	}
	p := &Peering{a: a, b: b, line: linkemu.NewPacketLine(aDev, bDev)}
	for _, side := range []struct {
		n          *Network
		link       string
		local, via netip.Addr
		remote     netip.Prefix
	}{{a, aLink, aIP, bIP, b.prefix}, {b, bLink, bIP, aIP, a.prefix}} {
		if err := side.n.route(side.link, side.local, side.via, side.remote); err != nil {
			_ = p.Close()
			return nil, fmt.Errorf("podnet: peering %s with %s: %w", a.prefix, b.prefix, err)
		}
	}
	a.hosts.addPeer(b.hosts)
	b.hosts.addPeer(a.hosts)
	return p, nil
}

// openTUN creates the TUN device name in the switch namespace. The device
// lives as long as the returned file: closing it removes the device and its
// routes.
func (n *Network) openTUN(name string) (*os.File, error) {
	ns, err := n.switchNetns()
	if err != nil {
		return nil, err
	}
	defer func() { _ = ns.Close() }()
	var dev *os.File
	// A TUN device belongs to the network namespace of the thread that
	// opens /dev/net/tun.
	err = inNetns(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err == nil {
			// No packet information header: each read is one IP packet.
			ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err != nil {
			_ = unix.Close(fd)
			return fmt.Errorf("create TUN device %s: %w", name, err)
		}
		// Non-blocking, so the runtime's poller serves it and Close
		// returns a Read that waits.
		dev = os.NewFile(uintptr(fd), "tun:"+name)
		return nil
	})
	return dev, err
}

// SetDelay sets the one-way delay of every packet between the two
// networks: the round trip between their pods is twice it. It applies to
// packets sent after the call.
func (p *Peering) SetDelay(oneWay time.Duration) { p.line.SetDelay(oneWay) }

// Delay is the one-way delay between the two networks.
func (p *Peering) Delay() time.Duration { return p.line.Delay() }

// Partition cuts the link between the two networks until Heal: every
// packet between their pods is dropped, as when the connection between
// two regions goes down. Names stay resolvable: DNS is each network's own.
func (p *Peering) Partition() { p.line.Partition() }

// Heal ends a Partition.
func (p *Peering) Heal() { p.line.Heal() }

// Dropped counts the packets Partition dropped, both ways together.
func (p *Peering) Dropped() int64 {
	aToB, bToA := p.line.Stats()
	return aToB.Dropped + bToA.Dropped
}

// route gives link the transit address local, routes remote through via,
// and turns on forwarding in the switch namespace.
func (n *Network) route(link string, local, via netip.Addr, remote netip.Prefix) error {
	l, err := n.links.LinkByName(link)
	if err != nil {
		return fmt.Errorf("find %s: %w", link, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: local.AsSlice(), Mask: net.CIDRMask(30, 32)}}
	if err := n.links.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", local, link, err)
	}
	if err := n.links.LinkSetUp(l); err != nil {
		return fmt.Errorf("%s up: %w", link, err)
	}
	dst := &net.IPNet{IP: remote.Addr().AsSlice(), Mask: net.CIDRMask(remote.Bits(), 32)}
	if err := n.links.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Gw: via.AsSlice()}); err != nil {
		return fmt.Errorf("route %s via %s: %w", remote, via, err)
	}
	ns, err := n.switchNetns()
	if err != nil {
		return err
	}
	defer func() { _ = ns.Close() }()
	// net.ipv4.ip_forward is per network namespace; /proc/sys/net shows
	// the namespace of the thread that opens it.
	return inNetns(ns, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
}

// Close removes the link (its TUN devices, and with them the routes) and
// the shared names. Closing twice does nothing.
func (p *Peering) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	p.a.hosts.removePeer(p.b.hosts)
	p.b.hosts.removePeer(p.a.hosts)
	if err := p.line.Close(); err != nil {
		return fmt.Errorf("podnet: closing the peering: %w", err)
	}
	return nil
}

// SetZone names the DNS zone this network publishes to its peers (for
// example "site-a.test"): a peer's DNS answers the names of this network's
// table under the zone, and nothing else of it. Empty publishes nothing.
func (n *Network) SetZone(zone string) {
	n.hosts.mu.Lock()
	defer n.hosts.mu.Unlock()
	n.hosts.zone = ""
	if zone != "" {
		n.hosts.zone = dns.CanonicalName(zone)
	}
}

// published looks name up in t if it lies in t's zone.
func (t *hostTable) published(name string) ([]net.IP, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.zone == "" || !strings.HasSuffix(name, "."+t.zone) {
		return nil, false
	}
	ips, ok := t.hosts[name]
	return ips, ok
}

func (t *hostTable) addPeer(p *hostTable) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.peers = append(slices.Clip(t.peers), p)
}

func (t *hostTable) removePeer(p *hostTable) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// A new slice: lookup reads the old one without the lock.
	var kept []*hostTable
	for _, q := range t.peers {
		if q != p {
			kept = append(kept, q)
		}
	}
	t.peers = kept
}
