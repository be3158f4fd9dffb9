package clientgate_test

import (
	"context"
	"net"
	"net/url"
	"sync"
	"testing"

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
	go func() { _ = srv.Serve(bl) }()
	defer srv.Stop()
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
	defer conn.Close()
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
