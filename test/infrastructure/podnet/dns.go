//go:build linux

package podnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
)

// dnsTTL is short because names move between IPs as pods are recreated; the
// resolvers in pods (Go's, glibc's) do not cache anyway.
const dnsTTL = 5

// hostTable maps canonical names (lower case, trailing dot) to addresses.
// Names it does not hold are looked up in its peers' zones (peering.go).
type hostTable struct {
	mu    sync.RWMutex
	hosts map[string][]net.IP
	zone  string       // what this table publishes to peers, canonical; "" for nothing
	peers []*hostTable // peered networks' tables
}

func newHostTable() *hostTable { return &hostTable{hosts: map[string][]net.IP{}} }

func (t *hostTable) lookup(name string) ([]net.IP, bool) {
	name = dns.CanonicalName(name)
	t.mu.RLock()
	ips, ok := t.hosts[name]
	peers := t.peers
	t.mu.RUnlock()
	if ok {
		return ips, true
	}
	for _, p := range peers {
		if ips, ok := p.published(name); ok {
			return ips, true
		}
	}
	return nil, false
}

// SetHost replaces the addresses of the name fqdn in the DNS table (any case,
// with or without the trailing dot). IPv4 addresses answer A queries, IPv6
// ones AAAA queries. Without ips, the name is deleted.
func (n *Network) SetHost(fqdn string, ips ...net.IP) {
	if len(ips) == 0 {
		n.DeleteHost(fqdn)
		return
	}
	copied := make([]net.IP, len(ips))
	for i, ip := range ips {
		copied[i] = slices.Clone(ip)
	}
	n.hosts.mu.Lock()
	defer n.hosts.mu.Unlock()
	n.hosts.hosts[dns.CanonicalName(fqdn)] = copied
}

// DeleteHost removes the name fqdn from the DNS table; it then gets NXDOMAIN.
func (n *Network) DeleteHost(fqdn string) {
	n.hosts.mu.Lock()
	defer n.hosts.mu.Unlock()
	delete(n.hosts.hosts, dns.CanonicalName(fqdn))
}

// ServeDNS answers from the table. A known name answers NOERROR even with no
// record of the type asked (an AAAA query for an IPv4-only name), so that
// resolvers do not wait or move on; an unknown name answers NXDOMAIN, so that
// they try their next search suffix.
func (t *hostTable) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	// Go's resolver takes an empty NOERROR answer without these for a lame
	// referral.
	m.Authoritative = true
	m.RecursionAvailable = true
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		m.Rcode = dns.RcodeNotImplemented
		_ = w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	ips, ok := t.lookup(q.Name)
	if !ok {
		m.Rcode = dns.RcodeNameError
	}
	hdr := func(qtype uint16) dns.RR_Header {
		return dns.RR_Header{Name: q.Name, Rrtype: qtype, Class: dns.ClassINET, Ttl: dnsTTL}
	}
	for _, ip := range ips {
		switch ip4 := ip.To4(); {
		case ip4 != nil && (q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY):
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr(dns.TypeA), A: ip4})
		case ip4 == nil && (q.Qtype == dns.TypeAAAA || q.Qtype == dns.TypeANY):
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr(dns.TypeAAAA), AAAA: ip})
		}
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(size, int(opt.UDPSize()))
		}
		m.Truncate(size)
	}
	_ = w.WriteMsg(m)
}

// dnsServer is the table served over UDP and TCP.
type dnsServer struct {
	udp, tcp *dns.Server
}

// startDNS serves table at addr inside the namespace ns. The sockets are
// created in ns; the goroutines serving them run anywhere.
func startDNS(ns netns.NsHandle, addr netip.AddrPort, table *hostTable) (*dnsServer, error) {
	var pc net.PacketConn
	var ln net.Listener
	err := inNetns(ns, func() error {
		var err error
		if pc, err = net.ListenPacket("udp4", addr.String()); err != nil {
			return err
		}
		ln, err = net.Listen("tcp4", addr.String())
		return err
	})
	if err != nil {
		if pc != nil {
			_ = pc.Close()
		}
		return nil, fmt.Errorf("listen for DNS on %s: %w", addr, err)
	}
	s := &dnsServer{
		udp: &dns.Server{PacketConn: pc, Handler: table},
		tcp: &dns.Server{Listener: ln, Handler: table},
	}
	// Shutdown refuses a server that has not started yet: wait for both.
	started := make(chan struct{}, 2)
	failed := make(chan error, 2)
	for _, srv := range []*dns.Server{s.udp, s.tcp} {
		srv.NotifyStartedFunc = func() { started <- struct{}{} }
		go func() {
			if err := srv.ActivateAndServe(); err != nil {
				failed <- err
			}
		}()
	}
	for range 2 {
		select {
		case <-started:
		case err := <-failed:
			_ = pc.Close()
			_ = ln.Close()
			_ = s.Close()
			return nil, fmt.Errorf("serve DNS on %s: %w", addr, err)
		}
	}
	return s, nil
}

// Close stops both servers and waits for their goroutines.
func (s *dnsServer) Close() error {
	var errs []error
	for _, srv := range []*dns.Server{s.udp, s.tcp} {
		if err := srv.Shutdown(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
