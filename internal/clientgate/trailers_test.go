package clientgate_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/druid-stretch/druid-stretch/internal/clientgate"
)

// refusingHealth answers every call with an error and no message, as etcd
// refuses a linearizable read on a learner ("rpc not supported for
// learner"): gRPC sends that as a trailers-only response, the status in
// the one HEADERS frame that ends the stream.
type refusingHealth struct {
	healthpb.UnimplementedHealthServer
}

func (refusingHealth) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return nil, status.Error(codes.Unavailable, "etcdserver: rpc not supported for learner")
}

// TestTrailersOnlyAnswerKeepsItsStatus: an answer that is only a status
// reaches the client through the gate with that status, every time. The
// gate's proxy flushes the response headers on its own timer while it
// copies the (empty) body; when that timer won the race, the status went
// out in headers that did not end the stream, and gRPC clients read the
// answer as "server closed the stream without sending trailers"
// (codes.Internal), which etcd's client does not retry.
func TestTrailersOnlyAnswerKeepsItsStatus(t *testing.T) {
	g := NewWithT(t)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, refusingHealth{})
	bl, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	grpcL, httpL := splitHTTP1(bl)
	go func() { _ = srv.Serve(grpcL) }()
	defer srv.Stop()
	probes := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = probes.Serve(httpL) }()
	defer func() { _ = probes.Close() }()
	burl, err := url.Parse("http://" + bl.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	gate, err := clientgate.New(clientgate.Options{Backend: burl})
	g.Expect(err).NotTo(HaveOccurred())
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	served := make(chan error, 1)
	go func() { served <- gate.Serve(gl) }()
	defer func() {
		g.Expect(gate.Close()).To(Succeed())
		g.Expect(<-served).To(Succeed())
	}()

	conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = conn.Close() }()
	client := healthpb.NewHealthClient(conn)
	const calls = 400
	codesSeen := map[codes.Code]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range calls / 8 {
				_, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{})
				mu.Lock()
				codesSeen[status.Code(err)]++
				if status.Code(err) != codes.Unavailable {
					t.Logf("call: %v", err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	g.Expect(codesSeen).To(Equal(map[codes.Code]int{codes.Unavailable: calls}), "every call got etcd's status")
}

// splitHTTP1 hands the HTTP/1 connections that l accepts (the gate's
// probe of /health) to one listener and the rest (gRPC) to another, as
// etcd serves both on its client port.
func splitHTTP1(l net.Listener) (grpcL, httpL net.Listener) {
	g, h := newChanListener(l.Addr()), newChanListener(l.Addr())
	go func() {
		defer func() { _ = g.Close() }()
		defer func() { _ = h.Close() }()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				br := bufio.NewReader(c)
				first, err := br.Peek(4)
				if err != nil {
					_ = c.Close()
					return
				}
				pc := peekedConn{Conn: c, r: br}
				if string(first) == "GET " {
					h.conns <- pc
				} else {
					g.conns <- pc
				}
			}()
		}
	}()
	return g, h
}

type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// chanListener accepts the connections sent to it.
type chanListener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, conns: make(chan net.Conn, 16), closed: make(chan struct{})}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }
