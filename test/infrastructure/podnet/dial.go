//go:build linux

package podnet

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// DialContext dials addr inside the pod network from the switch namespace,
// for clients in this process: the connection is made and stays there, so
// the source is the gateway address. The host of addr is an IP literal or a
// name of the DNS table (as given to SetHost, no search suffixes); its
// addresses are tried in turn. network is "tcp", "tcp4", "udp" or "udp4".
//
// It fits http.Transport.DialContext, and grpc.WithContextDialer with
//
//	func(ctx context.Context, addr string) (net.Conn, error) {
//		return n.DialContext(ctx, "tcp", addr)
//	}
//
// (etcd clientv3: Config.DialOptions).
func (n *Network) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("podnet: %s: %w", addr, err)}
	}
	switch network {
	case "tcp", "tcp4", "udp", "udp4":
	default:
		return nil, opErr(net.UnknownNetworkError(network))
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, opErr(err)
	}
	ips := []net.IP{net.ParseIP(host)}
	if ips[0] == nil {
		all, _ := n.hosts.lookup(host)
		ips = ips[:0]
		for _, ip := range all {
			if ip.To4() != nil {
				ips = append(ips, ip)
			}
		}
		if len(ips) == 0 {
			return nil, opErr(&net.DNSError{Err: "no such host", Name: host, IsNotFound: true})
		}
	}
	ns, err := n.switchNetns()
	if err != nil {
		return nil, opErr(err)
	}
	defer func() { _ = ns.Close() }()
	var errs []error
	for _, ip := range ips {
		var c net.Conn
		// With an IP literal, the Dialer creates the socket on the calling
		// goroutine, hence on the thread inside ns.
		err := inNetns(ns, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, net.JoinHostPort(ip.String(), port))
			return err
		})
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 1 {
		return nil, errs[0]
	}
	return nil, errors.Join(errs...)
}
