package cli

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/druid-stretch/druid-stretch/internal/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/localetcd/etcdtest"
)

// A learner's gate serves once etcd answers (its health is judged through
// it), and the learner's refusal of a write reaches the client through the
// gate as etcd sent it, not as a stream closed without a status.
func TestLearnerErrorsPassItsGate(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := etcdtest.Start(t, etcdtest.Options{Names: etcdtest.Numbered("m", 1)})
	learner, err := c.Runtime.JoinAsLearner(ctx, "m-1", localetcd.MemberOptions{}, c.Members[0])
	g.Expect(err).NotTo(HaveOccurred())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	address := l.Addr().String()
	g.Expect(l.Close()).To(Succeed())
	flags := gateFlags{address: address, backend: learner.LocalClientURL}
	_, stop, err := flags.start(learner.ClientTLSConfig(), testr.New(t))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(stop)
	g.Eventually(func() error {
		conn, err := net.DialTimeout("tcp", address, time.Second)
		if err == nil {
			_ = conn.Close()
		}
		return err
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + address}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	for range 20 {
		callCtx, callCancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := cli.Put(callCtx, "/gate/learner", "1")
		callCancel()
		g.Expect(err).To(MatchError(ContainSubstring("rpc not supported for learner")))
	}
}
