package sidecar_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestRefusalsChangeNothing sends every kind of bad or refused call to a
// real cluster's sidecar and compares etcd's member list before and after
// each one.
func TestRefusalsChangeNothing(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, 3, clusterOptions{})
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	via := tc.Members[0]
	c := tc.client(via)
	list, err := c.Members(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	leader := leaderName(list)
	g.Expect(leader).NotTo(BeEmpty())
	var follower *sidecar.Member
	for i, m := range list.Members {
		if !m.IsLeader {
			follower = &list.Members[i]
		}
	}
	url := via.SidecarURL
	withCert, anonymous := tc.httpClient(via, true), tc.httpClient(via, false)
	foreignCA, err := pki.NewCA("foreign-ca")
	g.Expect(err).NotTo(HaveOccurred())
	foreignPair, err := foreignCA.Issue("intruder", "127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	foreignCert, err := foreignPair.Certificate()
	g.Expect(err).NotTo(HaveOccurred())
	// Forced on the server: Go's client would otherwise send no certificate
	// that the server's list of acceptable CAs does not name.
	foreign := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: tc.CA.Pool(), MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &foreignCert, nil },
	}}}

	// Another controller holds the membership lock during the table.
	_, err = tc.client(tc.Members[1]).AcquireLock(ctx, "other-controller", "", time.Minute)
	g.Expect(err).NotTo(HaveOccurred())

	addBody := func(name, peer string) string {
		return fmt.Sprintf(`{"name":%q,"peerURLs":[%q],"learner":true}`, name, peer)
	}
	const newPeer = "https://127.0.0.1:1"
	for _, tc2 := range []struct {
		name         string
		method, path string
		body         string
		header       map[string]string
		client       *http.Client
		wantCode     int
		wantReason   string
	}{
		{"malformed JSON", "POST", "/v1/members", `{"name":"x",`, nil, withCert, 400, sidecar.ReasonMalformedRequest},
		{"not an object", "POST", "/v1/members", `["x"]`, nil, withCert, 400, sidecar.ReasonMalformedRequest},
		{"empty body", "POST", "/v1/members", ``, nil, withCert, 400, sidecar.ReasonMalformedRequest},
		{"unknown field", "POST", "/v1/members", `{"name":"x","peerURLs":["https://127.0.0.1:1"],"learner":true,"voter":true}`, nil, withCert, 400, sidecar.ReasonMalformedRequest},
		{"trailing data", "POST", "/v1/members", addBody("x", newPeer) + `{}`, nil, withCert, 400, sidecar.ReasonMalformedRequest},
		{"wrong field type", "POST", "/v1/members", `{"name":"x","peerURLs":"https://127.0.0.1:1","learner":true}`, nil, withCert, 400, sidecar.ReasonMalformedRequest},
		{"empty name", "POST", "/v1/members", addBody("", newPeer), nil, withCert, 400, sidecar.ReasonInvalidName},
		{"invalid name", "POST", "/v1/members", addBody("etcd 9", newPeer), nil, withCert, 400, sidecar.ReasonInvalidName},
		{"no peer URLs", "POST", "/v1/members", `{"name":"x","peerURLs":[],"learner":true}`, nil, withCert, 400, sidecar.ReasonInvalidURL},
		{"peer URL without scheme", "POST", "/v1/members", addBody("x", "127.0.0.1:2380"), nil, withCert, 400, sidecar.ReasonInvalidURL},
		{"peer URL without port", "POST", "/v1/members", addBody("x", "https://127.0.0.1"), nil, withCert, 400, sidecar.ReasonInvalidURL},
		{"peer URL with a path", "POST", "/v1/members", addBody("x", "https://127.0.0.1:2380/x"), nil, withCert, 400, sidecar.ReasonInvalidURL},
		{"peer URL not http", "POST", "/v1/members", addBody("x", "unix://127.0.0.1:2380"), nil, withCert, 400, sidecar.ReasonInvalidURL},
		{"voter add", "POST", "/v1/members", `{"name":"x","peerURLs":["https://127.0.0.1:1"]}`, nil, withCert, 400, sidecar.ReasonInvalidArgument},
		{"peer URL of another member", "POST", "/v1/members", addBody("x", follower.PeerURLs[0]), nil, withCert, 409, sidecar.ReasonPeerURLConflict},
		{"name of another member", "POST", "/v1/members", addBody(follower.Name, newPeer), nil, withCert, 409, sidecar.ReasonNameConflict},
		{"promote unknown member", "POST", "/v1/members/nobody/promote", ``, nil, withCert, 404, sidecar.ReasonMemberNotFound},
		{"promote invalid name", "POST", "/v1/members/bad%20name/promote", ``, nil, withCert, 400, sidecar.ReasonInvalidName},
		{"remove invalid name", "DELETE", "/v1/members/bad%2Fname", ``, nil, withCert, 400, sidecar.ReasonInvalidName},
		{"remove the leader", "DELETE", "/v1/members/" + leader, ``, nil, withCert, 409, sidecar.ReasonIsLeader},
		{"leader to unknown member", "POST", "/v1/leader", `{"name":"nobody"}`, nil, withCert, 404, sidecar.ReasonMemberNotFound},
		{"leader empty name", "POST", "/v1/leader", `{"name":""}`, nil, withCert, 400, sidecar.ReasonInvalidName},
		{"leader malformed", "POST", "/v1/leader", `{"nam":"x"}`, nil, withCert, 400, sidecar.ReasonMalformedRequest},
		{"no client cert: add", "POST", "/v1/members", addBody("x", newPeer), nil, anonymous, 401, sidecar.ReasonUnauthorized},
		{"no client cert: promote", "POST", "/v1/members/" + follower.Name + "/promote", ``, nil, anonymous, 401, sidecar.ReasonUnauthorized},
		{"no client cert: remove", "DELETE", "/v1/members/" + follower.Name, ``, nil, anonymous, 401, sidecar.ReasonUnauthorized},
		{"no client cert: leader", "POST", "/v1/leader", fmt.Sprintf(`{"name":%q}`, follower.Name), nil, anonymous, 401, sidecar.ReasonUnauthorized},
		{"no client cert: lock", "POST", "/v1/lock", `{"holder":"me","ttlSeconds":60}`, nil, anonymous, 401, sidecar.ReasonUnauthorized},
		{"no client cert: unlock", "DELETE", "/v1/lock", ``, map[string]string{sidecar.HeaderLockHolder: "other-controller"}, anonymous, 401, sidecar.ReasonUnauthorized},
		{"stale fingerprint: remove", "DELETE", "/v1/members/" + follower.Name, ``, map[string]string{sidecar.HeaderMembership: "0123456789abcdef"}, withCert, 409, sidecar.ReasonMembershipChanged},
		{"stale fingerprint: add", "POST", "/v1/members", addBody("x", newPeer), map[string]string{sidecar.HeaderMembership: "0123456789abcdef"}, withCert, 409, sidecar.ReasonMembershipChanged},
		{"stale fingerprint: leader", "POST", "/v1/leader", fmt.Sprintf(`{"name":%q}`, follower.Name), map[string]string{sidecar.HeaderMembership: "0123456789abcdef"}, withCert, 409, sidecar.ReasonMembershipChanged},
		{"lock held by another: remove", "DELETE", "/v1/members/" + follower.Name, ``, map[string]string{sidecar.HeaderLockHolder: "me"}, withCert, 409, sidecar.ReasonLockHeld},
		{"lock held by another: add", "POST", "/v1/members", addBody("x", newPeer), map[string]string{sidecar.HeaderLockHolder: "me"}, withCert, 409, sidecar.ReasonLockHeld},
		{"lock held by another: acquire", "POST", "/v1/lock", `{"holder":"me","ttlSeconds":60}`, nil, withCert, 409, sidecar.ReasonLockHeld},
		{"lock held by another: release", "DELETE", "/v1/lock", ``, map[string]string{sidecar.HeaderLockHolder: "me"}, withCert, 409, sidecar.ReasonLockHeld},
		{"lock holder header invalid", "DELETE", "/v1/members/" + follower.Name, ``, map[string]string{sidecar.HeaderLockHolder: "me you"}, withCert, 400, sidecar.ReasonInvalidName},
		{"lock TTL out of range", "POST", "/v1/lock", `{"holder":"me","ttlSeconds":0}`, nil, withCert, 400, sidecar.ReasonInvalidArgument},
		{"release without holder", "DELETE", "/v1/lock", ``, nil, withCert, 400, sidecar.ReasonInvalidArgument},
		{"unknown endpoint", "POST", "/v1/members/" + follower.Name + "/demote", ``, nil, withCert, 404, sidecar.ReasonNotFound},
		// Calls whose effect is in place already answer success and
		// change nothing.
		{"promote a voter", "POST", "/v1/members/" + follower.Name + "/promote", ``, nil, withCert, 200, ""},
		{"remove a member that is gone", "DELETE", "/v1/members/nobody", ``, nil, withCert, 200, ""},
		{"leader to the leader", "POST", "/v1/leader", fmt.Sprintf(`{"name":%q}`, leader), nil, withCert, 200, ""},
		{"add a member that is there", "POST", "/v1/members", fmt.Sprintf(`{"name":%q,"peerURLs":%q,"learner":true}`, follower.Name, follower.PeerURLs), nil, withCert, 200, ""},
		{"read without client cert", "GET", "/v1/members", ``, nil, anonymous, 401, sidecar.ReasonUnauthorized},
	} {
		t.Run(tc2.name, func(t *testing.T) {
			g := NewWithT(t)
			before := tc.membership(g, via)
			code, reason, err := rawCall(tc2.client, tc2.method, url+tc2.path, tc2.body, tc2.header)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(code).To(Equal(tc2.wantCode))
			g.Expect(reason).To(Equal(tc2.wantReason))
			g.Expect(tc.membership(g, via)).To(Equal(before))
		})
	}

	t.Run("client certificate from another CA", func(t *testing.T) {
		g := NewWithT(t)
		before := tc.membership(g, via)
		_, _, err := rawCall(foreign, "DELETE", url+"/v1/members/"+follower.Name, ``, nil)
		g.Expect(err).To(MatchError(ContainSubstring("certificate")))
		g.Expect(tc.membership(g, via)).To(Equal(before))
	})

	t.Run("lock expired or released", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(tc.client(tc.Members[1]).ReleaseLock(ctx, "other-controller", "")).To(Succeed())
		before := tc.membership(g, via)
		_, err := c.Remove(ctx, follower.Name, sidecar.CallOptions{LockHolder: "me"})
		g.Expect(sidecar.IsReason(err, sidecar.ReasonLockNotHeld)).To(BeTrue(), "%v", err)
		g.Expect(tc.membership(g, via)).To(Equal(before))
	})

	t.Run("too many learners", func(t *testing.T) {
		g := NewWithT(t)
		original := tc.membership(g, via)
		var first *sidecar.ChangeResult
		retryWhile(g, sidecar.ReasonUnhealthyCluster, 30*time.Second, func() (err error) {
			first, err = c.AddLearner(ctx, "learner-1", []string{"https://127.0.0.1:2"}, sidecar.CallOptions{})
			return err
		})
		withLearner := tc.membership(g, via)
		g.Expect(withLearner).To(HaveLen(len(original) + 1))
		_, err := c.AddLearner(ctx, "learner-2", []string{"https://127.0.0.1:3"}, sidecar.CallOptions{})
		g.Expect(sidecar.IsReason(err, sidecar.ReasonTooManyLearners)).To(BeTrue(), "%v", err)
		g.Expect(tc.membership(g, via)).To(Equal(withLearner))
		// The learner never started, so it has no name: address it by ID.
		_, err = c.Promote(ctx, first.Member.ID, sidecar.CallOptions{})
		g.Expect(sidecar.IsReason(err, sidecar.ReasonLearnerNotReady)).To(BeTrue(), "%v", err)
		g.Expect(tc.membership(g, via)).To(Equal(withLearner))
		_, err = c.MoveLeader(ctx, first.Member.ID, sidecar.CallOptions{})
		g.Expect(sidecar.IsReason(err, sidecar.ReasonNotVoter)).To(BeTrue(), "%v", err)
		g.Expect(tc.membership(g, via)).To(Equal(withLearner))
		removed, err := c.Remove(ctx, first.Member.ID, sidecar.CallOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(removed.Changed).To(BeTrue())
		g.Expect(tc.membership(g, via)).To(Equal(original))
	})

	t.Run("metrics count refusals by reason", func(t *testing.T) {
		g := NewWithT(t)
		resp, err := anonymous.Get(url + "/metrics")
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		g.Expect(err).NotTo(HaveOccurred())
		count := func(endpoint, code, reason string) int {
			re := regexp.MustCompile(`druid_stretch_sidecar_requests_total\{code="` + code + `",endpoint="` + regexp.QuoteMeta(endpoint) + `",reason="` + reason + `"\} (\d+)`)
			m := re.FindSubmatch(body)
			if m == nil {
				return 0
			}
			n, _ := strconv.Atoi(string(m[1]))
			return n
		}
		g.Expect(count("POST /v1/members", "400", sidecar.ReasonMalformedRequest)).To(Equal(6))
		g.Expect(count("DELETE /v1/members/{name}", "401", sidecar.ReasonUnauthorized)).To(Equal(1))
		g.Expect(count("POST /v1/members", "409", sidecar.ReasonTooManyLearners)).To(Equal(1))
		g.Expect(string(body)).To(ContainSubstring(`druid_stretch_sidecar_operation_duration_seconds_count{operation="remove",reason="OK"} 2`))
		g.Expect(strings.Count(string(body), "druid_stretch_sidecar_operation_duration_seconds_bucket")).To(BeNumerically(">", 0))
	})
}
