package etcdwrapper

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/onsi/gomega"
	"go.etcd.io/etcd/server/v3/embed"
)

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	gomega.NewWithT(t).Expect(err).NotTo(gomega.HaveOccurred())
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// loopbackMember is one member's name and loopback URLs.
type loopbackMember struct {
	name                string
	clientPort          int
	clientURL, peerURL  string
	initialClusterEntry string
}

func newLoopbackMember(t *testing.T, name, scheme string) loopbackMember {
	m := loopbackMember{name: name, clientPort: freePort(t)}
	m.clientURL = fmt.Sprintf("%s://127.0.0.1:%d", scheme, m.clientPort)
	m.peerURL = "http://127.0.0.1:" + strconv.Itoa(freePort(t))
	m.initialClusterEntry = m.name + "=" + m.peerURL
	return m
}

// startEmbedded starts a real etcd for m in a temporary folder and returns
// its closer, which the test may call early; it runs when the test ends
// (once: closing an embedded etcd twice panics).
func startEmbedded(t *testing.T, m loopbackMember, initialCluster, state string) (stop func()) {
	t.Helper()
	g := gomega.NewWithT(t)
	parse := func(s string) []url.URL {
		u, err := url.Parse(s)
		g.Expect(err).NotTo(gomega.HaveOccurred())
		return []url.URL{*u}
	}
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = filepath.Join(t.TempDir(), m.name+".etcd")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = parse(m.clientURL), parse(m.clientURL)
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = parse(m.peerURL), parse(m.peerURL)
	cfg.InitialCluster = initialCluster
	cfg.ClusterState = state
	cfg.LogLevel = "error"
	e, err := embed.StartEtcd(cfg)
	g.Expect(err).NotTo(gomega.HaveOccurred())
	stop = sync.OnceFunc(e.Close)
	t.Cleanup(stop)
	return stop
}
