package localetcd

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/druid-stretch/druid-stretch/internal/testing/freeport"
	"github.com/druid-stretch/druid-stretch/internal/testing/linkemu"
)

// endpoints are the ports of one member. The peer and client listeners are
// held from NewMember until etcd is exec'd, so no other process (or other
// runtime in this process) can be handed the same port meanwhile.
type endpoints struct {
	peerPort, clientPort int
	peerLn, clientLn     net.Listener // nil once handed to etcd
	sidecarLn            net.Listener // nil without Options.Sidecar
	fronts               []*linkemu.Link
}

// reserveEndpoints picks free ports on 127.0.0.1 and sets the member's URLs.
func (m *Member) reserveEndpoints() (err error) {
	var ep endpoints
	defer func() {
		if err != nil {
			ep.release()
		}
	}()
	if ep.peerLn, err = listenFree(); err != nil {
		return fmt.Errorf("localetcd: reserving a peer port for %q: %w", m.Name, err)
	}
	if ep.clientLn, err = listenFree(); err != nil {
		return fmt.Errorf("localetcd: reserving a client port for %q: %w", m.Name, err)
	}
	ep.peerPort = ep.peerLn.Addr().(*net.TCPAddr).Port
	ep.clientPort = ep.clientLn.Addr().(*net.TCPAddr).Port
	scheme := "http"
	if m.r.opts.CA != nil {
		scheme = "https"
	}
	localPeer := "127.0.0.1:" + strconv.Itoa(ep.peerPort)
	localClient := "127.0.0.1:" + strconv.Itoa(ep.clientPort)
	advPeer, advClient := localPeer, localClient
	if wan := m.r.opts.WAN; wan != nil {
		pf, err := wan.Front(m.Site, localPeer)
		if err != nil {
			return fmt.Errorf("localetcd: WAN front for the peer port of %q: %w", m.Name, err)
		}
		ep.fronts = append(ep.fronts, pf)
		cf, err := wan.Front(m.Site, localClient)
		if err != nil {
			return fmt.Errorf("localetcd: WAN front for the client port of %q: %w", m.Name, err)
		}
		ep.fronts = append(ep.fronts, cf)
		advPeer, advClient = pf.Addr(), cf.Addr()
	}
	if m.r.opts.Sidecar != nil {
		if ep.sidecarLn, err = listenFree(); err != nil {
			return fmt.Errorf("localetcd: reserving a sidecar port for %q: %w", m.Name, err)
		}
		if m.sidecarCfg != nil {
			ep.sidecarLn = tls.NewListener(ep.sidecarLn, m.sidecarCfg)
		}
		advSidecar := ep.sidecarLn.Addr().String()
		if wan := m.r.opts.WAN; wan != nil {
			// The sidecar sits in its member's site too: a controller of
			// the other site pays the round trip and is cut by a partition.
			sf, err := wan.Front(m.Site, advSidecar)
			if err != nil {
				return fmt.Errorf("localetcd: WAN front for the sidecar port of %q: %w", m.Name, err)
			}
			ep.fronts = append(ep.fronts, sf)
			advSidecar = sf.Addr()
		}
		m.SidecarURL = scheme + "://" + advSidecar
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.LocalPeerURL = scheme + "://" + localPeer
	m.LocalClientURL = scheme + "://" + localClient
	m.PeerURL = scheme + "://" + advPeer
	m.ClientURL = scheme + "://" + advClient
	m.ep = ep
	return nil
}

// listenFree holds a free port outside the kernel's ephemeral range: etcd
// binds its peer and client ports again at every restart, and between an
// exit and the next start a port of that range can become the local port
// of any outgoing connection on the machine, which would keep the member
// from ever starting again while that connection lives.
func listenFree() (net.Listener, error) { return freeport.Listen() }

// claimPorts frees the peer and client ports for etcd right before it
// starts: the held listeners are closed, and ports that were free before a
// restart are checked again, so a clash names the port instead of surfacing
// as an etcd exit.
func (m *Member) claimPorts() error {
	for _, p := range []struct {
		role string
		port int
		ln   *net.Listener
	}{{"peer", m.ep.peerPort, &m.ep.peerLn}, {"client", m.ep.clientPort, &m.ep.clientLn}} {
		if *p.ln != nil {
			_ = (*p.ln).Close()
			*p.ln = nil
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p.port))
		if err != nil {
			return fmt.Errorf("%w: the %s port 127.0.0.1:%d of member %q is taken by another process: %v", ErrPortInUse, p.role, p.port, m.Name, err)
		}
		_ = ln.Close()
	}
	return nil
}

// resetForRetry moves a member that failed to start to new ports and
// empties its data dir, so that the next bootstrap starts clean.
func (m *Member) resetForRetry() error {
	m.releaseEndpoints()
	if err := os.RemoveAll(m.DataDir); err != nil {
		return fmt.Errorf("localetcd: emptying the data dir of %q for a retry: %w", m.Name, err)
	}
	return m.reserveEndpoints()
}

// releaseEndpoints closes what the member holds of its ports and fronts.
func (m *Member) releaseEndpoints() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ep.release()
}

func (ep *endpoints) release() {
	var errs []error
	for _, ln := range []net.Listener{ep.peerLn, ep.clientLn, ep.sidecarLn} {
		if ln != nil {
			errs = append(errs, ln.Close())
		}
	}
	for _, f := range ep.fronts {
		errs = append(errs, f.Close())
	}
	ep.peerLn, ep.clientLn, ep.sidecarLn, ep.fronts = nil, nil, nil, nil
	_ = errors.Join(errs...) // closing what is already closed is not worth reporting
}
