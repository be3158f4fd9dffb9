package apiload

import (
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

func TestClassify(t *testing.T) {
	const url = `"https://127.0.0.1:44321/api/v1/namespaces/druid-stretch-apiload/configmaps/apiload-site-a-0?timeout=30s"`
	for _, tc := range []struct {
		code    int
		message string
		want    FailureClass
	}{
		// kube-apiserver passes etcd client errors through as 500s with the
		// error text as message.
		{500, "etcdserver: server stopped", MemberRemoved},
		{500, "raft: stopped", MemberRemoved},
		{500, "etcdserver: member not found", MemberRemoved},
		{500, "the member has been permanently removed from the cluster", MemberRemoved},
		{500, "rpc error: code = Unavailable desc = error reading from server: EOF", MemberRemoved},
		{500, `rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:32379: connect: connection refused"`, MemberRemoved},
		{500, "rpc error: code = Unavailable desc = transport is closing", MemberRemoved},
		{500, "etcdserver: raft proposal dropped", ProposalDropped},
		{500, "rpc error: code = Unknown desc = raft proposal dropped", ProposalDropped},
		{500, "etcdserver: request timed out", Timeout},
		{500, "etcdserver: request timed out, possibly due to previous leader failure", Timeout},
		{500, "rpc error: code = DeadlineExceeded desc = context deadline exceeded", Timeout},
		{504, "Timeout: request did not complete within requested timeout - context deadline exceeded", Timeout},
		{504, "The update operation against configmaps could not be completed at this time, please try again.", Timeout},
		{500, "etcdserver: leader changed", LeaderChanged},
		{500, "rpc error: code = Unavailable desc = etcdserver: leader changed", LeaderChanged},
		{500, "etcdserver: no leader", LeaderChanged},
		{503, "the server is currently unable to handle the request", Unavailable},
		{500, "etcdserver: too many requests", Other},
		{422, `ConfigMap "apiload-site-a-0" is invalid: data: Too long`, Other},
		// No HTTP answer: the client's connection to the kube-apiserver.
		{0, "Put " + url + ": dial tcp 127.0.0.1:44321: connect: connection refused", Unavailable},
		{0, "Put " + url + ": read tcp 127.0.0.1:50412->127.0.0.1:44321: read: connection reset by peer", Unavailable},
		{0, "Put " + url + ": http2: client connection lost", Unavailable},
		{0, "Get " + url + ": dial tcp 10.0.0.1:443: i/o timeout", Unavailable},
		{0, "Put " + url + ": context deadline exceeded", Timeout},
		{0, "Get " + url + ": net/http: request canceled (Client.Timeout exceeded while awaiting headers)", Timeout},
		{0, "unexpected error when reading response body. Please retry. Original error: net/http: request canceled (Client.Timeout or context cancellation while reading body)", Timeout},
	} {
		t.Run(tc.message, func(t *testing.T) {
			NewWithT(t).Expect(Classify(tc.code, tc.message)).To(Equal(tc.want))
		})
	}
}

func TestStatusCode(t *testing.T) {
	g := NewWithT(t)
	g.Expect(statusCode(apierrors.NewInternalError(errors.New("etcdserver: server stopped")))).To(Equal(500))
	g.Expect(statusCode(apierrors.NewTimeoutError("slow", 1))).To(Equal(504))
	g.Expect(statusCode(errors.New("dial tcp 127.0.0.1:1: connect: connection refused"))).To(Equal(0))
}
