package linkemu

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testServer is a loopback TCP server that runs handle per connection and
// stops, with every connection, on test cleanup.
type testServer struct {
	ln       net.Listener
	accepted atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
}

func startServer(tb testing.TB, handle func(net.Conn)) *testServer {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	s := &testServer{ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() {
					s.mu.Lock()
					delete(s.conns, c)
					s.mu.Unlock()
					_ = c.Close()
				}()
				handle(c)
			}()
		}
	}()
	tb.Cleanup(s.close)
	return s
}

func (s *testServer) addr() string { return s.ln.Addr().String() }

func (s *testServer) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func startEcho(tb testing.TB) *testServer {
	return startServer(tb, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// epoch makes in-process timestamps monotonic and comparable between the
// stamp server and its clients.
var epoch = time.Now()

func sinceEpoch() time.Duration { return time.Since(epoch) }

// startStamp answers each size-byte message with a size-byte message whose
// first 8 bytes hold the time the server read it, so a client in this process
// can split a round trip into its two one-way times.
func startStamp(tb testing.TB, size int) *testServer {
	return startServer(tb, func(c net.Conn) {
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			binary.LittleEndian.PutUint64(buf, uint64(sinceEpoch()))
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
}

// stampRoundTrip sends one message to a stamp server and returns the time
// it took each way.
func stampRoundTrip(c net.Conn, size int) (up, down time.Duration, err error) {
	buf := make([]byte, size)
	sent := sinceEpoch()
	if _, err := c.Write(buf); err != nil {
		return 0, 0, err
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		return 0, 0, err
	}
	got := sinceEpoch()
	read := time.Duration(binary.LittleEndian.Uint64(buf))
	return read - sent, got - read, nil
}

// echoRoundTrip sends msg and waits for it back, giving up after timeout.
func echoRoundTrip(c net.Conn, msg string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	if _, err := c.Write([]byte(msg)); err != nil {
		return 0, err
	}
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return 0, err
	}
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return 0, err
	}
	if string(buf) != msg {
		return 0, errors.New("echo answered " + string(buf) + ", want " + msg)
	}
	return time.Since(start), nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
