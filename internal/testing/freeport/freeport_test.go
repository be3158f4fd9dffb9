package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestPick: every port picked lies outside the kernel's ephemeral range and
// can be bound at once.
func TestPick(t *testing.T) {
	low, high := ephemeralRange()
	for range 20 {
		port, err := Pick()
		if err != nil {
			t.Fatal(err)
		}
		if port >= low && port <= high {
			t.Fatalf("port %d is in the ephemeral range %d-%d", port, low, high)
		}
		if port < firstPort || port > 65535 {
			t.Fatalf("port %d is outside %d-65535", port, firstPort)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("binding the picked port %d: %v", port, err)
		}
		_ = l.Close()
	}
}

// TestPickSkipsABoundPort: a port bound by someone else is never picked,
// when it is the only candidate.
func TestPickSkipsABoundPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	bound := l.Addr().(*net.TCPAddr).Port
	if got, err := pickFrom([]int{bound, bound}); err == nil {
		_ = got.Close()
		t.Fatalf("port %d, bound by this test, was picked", bound)
	}
}

// TestPickNeverHandsOutAPortTwice: a port picked before is not picked
// again, though nothing is bound to it, for its server may not have bound
// it yet.
func TestPickNeverHandsOutAPortTwice(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	got, err := pickFrom([]int{port, port})
	if err != nil {
		t.Fatalf("picking free port %d: %v", port, err)
	}
	if p := got.Addr().(*net.TCPAddr).Port; p != port {
		t.Fatalf("picking free port %d: got %d", port, p)
	}
	_ = got.Close()
	if again, err := pickFrom([]int{port, port}); err == nil {
		_ = again.Close()
		t.Fatalf("port %d was handed out twice (again: %s)", port, again.Addr())
	}
}

// TestListenHoldsAPortOutsideTheEphemeralRange: the listener's port lies
// outside the kernel's ephemeral range and nobody else can bind it until
// the listener is closed; then it can.
func TestListenHoldsAPortOutsideTheEphemeralRange(t *testing.T) {
	low, high := ephemeralRange()
	l, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if port >= low && port <= high {
		t.Fatalf("port %d is in the ephemeral range %d-%d", port, low, high)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if other, err := net.Listen("tcp", addr); err == nil {
		_ = other.Close()
		t.Fatalf("port %d could be bound while Listen's listener held it", port)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("binding port %d after its listener closed: %v", port, err)
	}
	_ = again.Close()
}
