//go:build linux

package podnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// forwardDialTimeout bounds the dial of a forwarder's target; the client's
// connection is closed when it runs out.
const forwardDialTimeout = 10 * time.Second

// Forwarder is a userspace TCP forwarder: each connection accepted on its
// listener is copied to and from a new connection to its target.
type Forwarder struct {
	ln      net.Listener
	dial    func(ctx context.Context) (net.Conn, error)
	ctx     context.Context // done on Close
	cancel  context.CancelFunc
	onClose func()

	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
}

func startForwarder(ln net.Listener, dial func(ctx context.Context) (net.Conn, error)) *Forwarder {
	ctx, cancel := context.WithCancel(context.Background())
	f := &Forwarder{ln: ln, dial: dial, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.serve()
	return f
}

// Addr is the address of the listener (useful when it was asked for port 0).
func (f *Forwarder) Addr() net.Addr { return f.ln.Addr() }

// Close stops the listener, cuts the open connections and waits for the
// forwarder's goroutines. Calling it again does nothing.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()

	f.cancel()
	err := f.ln.Close()
	for c := range conns {
		_ = c.Close()
	}
	f.wg.Wait()
	if f.onClose != nil {
		f.onClose()
	}
	return err
}

// track registers c for Close; it closes c and reports false if Close has
// already run.
func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		_ = c.Close()
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
	_ = c.Close()
}

func (f *Forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			if f.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors or the like: let the open connections
			// finish some work before trying again.
			select {
			case <-f.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if !f.track(c) {
			return
		}
		f.wg.Add(1)
		go f.forward(c)
	}
}

func (f *Forwarder) forward(client net.Conn) {
	defer f.wg.Done()
	defer f.untrack(client)
	ctx, cancel := context.WithTimeout(f.ctx, forwardDialTimeout)
	target, err := f.dial(ctx)
	cancel()
	if err != nil {
		return
	}
	if !f.track(target) {
		return
	}
	defer f.untrack(target)
	done := make(chan struct{})
	go func() {
		pipe(target, client)
		close(done)
	}()
	pipe(client, target)
	<-done
}

// pipe copies src to dst. At the end of src it half-closes dst, so that a
// peer waiting for the end of the request still gets its answer through;
// after an error it closes both.
func pipe(dst, src net.Conn) {
	_, err := io.Copy(dst, src)
	if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil {
		if cw.CloseWrite() == nil {
			return
		}
	}
	_ = dst.Close()
	_ = src.Close()
}

// ForwardIntoPod listens inside the namespace of pod key at listen (for
// example "127.0.0.1:6443") and forwards each connection to target, dialed
// from the host's root namespace (for example the kube-apiserver at
// 127.0.0.1:6443). It ends with Close or with RemovePod of the pod.
func (n *Network) ForwardIntoPod(key, listen, target string) (*Forwarder, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.pods[key]
	if !ok {
		return nil, fmt.Errorf("podnet: forward into pod %q: no such pod", key)
	}
	var ln net.Listener
	err := inNetns(st.ns, func() error {
		var err error
		ln, err = net.Listen("tcp", listen)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("podnet: forward into pod %q: %w", key, err)
	}
	// The forwarder's goroutines are not locked to a thread, so they run in
	// the root namespace: target is dialed there.
	f := startForwarder(ln, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", target)
	})
	st.forwarders = append(st.forwarders, f)
	return f, nil
}

// ForwardFromHost listens in the host's root namespace at listen (for example
// "127.0.0.1:0") and forwards each connection to target in the pod network,
// dialed like DialContext does (a pod IP or a name of the DNS table). It lets
// processes on the host that cannot use DialContext (the kube-apiserver,
// etcdctl) reach a pod. It ends with Close or with the Network's Close.
func (n *Network) ForwardFromHost(listen, target string) (*Forwarder, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errors.New("podnet: network closed")
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("podnet: forward from host: %w", err)
	}
	f := startForwarder(ln, func(ctx context.Context) (net.Conn, error) {
		return n.DialContext(ctx, "tcp", target)
	})
	f.onClose = func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.fromHost, f)
	}
	n.fromHost[f] = struct{}{}
	return f, nil
}
