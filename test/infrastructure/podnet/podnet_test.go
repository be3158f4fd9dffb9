//go:build linux

package podnet

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	. "github.com/onsi/gomega"
)

// requireNetns skips tests that need root and network namespaces.
func requireNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("podnet tests create network namespaces: run as root")
	}
	ns, err := newNetns()
	if err != nil {
		t.Skipf("podnet tests need network namespaces, unavailable here: %v", err)
	}
	_ = ns.Close()
}

func newNetworkT(t *testing.T, opts Options) *Network {
	t.Helper()
	requireNetns(t)
	n, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func addPodT(t *testing.T, n *Network, key string) *Pod {
	t.Helper()
	p, err := n.AddPod(key)
	if err != nil {
		t.Fatalf("AddPod(%q): %v", key, err)
	}
	return p
}

// serveName listens inside pod p on 0.0.0.0:port and answers every
// connection with the pod's key.
func serveName(t *testing.T, p *Pod, port string) {
	t.Helper()
	var ln net.Listener
	err := p.Do(func() error {
		var err error
		ln, err = net.Listen("tcp4", "0.0.0.0:"+port)
		return err
	})
	if err != nil {
		t.Fatalf("listen in pod %q: %v", p.Key, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, p.Key+"\n")
			_ = c.Close()
		}
	}()
}

// readLine reads one line from c and closes it.
func readLine(c net.Conn, err error) (string, error) {
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

// dialFromPod dials addr from inside pod p's namespace.
func dialFromPod(p *Pod, addr string) (net.Conn, error) {
	var c net.Conn
	err := p.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	return c, err
}

// resolverInPod is a Go resolver that asks the Network's DNS server from
// inside pod p, as a process in the pod would.
func resolverInPod(n *Network, p *Pod) *net.Resolver {
	server := net.JoinHostPort(n.DNSServer().String(), "53")
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var c net.Conn
			err := p.Do(func() error {
				var d net.Dialer
				var err error
				c, err = d.DialContext(ctx, network, server)
				return err
			})
			return c, err
		},
	}
}

func TestNewRejectsBadCIDR(t *testing.T) {
	for _, cidr := range []string{"nonsense", "10.0.0.0/31", "fd00::/64"} {
		t.Run(cidr, func(t *testing.T) {
			g := NewWithT(t)
			n, err := New(Options{CIDR: cidr})
			g.Expect(err).To(MatchError(ContainSubstring(cidr)))
			g.Expect(n).To(BeNil())
		})
	}
}

func TestPodsOwnTheirPortsAndLoopback(t *testing.T) {
	g := NewWithT(t)
	n := newNetworkT(t, Options{})
	a, b := addPodT(t, n, "ns/a"), addPodT(t, n, "ns/b")
	g.Expect(a.IP.String()).To(Equal("10.244.0.2"))
	g.Expect(b.IP.String()).To(Equal("10.244.0.3"))
	g.Expect(n.DNSServer().String()).To(Equal("10.244.0.1"))
	serveName(t, a, "2379")
	serveName(t, b, "2379")

	ctx := context.Background()
	for _, p := range []*Pod{a, b} {
		g.Expect(readLine(n.DialContext(ctx, "tcp", net.JoinHostPort(p.IP.String(), "2379")))).To(Equal(p.Key))
		g.Expect(readLine(dialFromPod(p, "127.0.0.1:2379"))).To(Equal(p.Key), "the pod's own loopback")
	}
}

func TestPodReachesPodByIPAndName(t *testing.T) {
	g := NewWithT(t)
	n := newNetworkT(t, Options{})
	a, b := addPodT(t, n, "ns/a"), addPodT(t, n, "ns/etcd-0")
	serveName(t, b, "2380")
	g.Expect(readLine(dialFromPod(a, net.JoinHostPort(b.IP.String(), "2380")))).To(Equal(b.Key))

	n.SetHost("etcd-0.etcd-peer.ns.svc.cluster.local", b.IP)
	ips, err := resolverInPod(n, a).LookupHost(context.Background(), "ETCD-0.etcd-peer.ns.svc.cluster.local.")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ips).To(ConsistOf(b.IP.String()))
	g.Expect(readLine(dialFromPod(a, net.JoinHostPort(ips[0], "2380")))).To(Equal(b.Key))

	n.DeleteHost("etcd-0.etcd-peer.ns.svc.cluster.local.")
	_, err = resolverInPod(n, a).LookupHost(context.Background(), "etcd-0.etcd-peer.ns.svc.cluster.local.")
	var dnsErr *net.DNSError
	g.Expect(err).To(BeAssignableToTypeOf(dnsErr))
	g.Expect(err.(*net.DNSError).IsNotFound).To(BeTrue())
}

func TestDNSAnswers(t *testing.T) {
	n := newNetworkT(t, Options{})
	n.SetHost("Etcd-Main.NS.svc.cluster.local", net.ParseIP("10.244.0.7"), net.ParseIP("10.244.0.8"))
	n.SetHost("dual.ns.svc.cluster.local.", net.ParseIP("10.244.0.9"), net.ParseIP("fd00::9"))
	n.SetHost("gone.ns.svc.cluster.local", net.ParseIP("10.244.0.10"))
	n.DeleteHost("GONE.ns.svc.cluster.local.")
	server := net.JoinHostPort(n.DNSServer().String(), "53")
	for _, proto := range []string{"udp", "tcp"} {
		for _, tc := range []struct {
			name  string
			qtype uint16
			rcode int
			want  []string
		}{
			{"etcd-main.ns.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10.244.0.7", "10.244.0.8"}},
			{"ETCD-MAIN.ns.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10.244.0.7", "10.244.0.8"}},
			{"etcd-main.ns.svc.cluster.local.", dns.TypeAAAA, dns.RcodeSuccess, nil},
			{"dual.ns.svc.cluster.local.", dns.TypeAAAA, dns.RcodeSuccess, []string{"fd00::9"}},
			{"dual.ns.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10.244.0.9"}},
			{"etcd-main.ns.svc.cluster.local.ns.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil},
			{"gone.ns.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil},
			{"example.com.", dns.TypeAAAA, dns.RcodeNameError, nil},
		} {
			t.Run(proto+"/"+dns.TypeToString[tc.qtype]+"/"+tc.name, func(t *testing.T) {
				g := NewWithT(t)
				c, err := n.DialContext(context.Background(), proto, server)
				g.Expect(err).NotTo(HaveOccurred())
				conn := &dns.Conn{Conn: c}
				defer func() { _ = conn.Close() }()
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				q := new(dns.Msg)
				q.SetQuestion(tc.name, tc.qtype)
				g.Expect(conn.WriteMsg(q)).To(Succeed())
				r, err := conn.ReadMsg()
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(r.Rcode).To(Equal(tc.rcode))
				g.Expect(r.Authoritative).To(BeTrue())
				var got []string
				for _, rr := range r.Answer {
					switch rr := rr.(type) {
					case *dns.A:
						got = append(got, rr.A.String())
					case *dns.AAAA:
						got = append(got, rr.AAAA.String())
					}
					g.Expect(rr.Header().Name).To(Equal(tc.name))
				}
				g.Expect(got).To(Equal(tc.want))
			})
		}
	}
}

func TestDialContextServesHTTPClients(t *testing.T) {
	g := NewWithT(t)
	n := newNetworkT(t, Options{})
	p := addPodT(t, n, "ns/web")
	var ln net.Listener
	g.Expect(p.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", ":8080")
		return err
	})).To(Succeed())
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello from "+r.Host)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()

	n.SetHost("web.ns.svc.cluster.local", p.IP)
	tr := &http.Transport{DialContext: n.DialContext}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := client.Get("http://web.ns.svc.cluster.local:8080/")
	g.Expect(err).NotTo(HaveOccurred())
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(body)).To(Equal("hello from web.ns.svc.cluster.local:8080"))

	_, err = n.DialContext(context.Background(), "tcp", "nobody.ns.svc.cluster.local:8080")
	g.Expect(err).To(MatchError(ContainSubstring("no such host")))
}

func TestForwardIntoPodReachesHostLoopback(t *testing.T) {
	g := NewWithT(t)
	n := newNetworkT(t, Options{})
	p := addPodT(t, n, "ns/etcd-0")

	// A host listener on 127.0.0.1 that answers only once the request is
	// complete (half-closed), as a stand-in for the kube-apiserver.
	host, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = host.Close() }()
	go func() {
		for {
			c, err := host.Accept()
			if err != nil {
				return
			}
			req, _ := io.ReadAll(c)
			_, _ = io.WriteString(c, "host got "+string(req)+"\n")
			_ = c.Close()
		}
	}()

	f, err := n.ForwardIntoPod(p.Key, "127.0.0.1:6443", host.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.Addr().String()).To(Equal("127.0.0.1:6443"))
	c, err := dialFromPod(p, "127.0.0.1:6443")
	g.Expect(err).NotTo(HaveOccurred())
	_, _ = io.WriteString(c, "ping")
	g.Expect(c.(*net.TCPConn).CloseWrite()).To(Succeed())
	g.Expect(readLine(c, nil)).To(Equal("host got ping"))

	// The host's own 127.0.0.1:6443 is not the pod's.
	_, err = n.ForwardIntoPod(p.Key, "127.0.0.1:6443", host.Addr().String())
	g.Expect(err).To(MatchError(ContainSubstring("address already in use")))
	_, err = n.ForwardIntoPod("ns/none", "127.0.0.1:6443", host.Addr().String())
	g.Expect(err).To(MatchError(ContainSubstring("no such pod")))

	// RemovePod ends the forwarder: its listener is closed.
	g.Expect(n.RemovePod(p.Key)).To(Succeed())
	_, err = f.ln.Accept()
	g.Expect(err).To(MatchError(net.ErrClosed))
}

func TestForwardFromHostReachesPod(t *testing.T) {
	g := NewWithT(t)
	n := newNetworkT(t, Options{})
	p := addPodT(t, n, "ns/etcd-0")
	serveName(t, p, "2379")
	n.SetHost("etcd-0.etcd-peer.ns.svc.cluster.local", p.IP)

	f, err := n.ForwardFromHost("127.0.0.1:0", "etcd-0.etcd-peer.ns.svc.cluster.local:2379")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(readLine(net.Dial("tcp", f.Addr().String()))).To(Equal(p.Key))
	g.Expect(f.Close()).To(Succeed())
	g.Expect(f.Close()).To(Succeed())
	_, err = net.Dial("tcp", f.Addr().String())
	g.Expect(err).To(HaveOccurred())
}

func TestPodKeepsItsIPAcrossRemoveAndAdd(t *testing.T) {
	g := NewWithT(t)
	n := newNetworkT(t, Options{})
	a, b := addPodT(t, n, "ns/etcd-0"), addPodT(t, n, "ns/etcd-1")
	serveName(t, a, "2380")
	// b learns a's MAC now; it must still be right after a is recreated.
	g.Expect(readLine(dialFromPod(b, net.JoinHostPort(a.IP.String(), "2380")))).To(Equal(a.Key))

	g.Expect(n.RemovePod(a.Key)).To(Succeed())
	g.Expect(n.RemovePod(a.Key)).To(Succeed(), "removing twice")
	g.Expect(a.Do(func() error { return nil })).To(MatchError(ContainSubstring("removed")))
	_, err := dialFromPod(b, net.JoinHostPort(a.IP.String(), "2380"))
	g.Expect(err).To(HaveOccurred())

	c := addPodT(t, n, "ns/etcd-2")
	again := addPodT(t, n, "ns/etcd-0")
	g.Expect(again.IP.Equal(a.IP)).To(BeTrue())
	g.Expect(c.IP.Equal(a.IP)).To(BeFalse())
	g.Expect(c.IP.Equal(b.IP)).To(BeFalse())
	g.Expect(a.Do(func() error { return nil })).To(HaveOccurred(), "an old Pod stays removed")

	serveName(t, again, "2380")
	g.Expect(readLine(dialFromPod(b, net.JoinHostPort(again.IP.String(), "2380")))).To(Equal(again.Key))

	_, err = n.AddPod("ns/etcd-0")
	g.Expect(err).To(MatchError(ContainSubstring("exists")))
}

func TestSmallCIDRRunsOut(t *testing.T) {
	g := NewWithT(t)
	n := newNetworkT(t, Options{CIDR: "10.99.0.0/30"})
	g.Expect(n.DNSServer().String()).To(Equal("10.99.0.1"))
	p := addPodT(t, n, "only")
	g.Expect(p.IP.String()).To(Equal("10.99.0.2"))
	_, err := n.AddPod("one-too-many")
	g.Expect(err).To(MatchError(ContainSubstring("no free IP")))
}

func TestChildProcessEntersPodNetwork(t *testing.T) {
	ipTool, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("needs the ip tool (iproute2)")
	}
	n := newNetworkT(t, Options{})
	p := addPodT(t, n, "ns/child")
	want := p.IP.String() + "/16"

	t.Run("nsenter --net=NetnsPath", func(t *testing.T) {
		nsenter, err := exec.LookPath("nsenter")
		if err != nil {
			t.Skip("needs nsenter (util-linux)")
		}
		g := NewWithT(t)
		out, err := exec.Command(nsenter, "--net="+p.NetnsPath, ipTool, "-o", "-4", "addr", "show", "dev", "eth0").CombinedOutput()
		g.Expect(err).NotTo(HaveOccurred(), string(out))
		g.Expect(string(out)).To(ContainSubstring(want))
	})

	t.Run("Cmd.Start inside Pod.Do", func(t *testing.T) {
		g := NewWithT(t)
		cmd := exec.Command(ipTool, "-o", "-4", "addr", "show", "dev", "eth0")
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		g.Expect(p.Do(cmd.Start)).To(Succeed())
		g.Expect(cmd.Wait()).To(Succeed(), out.String())
		g.Expect(out.String()).To(ContainSubstring(want))
	})
}

// homeNetns is the network namespace of the process, read while no thread
// has moved yet (package variables are set before any test runs).
var homeNetns, _ = os.Readlink("/proc/thread-self/ns/net")

// threadsOutsideHome lists the threads of this process, but the main one,
// that are not in its network namespace. The main thread is left out because
// the runtime cannot end it: when a goroutine exits while locked to it, the
// runtime parks it for good instead, so it runs nothing wherever it is.
func threadsOutsideHome() []string {
	main := strconv.Itoa(os.Getpid())
	tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
	var out []string
	for _, task := range tasks {
		if filepath.Base(filepath.Dir(filepath.Dir(task))) == main {
			continue
		}
		if ns, err := os.Readlink(task); err == nil && ns != homeNetns {
			out = append(out, task+" → "+ns)
		}
	}
	return out
}

func interfaceNames(g Gomega) []string {
	ifs, err := net.Interfaces()
	g.Expect(err).NotTo(HaveOccurred())
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	return names
}

func TestCloseLeavesNothing(t *testing.T) {
	g := NewWithT(t)
	requireNetns(t)
	ifsBefore := interfaceNames(g)
	goroutinesBefore := runtime.NumGoroutine()

	n, err := New(Options{})
	g.Expect(err).NotTo(HaveOccurred())
	a, b := addPodT(t, n, "ns/a"), addPodT(t, n, "ns/b")
	var ln net.Listener
	g.Expect(b.Do(func() error {
		ln, err = net.Listen("tcp", ":2379")
		return err
	})).To(Succeed())
	defer func() { _ = ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "b\n")
			// Left open: Close of the Network must cut forwarded connections.
		}
	}()
	host, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = host.Close() }()
	_, err = n.ForwardIntoPod(a.Key, "127.0.0.1:6443", host.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	f, err := n.ForwardFromHost("127.0.0.1:0", net.JoinHostPort(b.IP.String(), "2379"))
	g.Expect(err).NotTo(HaveOccurred())
	open, err := net.Dial("tcp", f.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = open.Close() }()
	g.Expect(bufio.NewReader(open).ReadString('\n')).To(Equal("b\n"))
	g.Expect(n.ifsInSwitch()).To(ContainElements("br0", "veth2", "veth3"))
	g.Expect(interfaceNames(g)).To(Equal(ifsBefore), "nothing in the root namespace while running")

	g.Expect(n.Close()).To(Succeed())
	g.Expect(n.Close()).To(Succeed(), "closing twice")
	_ = ln.Close()
	_ = open.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = open.Read(make([]byte, 1))
	g.Expect(err).To(MatchError(io.EOF), "the forwarded connection is cut")

	_, err = n.AddPod("ns/c")
	g.Expect(err).To(MatchError(ContainSubstring("closed")))
	g.Expect(a.Do(func() error { return nil })).To(HaveOccurred())
	_, err = n.DialContext(context.Background(), "tcp", net.JoinHostPort(b.IP.String(), "2379"))
	g.Expect(err).To(MatchError(ContainSubstring("closed")))

	g.Expect(interfaceNames(g)).To(Equal(ifsBefore))
	g.Eventually(runtime.NumGoroutine).WithTimeout(5 * time.Second).Should(BeNumerically("<=", goroutinesBefore))
	g.Eventually(threadsOutsideHome).WithTimeout(5 * time.Second).Should(BeEmpty())
}

// ifsInSwitch lists the interfaces of the switch namespace.
func (n *Network) ifsInSwitch() ([]string, error) {
	links, err := n.links.LinkList()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	return names, nil
}

func TestPanicInDoReachesTheCaller(t *testing.T) {
	g := NewWithT(t)
	n := newNetworkT(t, Options{})
	p := addPodT(t, n, "ns/a")
	g.Expect(func() { _ = p.Do(func() error { panic("boom") }) }).To(PanicWith("boom"))
	g.Eventually(threadsOutsideHome).WithTimeout(5*time.Second).Should(BeEmpty(), "the thread left in the pod namespace died")
}
