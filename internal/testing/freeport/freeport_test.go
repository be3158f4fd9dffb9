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
	if _, err := pickFrom([]int{bound, bound}); err == nil {
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
	if err != nil || got != port {
		t.Fatalf("picking free port %d: got %d, %v", port, got, err)
	}
	if again, err := pickFrom([]int{port, port}); err == nil {
		t.Fatalf("port %d was handed out twice (again: %d)", port, again)
	}
}
