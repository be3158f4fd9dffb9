//go:build linux

package podnet

import (
	"context"
	"net"
	"testing"

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
	t.Cleanup(func() { p.Close() })

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
