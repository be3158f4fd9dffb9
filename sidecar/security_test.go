package sidecar_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/druid-stretch/druid-stretch/internal/clientgate"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
	"github.com/druid-stretch/druid-stretch/internal/testing/refusaldoc"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// controllerIdentity is the one identity the secured sidecar lets change
// membership, as the chart's default sidecar.allowedClients.
const controllerIdentity = "druid-stretch-controller"

// securedSidecar is a sidecar served as the sidecar command serves it:
// Serve with ServerTLSConfig's files, an allow-list, and short timeouts so
// that slow clients are cut within the test.
type securedSidecar struct {
	url, addr string
	limits    sidecar.Limits
	// gate is the client gate in front of via, which the sidecar drains
	// and holds.
	gate *clientgate.Gate
}

func startSecuredSidecar(t *testing.T, tc *testCluster, via *localetcd.Member, limits sidecar.Limits) *securedSidecar {
	t.Helper()
	g := NewWithT(t)
	b, err := tc.CA.IssueFiles(t.TempDir(), "sidecar", "127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	serverTLS, err := sidecar.ServerTLSConfig(t.Context(), b.CertFile, b.KeyFile, b.CAFile)
	g.Expect(err).NotTo(HaveOccurred())
	backend, err := url.Parse(via.LocalClientURL)
	g.Expect(err).NotTo(HaveOccurred())
	gateTLS, err := tls.LoadX509KeyPair(b.CertFile, b.KeyFile)
	g.Expect(err).NotTo(HaveOccurred())
	gate, err := clientgate.New(clientgate.Options{Backend: backend, BackendTLS: via.ClientTLSConfig(),
		ServerTLS: &tls.Config{Certificates: []tls.Certificate{gateTLS}, MinVersion: tls.VersionTLS12}})
	g.Expect(err).NotTo(HaveOccurred())
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	gateServed := make(chan error, 1)
	go func() { gateServed <- gate.Serve(gl) }()
	srv, err := sidecar.New(sidecar.Config{
		Endpoints:      localetcd.SidecarEndpoints(via, tc.Runtime.Members()),
		EtcdTLS:        via.ClientTLSConfig(),
		AllowedClients: []string{controllerIdentity},
		Limits:         limits,
		ClientGate:     gate,
		Registry:       prometheus.NewRegistry(),
		Logger:         testr.New(t),
	})
	g.Expect(err).NotTo(HaveOccurred())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l, serverTLS) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serving the sidecar: %v", err)
		}
		if err := srv.Close(); err != nil {
			t.Errorf("closing the sidecar: %v", err)
		}
		_ = gate.Close()
		if err := <-gateServed; err != nil {
			t.Errorf("the gate's Serve after Close: %v", err)
		}
	})
	return &securedSidecar{url: "https://" + l.Addr().String(), addr: l.Addr().String(), limits: limits, gate: gate}
}

// answer is what one request got: a status and the sidecar's error body,
// or the transport's error when there was no HTTP answer.
type answer struct {
	code             int
	reason, message  string
	transportFailure string
	took             time.Duration // until a slow call ended
}

func (a answer) String() string {
	if a.transportFailure != "" {
		return "no HTTP answer: " + a.transportFailure
	}
	if a.reason == "" {
		return strings.TrimSpace(fmt.Sprintf("%d %s", a.code, a.message))
	}
	return fmt.Sprintf("%d %s: %s", a.code, a.reason, a.message)
}

func send(hc *http.Client, req *http.Request) answer {
	resp, err := hc.Do(req)
	if err != nil {
		return answer{transportFailure: err.Error()}
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var e struct{ Reason, Message string }
	if json.Unmarshal(body, &e) != nil {
		e.Message = strings.TrimSpace(string(body)) // the HTTP server's own answer, not JSON
	}
	return answer{code: resp.StatusCode, reason: e.Reason, message: e.Message}
}

// endlessName is the start of a valid add request whose name never ends,
// so that only the size limit can refuse it.
func endlessName(size int64) io.Reader {
	return io.MultiReader(strings.NewReader(`{"name":"`), io.LimitReader(letters{}, size-9))
}

type letters struct{}

func (letters) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	return len(p), nil
}

// TestSecurityRefusals sends every kind of bad input to a sidecar secured
// as in production (mutual TLS, an allow-list, request limits, timeouts)
// in front of a real three-member etcd cluster, compares etcd's member list
// before and after each one, and keeps docs/security-refusals-sidecar.md as
// the table of what it saw.
func TestSecurityRefusals(t *testing.T) {
	testbin.Need(t)
	tc := startCluster(t, 3, clusterOptions{})
	g := NewWithT(t)
	via := tc.Members[0]
	limits := sidecar.Limits{ReadHeaderTimeout: time.Second, ReadTimeout: 3 * time.Second, MaxInFlight: 1}
	sc := startSecuredSidecar(t, tc, via, limits)

	tlsOf := func(ca *pki.CA, cn string) *tls.Config {
		pair, err := ca.Issue(cn, "127.0.0.1")
		g.Expect(err).NotTo(HaveOccurred())
		cert, err := pair.Certificate()
		g.Expect(err).NotTo(HaveOccurred())
		// The certificate is forced on the server: Go's client would send
		// none that the server's list of acceptable CAs does not name.
		return &tls.Config{
			RootCAs: tc.CA.Pool(), MinVersion: tls.VersionTLS12,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil },
		}
	}
	clientOf := func(ca *pki.CA, cn string) *http.Client {
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsOf(ca, cn)}}
	}
	foreignCA, err := pki.NewCA("foreign-ca")
	g.Expect(err).NotTo(HaveOccurred())
	controller := clientOf(tc.CA, controllerIdentity)
	stranger := clientOf(tc.CA, "etcd-operator-laptop")
	foreignTLS := tlsOf(foreignCA, controllerIdentity)
	anonymous := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tc.CA.Pool(), MinVersion: tls.VersionTLS12}}}
	for _, hc := range []*http.Client{controller, stranger, anonymous} {
		t.Cleanup(hc.CloseIdleConnections)
	}

	controllerTLS, err := tc.CA.ClientConfig(ptrTo(must(tc.CA.Issue(controllerIdentity, "127.0.0.1"))))
	g.Expect(err).NotTo(HaveOccurred())
	controllerTLS.ServerName = "127.0.0.1"
	list, err := sidecar.NewClient(sc.url, controllerTLS).Members(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	leader := leaderName(list)
	var follower string
	for _, m := range list.Members {
		if !m.IsLeader {
			follower = m.Name
		}
	}
	g.Expect(leader).NotTo(BeEmpty())

	// The doc shows no run's ports, member IDs or leader: they differ per run.
	var tokenNames map[string]string // this run's lock tokens and what the doc calls them
	normalize := func(s string) string {
		for token, name := range tokenNames {
			s = strings.ReplaceAll(s, token, name)
		}
		s = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`).ReplaceAllString(s, "{time}")
		// Remaining times of the lock's lease and of a hold.
		s = regexp.MustCompile(`for \d+ more seconds`).ReplaceAllString(s, "for {n} more seconds")
		s = regexp.MustCompile(`for [0-9.]+m?s more`).ReplaceAllString(s, "for {left} more")
		s = strings.ReplaceAll(s, sc.addr, "{sidecar}")
		s = regexp.MustCompile(`(?i)(127\.0\.0\.1|localhost\.?|\[::1\]|\[::ffff:127\.0\.0\.1\]):(0?)\d{2,5}\b`).ReplaceAllString(s, "$1:${2}{port}")
		s = regexp.MustCompile(`\b[0-9a-f]{12,16}\b`).ReplaceAllString(s, "{member-id}")
		s = strings.ReplaceAll(s, leader, "{leader}")
		return strings.ReplaceAll(s, follower, "{follower}")
	}
	summary := func(members []string) string {
		return fmt.Sprintf("%d members, %d learners", len(members), len(slices.DeleteFunc(slices.Clone(members), func(m string) bool { return !strings.Contains(m, "learner=true") })))
	}
	table := &refusaldoc.Table{
		Title: "Bad input against the membership sidecar",
		Intro: "Generated by `TestSecurityRefusals` (sidecar/security_test.go): each row was sent to a sidecar served as in production " +
			"(mutual TLS with the client CA, `--allowed-client=" + controllerIdentity + "`, the request limits; for the test a 1 s header timeout, " +
			"a 3 s read timeout and one call in flight) in front of a real three-member etcd cluster. " +
			"\"state\" is etcd's member list read directly from etcd, not through the sidecar; the test compares member IDs, names, learner flags and peer URLs " +
			"before and after every row and fails if anything changed. The rows on the membership lock and the client gate also show the lock key's value read directly from etcd " +
			"and the state of the client gate in front of the member (ready: not drained; held: new calls wait), compared before and after the same way. `{leader}`, `{follower}`, `{member-id}`, `{sidecar}`, `{port}`, `{time}`, `{n}`, `{left}` and the `{token…}` " +
			"(a real process's lock token; `{token-1h}` of a process started an hour before, `{token+10m}` of one that claims to start in 10 minutes) stand for what differs per run.",
	}
	// extraState, when set, is more state a group of rows must leave
	// unchanged (the lock, the client gate), read directly, shown beside
	// the member list.
	var extraState func(Gomega) string
	// try sends one input, checks the answer and that etcd's membership
	// (and extraState) is unchanged, and adds the row.
	try := func(input, target string, do func() answer, check func(Gomega, answer)) {
		t.Helper()
		t.Run(input, func(t *testing.T) {
			g := NewWithT(t)
			before := tc.membership(g, via)
			var extraBefore string
			if extraState != nil {
				extraBefore = extraState(g)
			}
			a := do()
			check(g, a)
			after := tc.membership(g, via)
			g.Expect(after).To(Equal(before), "the membership changed")
			state := summary(before)
			if extraState != nil {
				g.Expect(extraState(g)).To(Equal(extraBefore), "the state beside the membership changed")
				state += "; " + normalize(extraBefore)
			}
			table.Add(refusaldoc.Row{Input: input, Target: normalize(target), Answer: normalize(a.String()),
				Before: state, After: "unchanged"})
		})
	}
	refused := func(code int, reason string) func(Gomega, answer) {
		return func(g Gomega, a answer) {
			g.Expect(a.transportFailure).To(BeEmpty())
			g.Expect(a.code).To(Equal(code), "%s", a)
			g.Expect(a.reason).To(Equal(reason), "%s", a)
			g.Expect(a.message).NotTo(BeEmpty())
		}
	}
	call := func(hc *http.Client, method, path, body string, header map[string]string) func() answer {
		return func() answer {
			req, err := http.NewRequest(method, sc.url+path, strings.NewReader(body))
			if err != nil {
				return answer{transportFailure: err.Error()}
			}
			for k, v := range header {
				req.Header.Set(k, v)
			}
			return send(hc, req)
		}
	}
	add := func(name, peer string) string {
		return fmt.Sprintf(`{"name":%q,"peerURLs":[%q],"learner":true}`, name, peer)
	}
	const newPeer = "https://127.0.0.1:1"
	type request struct{ method, path, body string }
	mutations := []request{
		{"POST", "/v1/members", add("x", newPeer)},
		{"POST", "/v1/members/" + follower + "/promote", ""},
		{"DELETE", "/v1/members/" + follower, ""},
		{"POST", "/v1/leader", fmt.Sprintf(`{"name":%q}`, follower)},
		{"POST", "/v1/lock", `{"holder":"me","ttlSeconds":10}`},
		{"PUT", "/v1/retired/" + follower, `{"by":"me"}`},
		{"DELETE", "/v1/lock", ""},
		{"DELETE", "/v1/retired/" + follower, ""},
		{"POST", "/v1/clients/drain", ""},
		{"DELETE", "/v1/clients/drain", ""},
		{"POST", "/v1/clients/hold", ""},
		{"DELETE", "/v1/clients/hold", ""},
	}

	// Who may call: mutual TLS, then the allow-list.
	try("no client certificate", "GET /v1/members", call(anonymous, "GET", "/v1/members", "", nil), refused(401, sidecar.ReasonUnauthorized))
	for _, m := range mutations {
		try("no client certificate", m.method+" "+m.path, call(anonymous, m.method, m.path, m.body, nil), refused(401, sidecar.ReasonUnauthorized))
	}
	// A certificate of another CA is refused in the TLS handshake, before
	// any request. With TLS 1.3 the client learns it only from the server's
	// alert after its own handshake ended, so the client reads without
	// writing: a request sent at once could reach the server after it gave
	// up, and closing a socket with unread data resets it, which would
	// race the alert away.
	try("a client certificate from another CA (common name "+controllerIdentity+")", "the TLS handshake, before any request", func() answer {
		conn, err := tls.Dial("tcp", sc.addr, foreignTLS)
		if err != nil {
			return answer{transportFailure: err.Error()}
		}
		defer func() { _ = conn.Close() }()
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err != nil {
			return answer{transportFailure: err.Error()}
		}
		return answer{transportFailure: "the server accepted the connection"}
	}, func(g Gomega, a answer) {
		g.Expect(a.transportFailure).To(Equal("remote error: tls: unknown certificate authority"), "the TLS handshake refuses the certificate")
	})
	for _, m := range mutations {
		try("a certificate of the client CA whose identity is not allowed (etcd-operator-laptop)", m.method+" "+m.path, call(stranger, m.method, m.path, m.body, nil), refused(403, sidecar.ReasonForbidden))
	}
	try("plain HTTP to the sidecar's TLS port", "GET /v1/members", func() answer {
		req, _ := http.NewRequest("GET", "http://"+sc.addr+"/v1/members", nil)
		return send(&http.Client{Timeout: 10 * time.Second}, req)
	}, func(g Gomega, a answer) { g.Expect(a.code).To(Equal(400), "%s", a) })

	// Headers that name a caller are no identity.
	forged := map[string]map[string]string{
		"X-Forwarded-Client-Cert naming the controller":            {"X-Forwarded-Client-Cert": `Hash=0;Subject="CN=` + controllerIdentity + `"`},
		"X-Remote-User and X-Forwarded-User naming the controller": {"X-Remote-User": controllerIdentity, "X-Forwarded-User": controllerIdentity},
		"Authorization: Bearer":                                    {"Authorization": "Bearer " + controllerIdentity},
		"the lock-holder header naming the controller":             {sidecar.HeaderLockHolder: controllerIdentity},
	}
	for _, what := range []string{"X-Forwarded-Client-Cert naming the controller", "X-Remote-User and X-Forwarded-User naming the controller", "Authorization: Bearer", "the lock-holder header naming the controller"} {
		try("no client certificate, forged header: "+what, "DELETE /v1/members/"+follower, call(anonymous, "DELETE", "/v1/members/"+follower, "", forged[what]), refused(401, sidecar.ReasonUnauthorized))
		try("a not-allowed certificate, forged header: "+what, "DELETE /v1/members/"+follower, call(stranger, "DELETE", "/v1/members/"+follower, "", forged[what]), refused(403, sidecar.ReasonForbidden))
	}

	// Size and time.
	// hundredMB posts a 100 MB add request whose name never ends, its
	// length announced or, with length -1, chunked.
	hundredMB := func(hc *http.Client, length int64) func() answer {
		return func() answer {
			req, _ := http.NewRequest("POST", sc.url+"/v1/members", io.NopCloser(endlessName(100<<20)))
			req.ContentLength = length
			return send(hc, req)
		}
	}
	try("a 100 MB body, Content-Length announced", "POST /v1/members", hundredMB(controller, 100<<20), refused(413, sidecar.ReasonRequestTooLarge))
	try("a 100 MB body, chunked", "POST /v1/members", hundredMB(controller, -1), refused(413, sidecar.ReasonRequestTooLarge))
	try("a 100 MB body without a client certificate", "POST /v1/members", hundredMB(anonymous, 100<<20), refused(401, sidecar.ReasonUnauthorized))
	try("64 KiB of request headers", "GET /v1/members", func() answer {
		req, _ := http.NewRequest("GET", sc.url+"/v1/members", nil)
		req.Header.Set("X-Padding", strings.Repeat("a", 64<<10))
		return send(controller, req)
	}, func(g Gomega, a answer) { g.Expect(a.code).To(Equal(http.StatusRequestHeaderFieldsTooLarge), "%s", a) })
	// slow opens a connection, sends partial (after the TLS handshake,
	// when handshake), and never the rest: the server must end it.
	slow := func(handshake bool, partial string) func() answer {
		return func() answer {
			conn, err := net.Dial("tcp", sc.addr)
			if err != nil {
				return answer{transportFailure: err.Error()}
			}
			defer func() { _ = conn.Close() }()
			if handshake {
				tc := tls.Client(conn, controllerTLS.Clone())
				if err := tc.Handshake(); err != nil {
					return answer{transportFailure: err.Error()}
				}
				if _, err := tc.Write([]byte(partial)); err != nil {
					return answer{transportFailure: err.Error()}
				}
				conn = tc
			}
			start := time.Now()
			_ = conn.SetReadDeadline(start.Add(30 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
					return answer{transportFailure: "the server closed the connection", took: time.Since(start)}
				}
				return answer{transportFailure: err.Error(), took: time.Since(start)}
			}
			defer func() { _ = resp.Body.Close() }()
			var e struct{ Reason, Message string }
			_ = json.NewDecoder(resp.Body).Decode(&e)
			return answer{code: resp.StatusCode, reason: e.Reason, message: e.Message, took: time.Since(start)}
		}
	}
	// endedAfter: the server ended the call once timeout passed, not
	// before and not much later.
	endedAfter := func(timeout time.Duration, closed bool) func(Gomega, answer) {
		return func(g Gomega, a answer) {
			if closed {
				g.Expect(a.transportFailure).To(Equal("the server closed the connection"), "%s", a)
			} else {
				g.Expect(a.code).To(Equal(400), "%s", a)
				g.Expect(a.message).To(ContainSubstring("timeout"), "%s", a)
			}
			g.Expect(a.took).To(BeNumerically(">=", timeout-100*time.Millisecond))
			// Generous: a busy machine delays the server's timer, not
			// its decision.
			g.Expect(a.took).To(BeNumerically("<", timeout+5*time.Second))
		}
	}
	try("slow-loris: a TCP connection that never starts TLS (header timeout 1 s)", "the sidecar port", slow(false, ""), endedAfter(limits.ReadHeaderTimeout, true))
	try("slow-loris: request headers that never end (header timeout 1 s)", "POST /v1/members", slow(true, "POST /v1/members HTTP/1.1\r\nHost: sidecar\r\nX-Slow: "), endedAfter(limits.ReadHeaderTimeout, true))

	// Malformed requests from the allowed controller.
	for _, m := range []struct{ what, body string }{
		{"truncated JSON", `{"name":"x",`},
		{"a JSON array", `["x"]`},
		{"an empty body", ``},
		{"JSON null", `null`},
		{"an unknown field", `{"name":"x","peerURLs":["https://127.0.0.1:1"],"learner":true,"voter":true}`},
		{"data after the JSON object", add("x", newPeer) + `{}`},
		{"a string where a list belongs", `{"name":"x","peerURLs":"https://127.0.0.1:1","learner":true}`},
		{"JSON nested 20000 deep", strings.Repeat("[", 20000)},
		{"invalid UTF-8 in the name", "{\"name\":\"x\xff\",\"peerURLs\":[\"https://127.0.0.1:1\"],\"learner\":true}"},
		{"a name with a space", add("etcd 9", newPeer)},
		{"a peer URL without a port", add("x", "https://127.0.0.1")},
		{"a peer URL with a path", add("x", "https://127.0.0.1:2380/x")},
		{"a unix:// peer URL", add("x", "unix://127.0.0.1:2380")},
		{"a voter add (learner false)", `{"name":"x","peerURLs":["https://127.0.0.1:1"]}`},
	} {
		try("malformed: "+m.what, "POST /v1/members", call(controller, "POST", "/v1/members", m.body, nil), func(g Gomega, a answer) {
			g.Expect(a.code).To(Equal(400), "%s", a)
			g.Expect(a.message).NotTo(BeEmpty())
		})
	}
	// Peer URLs are compared by peer, not by spelling: another spelling of
	// the follower's peer URL is refused (it would be a second member
	// claiming one peer), as are non-canonical spellings and lists that
	// name one peer twice or carry more URLs than a member has.
	followerPeer := memberByName(list, follower).PeerURLs[0]
	g.Expect(followerPeer).To(HavePrefix("https://127.0.0.1:"), "the spellings below assume a loopback peer URL")
	peerPort := strings.TrimPrefix(followerPeer, "https://127.0.0.1:")
	for _, m := range []struct{ what, peer string }{
		{"the follower's peer URL with a leading-zero port", "https://127.0.0.1:0" + peerPort},
		{"the follower's peer URL with an upper-case scheme", "HTTPS://127.0.0.1:" + peerPort},
		{"the follower's peer URL on LOCALHOST with a trailing dot", "https://LOCALHOST.:" + peerPort},
		{"the follower's peer URL as an IPv4-mapped IPv6 address", "https://[::ffff:127.0.0.1]:" + peerPort},
		{"a peer URL with a trailing slash", "https://127.0.0.1:1/"},
	} {
		try("peer URL: "+m.what, "POST /v1/members", call(controller, "POST", "/v1/members", add("x", m.peer), nil), refused(400, sidecar.ReasonInvalidURL))
	}
	for _, m := range []struct{ what, peer string }{
		{"the follower's peer URL on localhost", "https://localhost:" + peerPort},
		{"the follower's peer URL on the IPv6 loopback", "https://[::1]:" + peerPort},
	} {
		try("peer URL: "+m.what, "POST /v1/members", call(controller, "POST", "/v1/members", add("x", m.peer), nil), refused(409, sidecar.ReasonPeerURLConflict))
	}
	manyPeers := make([]string, 9)
	for i := range manyPeers {
		manyPeers[i] = fmt.Sprintf("https://127.0.0.1:%d", i+1)
	}
	peerList := func(urls ...string) string {
		b, _ := json.Marshal(map[string]any{"name": "x", "peerURLs": urls, "learner": true})
		return string(b)
	}
	try("peer URLs: one peer twice, as 127.0.0.1 and as localhost", "POST /v1/members", call(controller, "POST", "/v1/members", peerList(newPeer, "https://localhost:1"), nil), refused(400, sidecar.ReasonInvalidURL))
	try("peer URLs: 9 URLs, more than a member has", "POST /v1/members", call(controller, "POST", "/v1/members", peerList(manyPeers...), nil), refused(400, sidecar.ReasonInvalidURL))
	try("malformed: a lock TTL of 0", "POST /v1/lock", call(controller, "POST", "/v1/lock", `{"holder":"me","ttlSeconds":0}`, nil), refused(400, sidecar.ReasonInvalidArgument))
	try("malformed: a lock holder with a space", "DELETE /v1/members/"+follower, call(controller, "DELETE", "/v1/members/"+follower, "", map[string]string{sidecar.HeaderLockHolder: "me you"}), refused(400, sidecar.ReasonInvalidName))
	try("malformed: a name with a slash in the path", "DELETE /v1/members/bad%2Fname", call(controller, "DELETE", "/v1/members/bad%2Fname", "", nil), refused(400, sidecar.ReasonInvalidName))
	try("an unknown endpoint", "POST /v1/members/"+follower+"/demote", call(controller, "POST", "/v1/members/"+follower+"/demote", "", nil), refused(404, sidecar.ReasonNotFound))

	// Unknown members.
	const unknownID = "fedcba9876543210"
	try("promote an unknown member ID", "POST /v1/members/"+unknownID+"/promote", call(controller, "POST", "/v1/members/"+unknownID+"/promote", "", nil), refused(404, sidecar.ReasonMemberNotFound))
	try("leadership to an unknown member ID", "POST /v1/leader", call(controller, "POST", "/v1/leader", `{"name":"`+unknownID+`"}`, nil), refused(404, sidecar.ReasonMemberNotFound))
	try("leadership to an unknown member name", "POST /v1/leader", call(controller, "POST", "/v1/leader", `{"name":"nobody"}`, nil), refused(404, sidecar.ReasonMemberNotFound))
	try("remove the leader", "DELETE /v1/members/"+leader, call(controller, "DELETE", "/v1/members/"+leader, "", nil), refused(409, sidecar.ReasonIsLeader))
	try("a stale membership fingerprint", "DELETE /v1/members/"+follower, call(controller, "DELETE", "/v1/members/"+follower, "", map[string]string{sidecar.HeaderMembership: "0123456789abcdef"}), refused(409, sidecar.ReasonMembershipChanged))

	// Lock tokens: only the form the controller makes, with a start time
	// no later than the sidecar's clock allows, and compared as times. A
	// real process of seed-b holds the lock during these rows.
	heldToken, olderToken, aheadToken := lockToken(time.Minute), lockToken(time.Hour), lockToken(-10*time.Minute)
	tokenNames = map[string]string{heldToken: "{token}", olderToken: "{token-1h}", aheadToken: "{token+10m}"}
	g.Expect(sidecar.NewClient(sc.url, controllerTLS).AcquireLock(t.Context(), "seed-b", heldToken, time.Minute)).Error().NotTo(HaveOccurred())
	extraState = func(g Gomega) string { return "lock " + tc.lockValue(g, via) }
	lockBody := func(token string) string {
		return fmt.Sprintf(`{"holder":"seed-b","token":%q,"ttlSeconds":60}`, token)
	}
	for _, bad := range []struct{ what, token string }{
		{"a token that sorts after every real one (zzzz)", "zzzz"},
		{"a token of the right length that is not hex", strings.Repeat("z", sidecar.LockTokenLength)},
		{"a token of 32 nines", strings.Repeat("9", 32)},
		{"a token whose start time is the largest there is (year 2262)", "7fffffffffffffff00000000"},
		{"a token whose start time has the sign bit set", "ffffffffffffffff00000000"},
		{"a token of a process started 10 minutes from now", aheadToken},
	} {
		try("lock takeover with "+bad.what, "POST /v1/lock", call(controller, "POST", "/v1/lock", lockBody(bad.token), nil), refused(400, sidecar.ReasonInvalidToken))
	}
	try("lock takeover with the token of a process older than the holder's", "POST /v1/lock", call(controller, "POST", "/v1/lock", lockBody(olderToken), nil), refused(409, sidecar.ReasonStaleToken))
	try("a membership change whose lock-token header is zzzz", "DELETE /v1/members/"+follower, call(controller, "DELETE", "/v1/members/"+follower, "",
		map[string]string{sidecar.HeaderLockHolder: "seed-b", sidecar.HeaderLockToken: "zzzz"}), refused(400, sidecar.ReasonInvalidToken))
	try("a lock release whose token names a process started 10 minutes from now", "DELETE /v1/lock", call(controller, "DELETE", "/v1/lock", "",
		map[string]string{sidecar.HeaderLockHolder: "seed-b", sidecar.HeaderLockToken: aheadToken}), refused(400, sidecar.ReasonInvalidToken))

	// The client gate: only the lock's holder drains or holds the member's
	// clients, and the bodies are decoded strictly, each bound checked.
	extraState = func(g Gomega) string {
		return fmt.Sprintf("lock %s; gate ready=%t held=%t", tc.lockValue(g, via), sc.gate.Ready(), sc.gate.Held())
	}
	holder := map[string]string{sidecar.HeaderLockHolder: "seed-b", sidecar.HeaderLockToken: heldToken}
	other := map[string]string{sidecar.HeaderLockHolder: "other-controller", sidecar.HeaderLockToken: lockToken(0)}
	stale := map[string]string{sidecar.HeaderLockHolder: "seed-b", sidecar.HeaderLockToken: olderToken}
	for _, m := range []struct {
		what, method, path, body string
		header                   map[string]string
		code                     int
		reason                   string
	}{
		{"a drain without the lock headers", "POST", "/v1/clients/drain", `{"seconds":5}`, nil, 400, sidecar.ReasonInvalidArgument},
		{"a drain by another holder than the lock's", "POST", "/v1/clients/drain", `{"seconds":5}`, other, 409, sidecar.ReasonLockHeld},
		{"a drain by an older process of the lock's holder", "POST", "/v1/clients/drain", `{"seconds":5}`, stale, 409, sidecar.ReasonStaleToken},
		{"a drain undone without the lock headers", "DELETE", "/v1/clients/drain", ``, nil, 400, sidecar.ReasonInvalidArgument},
		{"a drain undone by another holder than the lock's", "DELETE", "/v1/clients/drain", ``, other, 409, sidecar.ReasonLockHeld},
		{"a hold without the lock headers", "POST", "/v1/clients/hold", `{"seconds":1}`, nil, 400, sidecar.ReasonInvalidArgument},
		{"a hold by another holder than the lock's", "POST", "/v1/clients/hold", `{"seconds":1}`, other, 409, sidecar.ReasonLockHeld},
		{"a hold by an older process of the lock's holder", "POST", "/v1/clients/hold", `{"seconds":1}`, stale, 409, sidecar.ReasonStaleToken},
		{"a hold released without the lock headers", "DELETE", "/v1/clients/hold", ``, nil, 400, sidecar.ReasonInvalidArgument},
		{"a drain with an unknown field, from the lock's holder", "POST", "/v1/clients/drain", `{"seconds":5,"forever":true}`, holder, 400, sidecar.ReasonMalformedRequest},
		{"a drain with data after the JSON object, from the lock's holder", "POST", "/v1/clients/drain", `{"seconds":5}{"seconds":60}`, holder, 400, sidecar.ReasonMalformedRequest},
		{"a drain whose seconds are a string, from the lock's holder", "POST", "/v1/clients/drain", `{"seconds":"5"}`, holder, 400, sidecar.ReasonMalformedRequest},
		{"a drain of 61 s, longer than a drain's lease may be, from the lock's holder", "POST", "/v1/clients/drain", `{"seconds":61}`, holder, 400, sidecar.ReasonInvalidArgument},
		{"a drain of 1e308 s, from the lock's holder", "POST", "/v1/clients/drain", `{"seconds":1e308}`, holder, 400, sidecar.ReasonInvalidArgument},
		{"a drain of -1 s, from the lock's holder", "POST", "/v1/clients/drain", `{"seconds":-1}`, holder, 400, sidecar.ReasonInvalidArgument},
		{"a drain undone with a body, from the lock's holder", "DELETE", "/v1/clients/drain", `{"seconds":5}`, holder, 400, sidecar.ReasonMalformedRequest},
		{"a hold of 6 s, longer than a hold may be, from the lock's holder", "POST", "/v1/clients/hold", `{"seconds":6}`, holder, 400, sidecar.ReasonInvalidArgument},
		{"a hold of 1e308 s, from the lock's holder", "POST", "/v1/clients/hold", `{"seconds":1e308}`, holder, 400, sidecar.ReasonInvalidArgument},
		{"a hold without seconds, from the lock's holder", "POST", "/v1/clients/hold", `{}`, holder, 400, sidecar.ReasonInvalidArgument},
		{"a hold with an unknown field, from the lock's holder", "POST", "/v1/clients/hold", `{"seconds":1,"renew":true}`, holder, 400, sidecar.ReasonMalformedRequest},
		{"a hold with data after the JSON object, from the lock's holder", "POST", "/v1/clients/hold", `{"seconds":1} x`, holder, 400, sidecar.ReasonMalformedRequest},
		{"a hold whose untilLeader is no member ID, from the lock's holder", "POST", "/v1/clients/hold", `{"seconds":1,"untilLeader":"xyz"}`, holder, 400, sidecar.ReasonInvalidArgument},
	} {
		try(m.what, m.method+" "+m.path, call(controller, m.method, m.path, m.body, m.header), refused(m.code, m.reason))
	}
	// A hold is not renewed: with one in force, another is refused.
	g.Expect(call(controller, "POST", "/v1/clients/hold", `{"seconds":5}`, holder)().code).To(Equal(200))
	try("a hold while the lock holder's hold is in force", "POST /v1/clients/hold", call(controller, "POST", "/v1/clients/hold", `{"seconds":5}`, holder), refused(409, sidecar.ReasonHoldInForce))
	g.Expect(call(controller, "DELETE", "/v1/clients/hold", ``, holder)().code).To(Equal(200))
	g.Expect(sc.gate.Held()).To(BeFalse(), "the holder's release ended the hold")

	g.Expect(sidecar.NewClient(sc.url, controllerTLS).ReleaseLock(t.Context(), "seed-b", heldToken)).To(Succeed())
	extraState = nil

	// The allow-list lets its identities through, by common name or SAN,
	// and a read needs no listed identity. (A no-op removal changes
	// nothing: the member is not there.)
	sanOnly := func() *http.Client {
		pair, err := tc.CA.Issue("laptop", "127.0.0.1", controllerIdentity)
		g.Expect(err).NotTo(HaveOccurred())
		cfg, err := tc.CA.ClientConfig(&pair)
		g.Expect(err).NotTo(HaveOccurred())
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	}()
	t.Cleanup(sanOnly.CloseIdleConnections)
	for _, tc2 := range []struct {
		name   string
		client *http.Client
		method string
		path   string
		want   int
	}{
		{"the allowed common name may change membership", controller, "DELETE", "/v1/members/nobody", http.StatusOK},
		{"the allowed identity as a DNS SAN may change membership", sanOnly, "DELETE", "/v1/members/nobody", http.StatusOK},
		{"a certificate of the client CA may read", stranger, "GET", "/v1/members", http.StatusOK},
	} {
		t.Run(tc2.name, func(t *testing.T) {
			g := NewWithT(t)
			before := tc.membership(g, via)
			a := call(tc2.client, tc2.method, tc2.path, "", nil)()
			g.Expect(a.code).To(Equal(tc2.want), "%s", a)
			g.Expect(tc.membership(g, via)).To(Equal(before))
		})
	}

	// A learner is promoted as soon as etcd allows it, with no time asked
	// of it; one that does not answer must have its raft connected to the
	// sidecar's member, or a learner that died after catching up would be
	// promoted on the log etcd's leader remembers of it. This one's peer
	// URL leads nowhere: its etcd never starts.
	{
		admin := sidecar.NewClient(sc.url, controllerTLS)
		var added *sidecar.ChangeResult
		retryWhile(g, sidecar.ReasonUnhealthyCluster, 30*time.Second, func() (err error) {
			added, err = admin.AddLearner(t.Context(), "learner-x", []string{"https://127.0.0.1:2"}, sidecar.CallOptions{})
			return err
		})
		for _, row := range []struct{ input, query string }{
			{"promote a learner whose etcd has not started (no raft connection)", ""},
			{"the same promotion with the removal of a follower after it", "?thenRemove=" + follower},
			{"the same promotion with the removal of the leader after it", "?thenRemove=" + leader},
		} {
			path := "/v1/members/" + added.Member.ID + "/promote" + row.query
			try(row.input, "POST "+path, call(controller, "POST", path, "", nil), refused(409, sidecar.ReasonLearnerNotReady))
		}
		_, err := admin.Remove(t.Context(), added.Member.ID, sidecar.CallOptions{})
		g.Expect(err).NotTo(HaveOccurred())
	}

	// A member admitted to join the existing cluster is never admitted to
	// bootstrap a new one (join.go). These rows go to a joining sidecar
	// (etcd-wrapper's server for member etcd-main-3, no etcd behind it);
	// their state is the member's admission, not etcd's member list.
	{
		const (
			own      = "etcd-main-3=http://etcd-main-3.etcd-main-peer.ns.svc:2380"
			existing = "etcd-main-0=http://etcd-main-0.etcd-main-peer.ns.svc:2380," + own
		)
		admissionFile := filepath.Join(t.TempDir(), "druid-stretch-admission.json")
		onVolume := func(j *sidecar.Joining) { j.AdmissionFile = admissionFile }
		joinURL, _ := joiningSidecarWith(t, onVolume)
		joined := sidecar.Admission{State: "existing", InitialCluster: existing, MemberID: "8e9e05c52164694d"}
		_, err := sidecar.NewClient(joinURL, nil).Admit(t.Context(), joined)
		g.Expect(err).NotTo(HaveOccurred())
		admitted := func(a *sidecar.Admission) string {
			if a == nil {
				return "not admitted"
			}
			return fmt.Sprintf("admitted: state %s, initial cluster %s", a.State, a.InitialCluster)
		}
		// The last two rows: an admission addressed to another member.
		// The controller reached this pod under a name or a kept
		// connection meant for another one (two pods of the same name,
		// one per seed); refused whether or not the member holds an
		// admission already.
		const (
			toExisting = "member admitted to join the existing cluster: "
			toOther    = "an admission for another member, to "
			forOther   = `{"state":"existing","initialCluster":"` + existing + `","memberID":"8e9e05c52164694d","member":"site-b-etcd-main-3"}`
		)
		fresh := func(set func(*sidecar.Joining)) func() string {
			return func() string { u, _ := joiningSidecarWith(t, set); return u }
		}
		for _, row := range []struct {
			input  string
			url    func() string
			body   string
			reason string
		}{
			{toExisting + "the admission repeated with state new", func() string { return joinURL }, `{"state":"new","initialCluster":"` + existing + `"}`, sidecar.ReasonAdmittedToExisting},
			{toExisting + "an admission to bootstrap the member alone", func() string { return joinURL }, `{"state":"new","initialCluster":"` + own + `"}`, sidecar.ReasonAdmittedToExisting},
			{toExisting + "an admission to bootstrap, after the pod was recreated on the same volume", fresh(onVolume), `{"state":"new","initialCluster":"` + own + `"}`, sidecar.ReasonAdmittedToExisting},
			{toOther + "a member not admitted yet", fresh(func(*sidecar.Joining) {}), forOther, sidecar.ReasonWrongMember},
			{toOther + "a member admitted already", func() string { return joinURL }, forOther, sidecar.ReasonWrongMember},
		} {
			t.Run(row.input, func(t *testing.T) {
				g := NewWithT(t)
				url := row.url()
				cl := sidecar.NewClient(url, nil)
				before, err := cl.Join(t.Context())
				g.Expect(err).NotTo(HaveOccurred())
				req, err := http.NewRequest(http.MethodPut, url+"/v1/join", strings.NewReader(row.body))
				g.Expect(err).NotTo(HaveOccurred())
				a := send(http.DefaultClient, req)
				refused(409, row.reason)(g, a)
				after, err := cl.Join(t.Context())
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(after.Admission).To(Equal(before.Admission), "the admission changed")
				table.Add(refusaldoc.Row{Input: row.input + " " + row.body, Target: "PUT /v1/join",
					Answer: normalize(a.String()), Before: admitted(before.Admission), After: "unchanged"})
			})
		}
	}

	// Last but one: the answer frees the only slot just after it is sent.
	try("slow body: a body that never comes (read timeout 3 s)", "POST /v1/members",
		slow(true, "POST /v1/members HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"name\":"), endedAfter(limits.ReadTimeout, false))

	// The bound on calls in flight: one call holds the only slot (its body
	// never comes), the next is refused at once.
	try("a call while another holds the only slot (MaxInFlight 1)", "GET /v1/members", func() answer {
		conn, err := tls.Dial("tcp", sc.addr, controllerTLS.Clone())
		if err != nil {
			return answer{transportFailure: err.Error()}
		}
		defer func() { _ = conn.Close() }()
		if _, err := conn.Write([]byte("POST /v1/members HTTP/1.1\r\nHost: sidecar\r\nContent-Length: 200\r\n\r\n{")); err != nil {
			return answer{transportFailure: err.Error()}
		}
		// The held call is in its handler once the in-flight gauge (on
		// /metrics, which takes no slot) says so.
		inFlight := regexp.MustCompile(`(?m)^druid_stretch_sidecar_requests_in_flight 1$`)
		for deadline := time.Now().Add(limits.ReadTimeout); ; time.Sleep(20 * time.Millisecond) {
			resp, err := anonymous.Get(sc.url + "/metrics")
			if err != nil {
				return answer{transportFailure: err.Error()}
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if inFlight.Match(body) {
				break
			}
			if time.Now().After(deadline) {
				return answer{transportFailure: "the held call never reached its handler"}
			}
		}
		return call(controller, "GET", "/v1/members", "", nil)()
	}, refused(429, sidecar.ReasonTooManyRequests))

	g.Expect(len(table.Rows)).To(BeNumerically(">=", 40))
	if !t.Failed() {
		refusaldoc.Check(t, table, "security-refusals-sidecar.md")
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && strings.Contains(op.Err.Error(), "reset")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func ptrTo[T any](v T) *T { return &v }
