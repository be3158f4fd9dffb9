// Package freeport picks TCP ports on 127.0.0.1 for the processes that the
// tests and the demo start and can tell a port only by flag
// (kube-apiserver's --secure-port, druid's metrics and webhook ports).
//
// A port the kernel hands out for ":0" lies in its ephemeral range, the
// range outgoing connections take their local ports from too: between the
// pick and the process's bind (seconds for a server prepared early, under
// the load of hundreds of connections), one of them can take it, and the
// process exits with "bind: address already in use". A port outside that
// range is taken only by another explicit bind: one of another pick not
// bound yet, above all, when one process prepares many servers at once (two
// sites starting side by side). So a process never hands out a port twice.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
)

// rangeFile holds the kernel's ephemeral port range, "low high".
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// Linux's default ephemeral range, when rangeFile cannot be read.
const defaultLow, defaultHigh = 32768, 60999

// firstPort is the lowest port picked: below it are the well-known and
// many registered services' ports.
const firstPort = 10000

// Pick returns a TCP port that was free on 127.0.0.1 a moment ago and
// lies outside the kernel's ephemeral port range.
func Pick() (int, error) {
	l, err := Listen()
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, err
	}
	return port, nil
}

// Listen is Pick with the port kept: a listener on 127.0.0.1 at a port
// outside the kernel's ephemeral range, for a caller that holds the port
// until its process binds it. A process that binds the same port again
// after each restart (an etcd member keeps its URLs) needs such a port
// most: between an exit and the next start nothing holds it, and a port
// of the ephemeral range may meanwhile become the local port of any
// connection on the machine, for as long as that connection lives.
func Listen() (net.Listener, error) {
	low, high := ephemeralRange()
	var candidates []int // the ranges below and above the ephemeral one
	if low > firstPort {
		candidates = append(candidates, firstPort, low-1)
	}
	if high < 65535 {
		candidates = append(candidates, high+1, 65535)
	}
	if len(candidates) == 0 {
		return nil, fmt.Errorf("the ephemeral port range %d-%d leaves no port from %d on to pick", low, high, firstPort)
	}
	return pickFrom(candidates)
}

// handedOut are the ports this process picked: each may still be waiting
// for its server's bind, so none is picked again.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// pickFrom tries random ports of the inclusive ranges given as pairs
// (low, high, low, high, ...), none handed out before, until one binds,
// and returns its listener.
func pickFrom(ranges []int) (net.Listener, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	var lastErr error
	for range 64 {
		i := 2 * rand.IntN(len(ranges)/2)
		port := ranges[i] + rand.IntN(ranges[i+1]-ranges[i]+1)
		if handedOut.ports[port] {
			lastErr = fmt.Errorf("port %d was handed out before", port)
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			lastErr = err
			continue
		}
		handedOut.ports[port] = true
		return l, nil
	}
	return nil, fmt.Errorf("no free port in %v after 64 tries: %w", ranges, lastErr)
}

// ephemeralRange reads the kernel's ephemeral port range.
func ephemeralRange() (low, high int) {
	data, err := os.ReadFile(rangeFile)
	if err != nil {
		return defaultLow, defaultHigh
	}
	if _, err := fmt.Sscan(string(data), &low, &high); err != nil || low < 1 || high > 65535 || low > high {
		return defaultLow, defaultHigh
	}
	return low, high
}
