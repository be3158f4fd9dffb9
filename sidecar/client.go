package sidecar

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client calls one sidecar's HTTP API. It is what the controller uses; every
// refusal comes back as *Error.
type Client struct {
	base string
	http *http.Client
}

// ClientOption adjusts a Client.
type ClientOption func(*Client)

// WithHTTPClient replaces the HTTP client (its transport's TLS settings are
// then the caller's business).
func WithHTTPClient(c *http.Client) ClientOption { return func(cl *Client) { cl.http = c } }

// WithDialContext makes the client's connections through dial, for a
// caller whose sidecars sit in another network namespace (the test sites'
// pods) or behind a proxy of its own.
func WithDialContext(dial func(ctx context.Context, network, addr string) (net.Conn, error)) ClientOption {
	return func(cl *Client) {
		if tr, ok := cl.http.Transport.(*http.Transport); ok {
			tr.DialContext = dial
		}
	}
}

// WithTimeout bounds each call (default 30 s, longer than the sidecar's own
// etcd timeouts so that its answer arrives rather than a client timeout).
func WithTimeout(d time.Duration) ClientOption { return func(cl *Client) { cl.http.Timeout = d } }

// CallOptions are the guards a mutating call carries: the fingerprint of the
// membership it was planned from, and the membership lock holder with the
// token of its process (the fence). Empty fields are not sent (and not
// checked).
type CallOptions struct {
	Fingerprint string
	LockHolder  string
	LockToken   string
}

// NewClient returns a client of the sidecar at baseURL (e.g.
// https://etcd-main-0.example:8080). tlsConfig carries the CA and the client
// certificate that mutating calls need; nil for plain http.
func NewClient(baseURL string, tlsConfig *tls.Config, opts ...ClientOption) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// A copy per transport: HTTP/2's setup adds its protocol to the
	// config's NextProtos, and clients made from one config in parallel
	// would write it at once.
	tr.TLSClientConfig = tlsConfig.Clone()
	c := &Client{base: strings.TrimRight(baseURL, "/"), http: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// CloseIdleConnections closes the client's idle connections, for a client
// that is replaced.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Members returns the member list with health, leader, fingerprint and lock.
func (c *Client) Members(ctx context.Context) (*MemberList, error) {
	var out MemberList
	if err := c.do(ctx, http.MethodGet, "/v1/members", nil, CallOptions{}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// AddLearner adds a learner with the given name and peer URLs. Changed is
// false when that member was there already.
func (c *Client) AddLearner(ctx context.Context, name string, peerURLs []string, o CallOptions) (*ChangeResult, error) {
	return c.change(ctx, http.MethodPost, "/v1/members", AddMemberRequest{Name: name, PeerURLs: peerURLs, Learner: true}, o)
}

// Promote promotes the learner name (or hex ID) to a voter. A learner not
// ready yet gives *Error with reason LearnerNotReady and a RetryAfter.
func (c *Client) Promote(ctx context.Context, name string, o CallOptions) (*ChangeResult, error) {
	return c.change(ctx, http.MethodPost, "/v1/members/"+url.PathEscape(name)+"/promote", nil, o)
}

// PromoteThenRemove promotes the learner name and, right after, removes the
// voter then (name or hex ID), in one call: everything the removal needs is
// checked and prepared before the promotion, so the membership stands
// between the two changes only for the removal's own commit. This is the
// step through the tie of a move between two sites. A removal that fails
// leaves the promotion standing and says why in RemoveError.
func (c *Client) PromoteThenRemove(ctx context.Context, name, then string, o CallOptions) (*ChangeResult, error) {
	return c.change(ctx, http.MethodPost, "/v1/members/"+url.PathEscape(name)+"/promote?thenRemove="+url.QueryEscape(then), nil, o)
}

// Remove removes the member name (or hex ID). Changed is false when it was
// gone already.
func (c *Client) Remove(ctx context.Context, name string, o CallOptions) (*ChangeResult, error) {
	return c.change(ctx, http.MethodDelete, "/v1/members/"+url.PathEscape(name), nil, o)
}

// MoveLeader hands leadership to the voter name.
func (c *Client) MoveLeader(ctx context.Context, name string, o CallOptions) (*ChangeResult, error) {
	return c.change(ctx, http.MethodPost, "/v1/leader", LeaderRequest{Name: name}, o)
}

// AcquireLock takes or renews the membership lock for holder's process
// token with the given TTL (whole seconds, longer than the sidecar's request
// timeout, at most 1 h), or takes it over from another token of the same
// holder. Held by another holder: *Error LockHeld. The grant carries the
// records of the cluster's changes as of the lock's write (LockGrant).
func (c *Client) AcquireLock(ctx context.Context, holder, token string, ttl time.Duration) (*LockGrant, error) {
	var out LockGrant
	body := LockRequest{Holder: holder, Token: token, TTLSeconds: int64(ttl.Round(time.Second) / time.Second)}
	if err := c.do(ctx, http.MethodPost, "/v1/lock", body, CallOptions{}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ReleaseLock releases the lock of holder's process token; releasing a
// lock nobody holds succeeds.
func (c *Client) ReleaseLock(ctx context.Context, holder, token string) error {
	return c.do(ctx, http.MethodDelete, "/v1/lock", nil, CallOptions{LockHolder: holder, LockToken: token}, nil)
}

// DrainClients moves the clients of the sidecar's member to other members
// for the lease d names, and returns once none is left (*Error
// NoClientGate without a gate); on a drained gate it renews the lease.
func (c *Client) DrainClients(ctx context.Context, d ClientDrain, o CallOptions) (*ClientGateStatus, error) {
	var out ClientGateStatus
	if err := c.do(ctx, http.MethodPost, "/v1/clients/drain", d, o, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// UndrainClients undoes a drain: the member takes clients again (*Error
// ChangeInFlight while its removal is under way).
func (c *Client) UndrainClients(ctx context.Context, o CallOptions) (*ClientGateStatus, error) {
	var out ClientGateStatus
	if err := c.do(ctx, http.MethodDelete, "/v1/clients/drain", nil, o, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// HoldClients makes the member's new calls wait (see ClientHold) and
// returns once the calls forwarded before have been answered.
func (c *Client) HoldClients(ctx context.Context, h ClientHold, o CallOptions) (*ClientGateStatus, error) {
	var out ClientGateStatus
	if err := c.do(ctx, http.MethodPost, "/v1/clients/hold", h, o, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ReleaseClients ends the member's hold early.
func (c *Client) ReleaseClients(ctx context.Context, o CallOptions) error {
	return c.do(ctx, http.MethodDelete, "/v1/clients/hold", nil, o, nil)
}

// Ready reports whether the sidecar's local etcd member answers (/readyz).
func (c *Client) Ready(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/readyz", nil, CallOptions{}, nil)
}

// Healthy reports whether the sidecar itself answers (/healthz), without
// asking its etcd member: it is answered at once, also while the member
// starts.
func (c *Client) Healthy(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/healthz", nil, CallOptions{}, nil)
}

// Join tells what the sidecar's member is and whether it waits for an
// admission. A sidecar that is not etcd-wrapper's server (no Joining
// configured) answers *Error with reason NotFound.
func (c *Client) Join(ctx context.Context) (*JoinStatus, error) {
	var out JoinStatus
	if err := c.do(ctx, http.MethodGet, "/v1/join", nil, CallOptions{}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Admit lets the sidecar's member start with the admission's initial
// cluster and state. A member that has data refuses (*Error HasData).
func (c *Client) Admit(ctx context.Context, a Admission) (*JoinStatus, error) {
	var out JoinStatus
	if err := c.do(ctx, http.MethodPut, "/v1/join", a, CallOptions{}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func (c *Client) change(ctx context.Context, method, path string, body any, o CallOptions) (*ChangeResult, error) {
	var out ChangeResult
	if err := c.do(ctx, method, path, body, o, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func (c *Client) do(ctx context.Context, method, path string, body any, o CallOptions, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encoding the %s %s request: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return fmt.Errorf("building the %s %s request: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if o.Fingerprint != "" {
		req.Header.Set(HeaderMembership, o.Fingerprint)
	}
	if o.LockHolder != "" {
		req.Header.Set(HeaderLockHolder, o.LockHolder)
	}
	if o.LockToken != "" {
		req.Header.Set(HeaderLockToken, o.LockToken)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("calling the sidecar %s %s%s: %w", method, c.base, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return fmt.Errorf("reading the sidecar's answer to %s %s%s: %w", method, c.base, path, err)
	}
	if resp.StatusCode >= 300 {
		return decodeError(resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decoding the sidecar's answer to %s %s%s: %w", method, c.base, path, err)
	}
	return nil
}

func decodeError(code int, data []byte) error {
	var b errorBody
	if err := json.Unmarshal(data, &b); err != nil || b.Reason == "" {
		msg := strings.TrimSpace(string(data))
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		return &Error{StatusCode: code, Reason: http.StatusText(code), Message: msg}
	}
	return &Error{StatusCode: code, Reason: b.Reason, Message: b.Message, RetryAfter: time.Duration(b.RetryAfterSeconds) * time.Second}
}
