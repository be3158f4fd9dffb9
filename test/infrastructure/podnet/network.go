//go:build linux

package podnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DefaultCIDR is the pod network when Options.CIDR is empty.
const DefaultCIDR = "10.244.0.0/16"

// bridgeName is the bridge in the switch namespace; the namespace is ours
// alone, so the name cannot clash.
const bridgeName = "br0"

// Options configure a Network.
type Options struct {
	// CIDR is the pod network, an IPv4 prefix of at most /30 (DefaultCIDR if
	// empty). Its first address is the gateway and DNS server; pod IPs are
	// allocated from the following ones.
	CIDR string
}

// Network is a pod network: a switch namespace with a bridge and a DNS
// server, and one namespace per pod. It is safe for concurrent use.
type Network struct {
	prefix  netip.Prefix
	gateway netip.Addr

	switchNs netns.NsHandle
	links    *netlink.Handle // rtnetlink socket inside the switch namespace
	bridge   int             // bridge interface index in the switch namespace
	dns      *dnsServer
	hosts    *hostTable

	mu       sync.Mutex
	closed   bool
	reserved map[string]netip.Addr // key → IP, kept across RemovePod
	next     netip.Addr            // next never-allocated IP
	pods     map[string]*podState
	fromHost map[*Forwarder]struct{}
}

// Pod is the network of one pod.
type Pod struct {
	// Key names the pod in the Network (for example namespace/name).
	Key string
	// IP is the pod's address on eth0.
	IP net.IP
	// NetnsPath is /proc/<this process>/fd/<n>, the descriptor that holds
	// the pod's network namespace. A child process can open it and
	// setns(CLONE_NEWNET) into it, as nsenter --net=<NetnsPath> does. It is
	// valid until RemovePod: afterwards the descriptor number may be reused
	// for another file. Pod.Do is the way for this process itself.
	NetnsPath string

	n *Network
}

// podState is what RemovePod tears down.
type podState struct {
	pod        *Pod
	ns         netns.NsHandle
	veth       string // the bridge-side end, in the switch namespace
	forwarders []*Forwarder
}

// New creates the switch namespace with its bridge and starts the DNS server.
func New(opts Options) (*Network, error) {
	cidr := opts.CIDR
	if cidr == "" {
		cidr = DefaultCIDR
	}
	prefix, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("podnet: CIDR %q: %w", cidr, err)
	}
	if !prefix.Addr().Is4() || prefix.Bits() > 30 {
		return nil, fmt.Errorf("podnet: CIDR %q: need an IPv4 prefix of at most /30", cidr)
	}
	prefix = prefix.Masked()
	gateway := prefix.Addr().Next()
	n := &Network{
		prefix:   prefix,
		gateway:  gateway,
		switchNs: netns.None(),
		hosts:    newHostTable(),
		reserved: map[string]netip.Addr{},
		next:     gateway.Next(),
		pods:     map[string]*podState{},
		fromHost: map[*Forwarder]struct{}{},
	}
	if err := n.setUpSwitch(); err != nil {
		_ = n.Close()
		return nil, fmt.Errorf("podnet: %w", err)
	}
	return n, nil
}

func (n *Network) setUpSwitch() error {
	var err error
	if n.switchNs, err = newNetns(); err != nil {
		return err
	}
	err = inNetns(n.switchNs, func() error {
		var err error
		n.links, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return fmt.Errorf("netlink in switch namespace: %w", err)
	}
	if err := setUp(n.links, "lo"); err != nil {
		return err
	}
	// A fixed MAC: a bridge without one takes the lowest MAC of its ports,
	// which changes as pods come and go and would stale the pods' ARP entry
	// for the gateway.
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName, HardwareAddr: macFor(n.gateway)}}
	if err := n.links.LinkAdd(br); err != nil {
		return fmt.Errorf("add bridge: %w", err)
	}
	link, err := n.links.LinkByName(bridgeName)
	if err != nil {
		return fmt.Errorf("find bridge: %w", err)
	}
	n.bridge = link.Attrs().Index
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.gateway.AsSlice(), Mask: n.mask()}}
	if err := n.links.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("add gateway address to bridge: %w", err)
	}
	if err := n.links.LinkSetUp(link); err != nil {
		return fmt.Errorf("bridge up: %w", err)
	}
	n.dns, err = startDNS(n.switchNs, netip.AddrPortFrom(n.gateway, 53), n.hosts)
	return err
}

// AddPod creates the network of the pod key: its namespace with lo and eth0,
// eth0 holding the key's IP (the same as before if the key had a pod
// earlier) and a default route through the gateway.
func (n *Network) AddPod(key string) (*Pod, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errors.New("podnet: network closed")
	}
	if _, ok := n.pods[key]; ok {
		return nil, fmt.Errorf("podnet: pod %q exists", key)
	}
	ip, err := n.reserve(key)
	if err != nil {
		return nil, err
	}
	st, err := n.createPod(key, ip)
	if err != nil {
		return nil, fmt.Errorf("podnet: add pod %q: %w", key, err)
	}
	n.pods[key] = st
	return st.pod, nil
}

// reserve returns the IP of key, allocating one on the key's first use.
func (n *Network) reserve(key string) (netip.Addr, error) {
	if ip, ok := n.reserved[key]; ok {
		return ip, nil
	}
	ip := n.next
	// The last address of the prefix is its broadcast address.
	if !n.prefix.Contains(ip.Next()) {
		return netip.Addr{}, fmt.Errorf("podnet: no free IP in %s for pod %q", n.prefix, key)
	}
	n.next = ip.Next()
	n.reserved[key] = ip
	return ip, nil
}

func (n *Network) createPod(key string, ip netip.Addr) (st *podState, err error) {
	ns, err := newNetns()
	if err != nil {
		return nil, err
	}
	// The offset in the prefix names the veth uniquely for the key, in at
	// most 15 bytes.
	veth := fmt.Sprintf("veth%d", offset(n.prefix.Addr(), ip))
	defer func() {
		if err != nil {
			_ = n.links.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: veth}})
			_ = ns.Close()
		}
	}()
	pair := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: veth, MasterIndex: n.bridge},
		PeerName:         "eth0",
		PeerNamespace:    netlink.NsFd(ns),
		PeerHardwareAddr: macFor(ip),
	}
	if err := n.links.LinkAdd(pair); err != nil {
		return nil, fmt.Errorf("add veth pair: %w", err)
	}
	if err := setUp(n.links, veth); err != nil {
		return nil, err
	}
	err = inNetns(ns, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer h.Close()
		if err := setUp(h, "lo"); err != nil {
			return err
		}
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("find eth0: %w", err)
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: n.mask()}}
		if err := h.AddrAdd(eth0, addr); err != nil {
			return fmt.Errorf("add %s to eth0: %w", ip, err)
		}
		if err := h.LinkSetUp(eth0); err != nil {
			return fmt.Errorf("eth0 up: %w", err)
		}
		route := &netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: n.gateway.AsSlice()}
		if err := h.RouteAdd(route); err != nil {
			return fmt.Errorf("add default route: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	pod := &Pod{
		Key:       key,
		IP:        ip.AsSlice(),
		NetnsPath: fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(ns)),
		n:         n,
	}
	return &podState{pod: pod, ns: ns, veth: veth}, nil
}

// RemovePod tears down the network of pod key and ends its forwarders. The
// key keeps its IP for a later AddPod. Removing an unknown key does nothing.
// Processes still inside the namespace keep it alive, but without eth0.
func (n *Network) RemovePod(key string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.pods[key]
	if !ok {
		return nil
	}
	delete(n.pods, key)
	if err := n.destroyPod(st); err != nil {
		return fmt.Errorf("podnet: remove pod %q: %w", key, err)
	}
	return nil
}

func (n *Network) destroyPod(st *podState) error {
	for _, f := range st.forwarders {
		_ = f.Close()
	}
	// Delete the veth now rather than with the namespace: the kernel frees
	// a namespace asynchronously (or never, while a process is inside), and
	// an AddPod of the same key needs the name again.
	var errs []error
	if err := n.links.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: st.veth}}); err != nil {
		var linkErr netlink.LinkNotFoundError
		if !errors.As(err, &linkErr) && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete %s: %w", st.veth, err))
		}
	}
	if err := st.ns.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Do runs fn on an OS thread inside the pod's network namespace. Sockets fn
// creates stay in the pod's network, and so does a child process fn starts
// (exec.Cmd.Start forks from the calling thread). Goroutines fn starts do not
// run in the namespace. Do fails once the pod has been removed.
func (p *Pod) Do(fn func() error) error {
	ns, err := p.n.podNetns(p)
	if err != nil {
		return err
	}
	defer func() { _ = ns.Close() }()
	return inNetns(ns, fn)
}

// podNetns returns a handle of its own to the namespace of p, if p is still
// the pod of its key.
func (n *Network) podNetns(p *Pod) (netns.NsHandle, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.pods[p.Key]
	if !ok || st.pod != p {
		return netns.None(), fmt.Errorf("podnet: pod %q removed", p.Key)
	}
	return dupNetns(st.ns)
}

// switchNetns returns a handle of its own to the switch namespace.
func (n *Network) switchNetns() (netns.NsHandle, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return netns.None(), errors.New("podnet: network closed")
	}
	return dupNetns(n.switchNs)
}

// DNSServer is the address of the DNS server (port 53) for the pods'
// resolv.conf. It is the gateway, reachable from every pod.
func (n *Network) DNSServer() net.IP { return n.gateway.AsSlice() }

// Close ends the DNS server, all forwarders and all namespaces. Pods are
// removed; calling Close again does nothing.
func (n *Network) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	pods, fromHost := n.pods, n.fromHost
	n.pods, n.fromHost = map[string]*podState{}, map[*Forwarder]struct{}{}
	n.mu.Unlock()

	// With closed set and the maps emptied, nothing else uses the
	// namespaces any more.
	var errs []error
	if n.dns != nil {
		errs = append(errs, n.dns.Close())
	}
	for f := range fromHost {
		_ = f.Close()
	}
	for _, st := range pods {
		errs = append(errs, n.destroyPod(st))
	}
	if n.links != nil {
		n.links.Close()
	}
	if n.switchNs.IsOpen() {
		errs = append(errs, n.switchNs.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("podnet: close: %w", err)
	}
	return nil
}

func (n *Network) mask() net.IPMask { return net.CIDRMask(n.prefix.Bits(), 32) }

func setUp(h *netlink.Handle, name string) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("%s up: %w", name, err)
	}
	return nil
}

// macFor derives a locally administered unicast MAC from an IPv4 address
// (as OVN-Kubernetes does), so that an address always comes with one MAC.
func macFor(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}

// offset is ip's distance from base, both IPv4.
func offset(base, ip netip.Addr) uint32 {
	b, i := base.As4(), ip.As4()
	return (uint32(i[0])<<24 | uint32(i[1])<<16 | uint32(i[2])<<8 | uint32(i[3])) -
		(uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]))
}
