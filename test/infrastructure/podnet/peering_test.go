//go:build linux

package podnet

import (
	"context"
	"net"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// TestPeeredNetworksReachEachOther: two pod networks (two sites) peered
// reach each other's pods by IP and by the names each publishes under its
// zone; in-cluster names stay each network's own; closing the peering cuts
// both.
func TestPeeredNetworksReachEachOther(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	a := newNetworkT(t, Options{CIDR: "10.244.0.0/16"})
	b := newNetworkT(t, Options{CIDR: "10.245.0.0/16"})
	a.SetZone("site-a.test")
	b.SetZone("site-b.test")
	pa, pb := addPodT(t, a, "shoot/etcd-main-0"), addPodT(t, b, "shoot/etcd-main-3")
	serveName(t, pa, "2380")
	serveName(t, pb, "2380")
	a.SetHost("etcd-main-0.shoot.site-a.test", pa.IP)
	a.SetHost("etcd-main-0.etcd-main-peer.shoot.svc.cluster.local", pa.IP)
	b.SetHost("etcd-main-3.shoot.site-b.test", pb.IP)

	// Before peering: nothing crosses.
	_, err := resolverInPod(b, pb).LookupHost(ctx, "etcd-main-0.shoot.site-a.test.")
	g.Expect(err).To(HaveOccurred())

	p, err := Peer(a, b)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = p.Close() })

	for _, tc := range []struct {
		from    *Network
		pod     *Pod
		name    string
		wantKey string
	}{
		{b, pb, "etcd-main-0.shoot.site-a.test.", pa.Key},
		{a, pa, "etcd-main-3.shoot.site-b.test.", pb.Key},
	} {
		ips, err := resolverInPod(tc.from, tc.pod).LookupHost(ctx, tc.name)
		g.Expect(err).NotTo(HaveOccurred(), "%s from %s", tc.name, tc.pod.Key)
		g.Expect(readLine(dialFromPod(tc.pod, net.JoinHostPort(ips[0], "2380")))).To(Equal(tc.wantKey))
		// The process's own dialer into a network resolves the same way.
		g.Expect(readLine(tc.from.DialContext(ctx, "tcp", net.JoinHostPort(tc.name[:len(tc.name)-1], "2380")))).To(Equal(tc.wantKey))
	}
	// A name outside the zone is not published, even when the table has it.
	_, err = resolverInPod(b, pb).LookupHost(ctx, "etcd-main-0.etcd-main-peer.shoot.svc.cluster.local.")
	g.Expect(err).To(HaveOccurred(), "site A's in-cluster name stays site A's")

	// Overlapping networks cannot be peered.
	c := newNetworkT(t, Options{CIDR: "10.244.128.0/17"})
	_, err = Peer(a, c)
	g.Expect(err).To(MatchError(ContainSubstring("overlap")))

	g.Expect(p.Close()).To(Succeed())
	_, err = resolverInPod(b, pb).LookupHost(ctx, "etcd-main-0.shoot.site-a.test.")
	g.Expect(err).To(HaveOccurred(), "the names are gone with the peering")
	_, err = dialFromPod(pb, net.JoinHostPort(pa.IP.String(), "2380"))
	g.Expect(err).To(HaveOccurred(), "the route is gone with the peering")
}

// TestPeeringDelaysOnlyTrafficBetweenTheNetworks: with a one-way delay set,
// a connection from a pod of one network to a pod of the other pays the
// round trip for its handshake and again for its first answer, both ways;
// pods of one network still talk without it.
func TestPeeringDelaysOnlyTrafficBetweenTheNetworks(t *testing.T) {
	g := NewWithT(t)
	a := newNetworkT(t, Options{CIDR: "10.244.0.0/16"})
	b := newNetworkT(t, Options{CIDR: "10.245.0.0/16"})
	pa, pa2, pb := addPodT(t, a, "shoot/etcd-main-0"), addPodT(t, a, "shoot/etcd-main-1"), addPodT(t, b, "shoot/etcd-main-3")
	for _, p := range []*Pod{pa, pa2, pb} {
		serveName(t, p, "2380")
	}
	p, err := Peer(a, b)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = p.Close() })
	g.Expect(p.Delay()).To(BeZero())
	const oneWay = 90 * time.Millisecond
	p.SetDelay(oneWay)
	g.Expect(p.Delay()).To(Equal(oneWay))

	// Dial and read the first line: SYN and SYN-ACK, then the ACK the
	// server accepts on and its answer, two round trips.
	timed := func(from, to *Pod) (time.Duration, string) {
		start := time.Now()
		line, err := readLine(dialFromPod(from, net.JoinHostPort(to.IP.String(), "2380")))
		g.Expect(err).NotTo(HaveOccurred(), "%s to %s", from.Key, to.Key)
		return time.Since(start), line
	}
	across, line := timed(pa, pb)
	g.Expect(line).To(Equal(pb.Key))
	g.Expect(across).To(BeNumerically(">=", 4*oneWay), "from A to B")
	back, line := timed(pb, pa)
	g.Expect(line).To(Equal(pa.Key))
	g.Expect(back).To(BeNumerically(">=", 4*oneWay), "from B to A")
	within, line := timed(pa, pa2)
	g.Expect(line).To(Equal(pa2.Key))
	g.Expect(within).To(BeNumerically("<", across), "inside A nothing is delayed")
	t.Logf("dial and first answer: A to B %s, B to A %s, inside A %s", across, back, within)

	p.SetDelay(0)
	again, _ := timed(pa, pb)
	g.Expect(again).To(BeNumerically("<", across), "the delay is lifted")
}
