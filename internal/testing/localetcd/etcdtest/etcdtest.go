// Package etcdtest starts a real etcd cluster with TLS and an in-process
// sidecar beside each member, for the tests of the packages that drive
// sidecars (sidecar, membership, rebalance). Only tests import it: it
// reports failures through testing.TB and ends everything on t.Cleanup.
package etcdtest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/internal/testing/linkemu"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// Options configure Start.
type Options struct {
	// Names are the members bootstrapped together as a new cluster.
	Names []string
	// Sites, when set, puts the members behind a WAN, Names[i] in Sites[i].
	// Sites beyond the names get their delays too, for members a test adds
	// later.
	Sites []string
	// OneWay is the WAN delay between every two sites (half the RTT).
	OneWay time.Duration
	// Heartbeat and Election are etcd's timing; zero keeps localetcd's
	// defaults.
	Heartbeat, Election time.Duration
	// Logger receives the runtime's and the sidecars' logs; default testr.
	Logger logr.Logger
	// SidecarPollInterval is the sidecars' background poll (sidecar
	// Config.PollInterval); zero keeps its default, below zero turns it off.
	SidecarPollInterval time.Duration
	// Wrap, when set, serves the handler it returns in front of a member's
	// sidecar (to inject faults); the sidecar is still closed with the
	// runtime.
	Wrap func(m *localetcd.Member, s *sidecar.Server) http.Handler
	// ClientName is the common name of ClientTLS's certificate, the caller
	// the sidecars log; default "etcdtest-client".
	ClientName string
}

// Cluster is a running test cluster.
type Cluster struct {
	// Runtime runs the members; tests add members through it.
	Runtime *localetcd.Runtime
	// CA issued every certificate of the cluster.
	CA *pki.CA
	// WAN is the emulated WAN between the sites; nil without Options.Sites.
	WAN *linkemu.WAN
	// Members are the members Start bootstrapped, in Options.Names order.
	Members []*localetcd.Member
	// ClientTLS holds a client certificate from CA, as an operator's tool
	// would, for calling the sidecars.
	ClientTLS *tls.Config
}

// Numbered returns the names prefix-0 .. prefix-(n-1).
func Numbered(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return names
}

// Start bootstraps the cluster and returns once every member serves. On a
// failed test the cleanup logs each member's etcd log tail before ending
// the members, their sidecars and the WAN.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	// etcd processes are real parts: a test that starts them is skipped
	// under -short (make test-unit) even if it forgot testbin.Need.
	testbin.Need(t)
	if o.Sites != nil && len(o.Sites) < len(o.Names) {
		t.Fatalf("etcdtest: %d sites for %d members: every member needs a site", len(o.Sites), len(o.Names))
	}
	if o.Logger.GetSink() == nil {
		o.Logger = testr.NewWithInterface(t, testr.Options{LogTimestamp: true})
	}
	if o.ClientName == "" {
		o.ClientName = "etcdtest-client"
	}
	ca, err := pki.NewCA("etcdtest-ca")
	if err != nil {
		t.Fatalf("creating the CA: %v", err)
	}
	c := &Cluster{CA: ca}
	opts := localetcd.Options{
		Dir:               t.TempDir(),
		CA:                ca,
		HeartbeatInterval: o.Heartbeat,
		ElectionTimeout:   o.Election,
		Logger:            o.Logger,
		Sidecar:           c.newSidecar(o),
	}
	if o.Sites != nil {
		c.WAN = linkemu.NewWAN()
		opts.WAN = c.WAN
		for i, a := range o.Sites {
			for _, b := range o.Sites[i+1:] {
				c.WAN.SetDelay(a, b, o.OneWay)
			}
		}
	}
	if c.Runtime, err = localetcd.New(opts); err != nil {
		if c.WAN != nil {
			_ = c.WAN.Close()
		}
		t.Fatalf("localetcd.New: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range c.Runtime.Members() {
				t.Logf("log tail of %s:\n%s", m.Name, m.LogTail(20))
			}
		}
		if err := c.Runtime.Close(); err != nil {
			t.Errorf("closing the runtime: %v", err)
		}
		if c.WAN != nil {
			_ = c.WAN.Close()
		}
	})
	for i, name := range o.Names {
		var site string
		if o.Sites != nil {
			site = o.Sites[i]
		}
		m, err := c.Runtime.NewMember(name, localetcd.MemberOptions{Site: site})
		if err != nil {
			t.Fatalf("NewMember: %v", err)
		}
		c.Members = append(c.Members, m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Runtime.StartMembers(ctx, c.Members...); err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	pair, err := ca.Issue(o.ClientName, "localhost")
	if err != nil {
		t.Fatalf("issuing the client certificate: %v", err)
	}
	if c.ClientTLS, err = ca.ClientConfig(&pair); err != nil {
		t.Fatalf("client TLS: %v", err)
	}
	return c
}

// newSidecar builds each member's sidecar as the member's pod would run it.
func (c *Cluster) newSidecar(o Options) func(m *localetcd.Member) (http.Handler, error) {
	return func(m *localetcd.Member) (http.Handler, error) {
		s, err := sidecar.New(sidecar.Config{
			Endpoints:    localetcd.SidecarEndpoints(m, c.Runtime.Members()),
			EtcdTLS:      m.ClientTLSConfig(),
			Registry:     prometheus.NewRegistry(),
			Logger:       o.Logger.WithValues("sidecar", m.Name),
			PollInterval: o.SidecarPollInterval,
		})
		if err != nil {
			return nil, err
		}
		if o.Wrap == nil {
			return s, nil
		}
		return closingHandler{Handler: o.Wrap(m, s), close: s.Close}, nil
	}
}

// closingHandler lets the runtime close the sidecar behind a wrapper.
type closingHandler struct {
	http.Handler
	close func() error
}

func (h closingHandler) Close() error { return h.close() }

// MemberList is etcd's member list read directly, not through a sidecar,
// for comparing the membership before and after. With via it asks those
// members on their own client ports (past the WAN, as their sidecars do);
// without, any running member on its advertised URL.
func (c *Cluster) MemberList(g gomega.Gomega, via ...*localetcd.Member) []*etcdserverpb.Member {
	var eps []string
	tlsCfg := c.Members[0].ClientTLSConfig()
	if len(via) > 0 {
		tlsCfg = via[0].ClientTLSConfig()
		for _, m := range via {
			eps = append(eps, m.LocalClientURL)
		}
	} else {
		for _, m := range c.Runtime.Members() {
			if m.Running() {
				eps = append(eps, m.ClientURL)
			}
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: tlsCfg, DialTimeout: 5 * time.Second})
	g.Expect(err).NotTo(gomega.HaveOccurred())
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	g.Expect(err).NotTo(gomega.HaveOccurred())
	return resp.Members
}

// NoSpaceAlarm raises etcd's NOSPACE alarm for member m, through m's own
// client port, as m's quota check would when its backend outgrows
// --quota-backend-bytes (clientv3 only lists and disarms alarms, so the raw
// maintenance service raises it). The returned func disarms it.
func (c *Cluster) NoSpaceAlarm(g gomega.Gomega, m *localetcd.Member) (disarm func()) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, TLS: m.ClientTLSConfig(), DialTimeout: 5 * time.Second})
	g.Expect(err).NotTo(gomega.HaveOccurred())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	status, err := cli.Status(ctx, m.ClientURL)
	g.Expect(err).NotTo(gomega.HaveOccurred())
	id := status.Header.MemberId
	_, err = etcdserverpb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &etcdserverpb.AlarmRequest{
		Action: etcdserverpb.AlarmRequest_ACTIVATE, MemberID: id, Alarm: etcdserverpb.AlarmType_NOSPACE,
	})
	g.Expect(err).NotTo(gomega.HaveOccurred())
	return func() {
		defer func() { _ = cli.Close() }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: id, Alarm: etcdserverpb.AlarmType_NOSPACE})
		g.Expect(err).NotTo(gomega.HaveOccurred())
	}
}
