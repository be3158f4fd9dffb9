package clientgate

import (
	"net/http"
	"testing"

	. "github.com/onsi/gomega"
)

// A trailers-only answer's status goes to the trailers; a streaming
// answer (status in its real trailers) and plain HTTP stay as they are.
func TestStatusToTrailers(t *testing.T) {
	g := NewWithT(t)
	only := &http.Response{Header: http.Header{
		"Content-Type": {"application/grpc"}, "Grpc-Status": {"11"}, "Grpc-Message": {"etcdserver: mvcc: required revision has been compacted"},
	}}
	g.Expect(statusToTrailers(only)).To(Succeed())
	g.Expect(only.Header).To(Equal(http.Header{"Content-Type": {"application/grpc"}}))
	g.Expect(only.Trailer).To(Equal(http.Header{"Grpc-Status": {"11"}, "Grpc-Message": {"etcdserver: mvcc: required revision has been compacted"}}))

	streaming := &http.Response{Header: http.Header{"Content-Type": {"application/grpc"}}, Trailer: http.Header{"Grpc-Status": nil}}
	g.Expect(statusToTrailers(streaming)).To(Succeed())
	g.Expect(streaming.Header).To(Equal(http.Header{"Content-Type": {"application/grpc"}}))
	g.Expect(streaming.Trailer).To(Equal(http.Header{"Grpc-Status": nil}))

	plain := &http.Response{Header: http.Header{"Content-Type": {"text/plain"}, "Grpc-Status": {"0"}}}
	g.Expect(statusToTrailers(plain)).To(Succeed())
	g.Expect(plain.Header).To(HaveKey("Grpc-Status"))
	g.Expect(plain.Trailer).To(BeNil())
}
