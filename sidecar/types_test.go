package sidecar

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

func pbMember(id uint64) *pb.Member { return &pb.Member{ID: id} }

func pbStatus(leader uint64) *pb.StatusResponse { return &pb.StatusResponse{Leader: leader} }

func TestFingerprint(t *testing.T) {
	g := NewWithT(t)
	a := []Member{{ID: "8e9e05c52164694d"}, {ID: "91bc3c398fb3c146"}, {ID: "fd422379fda50e48", IsLearner: true}}
	fp := Fingerprint(a)
	g.Expect(fp).To(MatchRegexp(`^[0-9a-f]{16}$`))

	// Order, names, URLs, health and leadership do not matter: only which
	// members exist and which of them vote.
	b := []Member{
		{ID: "fd422379fda50e48", IsLearner: true, Name: "x", Healthy: true},
		{ID: "8E9E05C52164694D", IsLeader: true, PeerURLs: []string{"https://h:2380"}},
		{ID: "91bc3c398fb3c146", RaftIndex: 42},
	}
	g.Expect(Fingerprint(b)).To(Equal(fp))

	for name, other := range map[string][]Member{
		"learner promoted": {{ID: "8e9e05c52164694d"}, {ID: "91bc3c398fb3c146"}, {ID: "fd422379fda50e48"}},
		"member removed":   {{ID: "8e9e05c52164694d"}, {ID: "fd422379fda50e48", IsLearner: true}},
		"member replaced":  {{ID: "8e9e05c52164694d"}, {ID: "91bc3c398fb3c147"}, {ID: "fd422379fda50e48", IsLearner: true}},
		"empty":            nil,
	} {
		g.Expect(Fingerprint(other)).NotTo(Equal(fp), name)
	}
}

func TestErrorRoundTrip(t *testing.T) {
	g := NewWithT(t)
	// A refusal written by the handler wrapper comes back from the client
	// as the same *Error, usable with errors.As and IsReason.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_, _ = fmt.Fprint(w, `{"reason":"LearnerNotReady","message":"healthy for 2s","retryAfterSeconds":3}`)
	}))
	t.Cleanup(srv.Close)
	_, err := NewClient(srv.URL, nil).Promote(t.Context(), "m", CallOptions{})
	g.Expect(IsReason(err, ReasonLearnerNotReady)).To(BeTrue())
	g.Expect(IsReason(fmt.Errorf("wrapped: %w", err), ReasonLearnerNotReady)).To(BeTrue())
	g.Expect(IsReason(err, ReasonQuorumAtRisk)).To(BeFalse())
	var e *Error
	g.Expect(err).To(BeAssignableToTypeOf(e))
	e = err.(*Error)
	g.Expect(*e).To(Equal(Error{StatusCode: 409, Reason: ReasonLearnerNotReady, Message: "healthy for 2s", RetryAfter: 3 * time.Second}))
	g.Expect(e.Error()).To(ContainSubstring("409 LearnerNotReady: healthy for 2s (retry after 3s)"))
}

func TestClientNonJSONError(t *testing.T) {
	g := NewWithT(t)
	// A proxy in front of the sidecar may answer in plain text.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream connect error", http.StatusBadGateway)
	}))
	t.Cleanup(srv.Close)
	_, err := NewClient(srv.URL, nil).Members(t.Context())
	var e *Error
	g.Expect(err).To(BeAssignableToTypeOf(e))
	e = err.(*Error)
	g.Expect(e.StatusCode).To(Equal(http.StatusBadGateway))
	g.Expect(e.Message).To(Equal("upstream connect error"))
}

func TestValidatePeerURLs(t *testing.T) {
	for _, tc := range []struct {
		urls []string
		want string // substring of the message; empty means valid
	}{
		{[]string{"https://10.0.0.1:2380"}, ""},
		{[]string{"http://etcd-main-0.seed-a.example:2380", "https://[::1]:2380"}, ""},
		// etcd refuses a path, a trailing slash included; the canonical
		// spelling has none.
		{[]string{"https://[::1]:2380/"}, `not spelled canonically; send "https://[::1]:2380"`},
		{[]string{"https://H:02380"}, `not spelled canonically; send "https://h:2380"`},
		{nil, "peerURLs is empty"},
		{[]string{"10.0.0.1:2380"}, "peerURLs[0]"},
		{[]string{"h:2380"}, `scheme "h"`},
		{[]string{"ftp://h:2380"}, `scheme "ftp"`},
		{[]string{"https://h"}, "needs a host and a port"},
		{[]string{"https://:2380"}, "needs a host and a port"},
		{[]string{"https://h:0"}, "want 1-65535"},
		{[]string{"https://h:70000"}, "want 1-65535"},
		{[]string{"https://h:2380/path"}, "without user, path"},
		{[]string{"https://u@h:2380"}, "without user, path"},
		{[]string{"https://h:2380?x=1"}, "without user, path"},
		{[]string{"https://h:2380", "https://h:2380"}, `peerURLs[1] "https://h:2380" names the same peer as peerURLs[0]`},
		{[]string{"https://127.0.0.1:2380", "https://localhost:2380"}, `peerURLs[1] "https://localhost:2380" names the same peer as peerURLs[0] "https://127.0.0.1:2380"`},
		{[]string{"https://h:2380", "%zz"}, "peerURLs[1]"},
	} {
		t.Run(strings.Join(tc.urls, ","), func(t *testing.T) {
			g := NewWithT(t)
			e := validatePeerURLs(tc.urls)
			if tc.want == "" {
				g.Expect(e).To(BeNil())
				return
			}
			g.Expect(e).NotTo(BeNil())
			g.Expect(e.StatusCode).To(Equal(http.StatusBadRequest))
			g.Expect(e.Reason).To(Equal(ReasonInvalidURL))
			g.Expect(e.Message).To(ContainSubstring(tc.want))
		})
	}
}

func TestValidateName(t *testing.T) {
	for _, tc := range []struct {
		name string
		want string
	}{
		{"seed-b-etcd-main-3", ""},
		{"etcd_main.0", ""},
		{"", "is empty"},
		{"a b", `character ' '`},
		{"a/b", `character '/'`},
		{"ü", `character 'ü'`},
		{strings.Repeat("a", 254), "the limit is 253"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := validateName("name", tc.name)
			if tc.want == "" {
				g.Expect(e).To(BeNil())
				return
			}
			g.Expect(e).NotTo(BeNil())
			g.Expect(e.Reason).To(Equal(ReasonInvalidName))
			g.Expect(e.Message).To(ContainSubstring(tc.want))
		})
	}
}

func TestLeaderOf(t *testing.T) {
	g := NewWithT(t)
	mv := func(id, reportedLeader uint64) *memberView {
		m := &memberView{pb: pbMember(id)}
		if reportedLeader != 0 {
			m.status = pbStatus(reportedLeader)
		}
		return m
	}
	// A member that says it leads wins over stale reports of others.
	g.Expect(leaderOf(&view{members: []*memberView{mv(1, 2), mv(2, 3), mv(3, 3)}})).To(Equal(uint64(3)))
	// Without a self-report, the majority of reports.
	g.Expect(leaderOf(&view{members: []*memberView{mv(1, 4), mv(2, 4), mv(3, 5)}})).To(Equal(uint64(4)))
	// Nobody knows a leader.
	g.Expect(leaderOf(&view{members: []*memberView{mv(1, 0), mv(2, 0)}})).To(Equal(uint64(0)))
}
