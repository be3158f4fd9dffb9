package localetcd

import (
	"fmt"
	"net/url"
	"os"
	"strconv"
	"testing"
)

// TestMemberPortsLieOutsideTheEphemeralRange: a member's own peer and
// client ports, which its etcd binds again at every restart, are never
// ports the kernel could give an outgoing connection meanwhile.
func TestMemberPortsLieOutsideTheEphemeralRange(t *testing.T) {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skipf("no ephemeral port range to check against: %v", err)
	}
	var low, high int
	if _, err := fmt.Sscan(string(data), &low, &high); err != nil {
		t.Fatalf("reading the ephemeral port range %q: %v", data, err)
	}
	// No etcd runs here: any executable stands in for the binary.
	r := newRuntime(t, Options{EtcdBinary: "/bin/true"})
	for i := range 5 {
		m, err := r.NewMember(fmt.Sprintf("m%d", i), MemberOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, raw := range []string{m.LocalPeerURL, m.LocalClientURL} {
			u, err := url.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			port, err := strconv.Atoi(u.Port())
			if err != nil {
				t.Fatalf("the port of %s: %v", raw, err)
			}
			if port >= low && port <= high {
				t.Errorf("member %s: %s lies in the ephemeral port range %d-%d", m.Name, raw, low, high)
			}
		}
	}
}
