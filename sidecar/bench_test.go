package sidecar_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/druid-stretch/druid-stretch/sidecar"
)

// BenchmarkSidecarOverhead compares a call through the sidecar (HTTPS, JSON,
// and what the sidecar does per call: a linearizable member list and lock
// read, a tombstone read, a status poll of every member) with calling etcd
// directly on the same 3-member TLS cluster.
func BenchmarkSidecarOverhead(b *testing.B) {
	tc := startCluster(b, 3, clusterOptions{logger: logr.Discard()})
	m := tc.Members[0]
	direct, err := clientv3.New(clientv3.Config{Endpoints: []string{m.LocalClientURL}, TLS: m.ClientTLSConfig(), DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = direct.Close() })
	var statusClients []*clientv3.Client
	for _, o := range tc.Members {
		sc, err := clientv3.New(clientv3.Config{Endpoints: []string{o.ClientURL}, TLS: o.ClientTLSConfig(), DialTimeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = sc.Close() })
		statusClients = append(statusClients, sc)
	}
	c := tc.client(m)
	ctx := context.Background()

	b.Run("clientv3/MemberList", func(b *testing.B) {
		for b.Loop() {
			if _, err := direct.MemberList(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	// What GET /v1/members does, done naively with clientv3: its
	// Maintenance.Status dials a new TLS connection per call, which the
	// sidecar avoids by keeping one connection per member.
	b.Run("clientv3/MemberList+Get+Status-each-dialing", func(b *testing.B) {
		for b.Loop() {
			if _, err := direct.MemberList(ctx); err != nil {
				b.Fatal(err)
			}
			if _, err := direct.Get(ctx, "/druid-stretch/lock"); err != nil {
				b.Fatal(err)
			}
			var wg sync.WaitGroup
			for i, sc := range statusClients {
				wg.Go(func() {
					if _, err := sc.Status(ctx, tc.Members[i].ClientURL); err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
		}
	})
	b.Run("sidecar/GET-members", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.Members(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sidecar/promote-voter-noop", func(b *testing.B) {
		for b.Loop() {
			res, err := c.Promote(ctx, m.Name, sidecar.CallOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if res.Changed {
				b.Fatal("promoting a voter changed something")
			}
		}
	})
}
