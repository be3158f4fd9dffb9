// Package peerurl is the one place that says when two etcd peer URLs name
// the same peer. etcd compares peer URLs as strings, so a member added with
// another spelling of a running voter's peer URL ("https://LOCALHOST:02380"
// beside "https://127.0.0.1:2380") is a second member claiming one peer, or
// a member nobody can reach. Every comparison of peer URLs in druid-stretch
// (the sidecar's duplicate and conflict checks, the planner's and the
// controller's matching of a learner to its planned member) goes through
// Key, and the sidecar takes only URLs already in their Canonical spelling.
package peerurl

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Max bounds the peer URLs of one member. A member advertises one peer URL
// per network it is reached on (druid's pod address plus an additional one
// per site or address family), a handful at most; every URL is stored in
// etcd's member record, listed in every member's initial cluster and
// dialled by every peer's transport, so a request with hundreds is refused
// rather than stored.
const Max = 8

// loopbackHost is the host of Key for every loopback spelling: the names
// RFC 6761 reserves for loopback (localhost, *.localhost) and every
// loopback IP (127.0.0.0/8, ::1) reach a process on the same machine, so
// two peer URLs that differ only there may name one listener. Treating
// them as one peer refuses a possible clash rather than admitting it.
const loopbackHost = "loopback"

// Canonical returns raw's canonical spelling: scheme and host in lower
// case, a host name without its trailing dot, an IP literal in its shortest
// form (IPv4 for an IPv4-mapped IPv6 address), the port as a decimal number
// without leading zeros, and no path, query, fragment or user info (those
// are refused). raw must be http(s)://host:port.
func Canonical(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("does not parse: %w", err)
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return "", fmt.Errorf("has scheme %q; want http or https", u.Scheme)
	}
	if u.Opaque != "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return "", fmt.Errorf("must be scheme://host:port without user, path, query or fragment")
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" {
		return "", fmt.Errorf("needs a host and a port")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strings.HasPrefix(port, "+") {
		return "", fmt.Errorf("has port %q; want 1-65535", port)
	}
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String()
	} else {
		host = strings.TrimSuffix(strings.ToLower(host), ".")
		if host == "" || !validHostName(host) {
			return "", fmt.Errorf("has host %q; want an IP address or a DNS name (letters, digits, '-', '_' and '.')", host)
		}
	}
	return scheme + "://" + net.JoinHostPort(host, strconv.Itoa(n)), nil
}

func validHostName(host string) bool {
	for _, label := range strings.Split(host, ".") {
		if label == "" {
			return false
		}
	}
	for _, c := range host {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// Key is what two peer URLs are compared by: the canonical spelling with
// every loopback host as one. A URL that does not parse (etcd may list one
// an operator added by hand) is its own key.
func Key(raw string) string {
	c, err := Canonical(raw)
	if err != nil {
		return raw
	}
	u, _ := url.Parse(c)
	host := u.Hostname()
	if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback()) || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return u.Scheme + "://" + net.JoinHostPort(loopbackHost, u.Port())
	}
	return c
}

// Same tells whether a and b name the same peer.
func Same(a, b string) bool { return Key(a) == Key(b) }

// Shared returns the first URL of a that names a peer of b, with the URL
// of b it matches; ok is false when they share none.
func Shared(a, b []string) (inA, inB string, ok bool) {
	for _, x := range a {
		for _, y := range b {
			if Same(x, y) {
				return x, y, true
			}
		}
	}
	return "", "", false
}

// Shares tells whether a and b name a common peer.
func Shares(a, b []string) bool {
	_, _, ok := Shared(a, b)
	return ok
}

// SameSet tells whether a and b name the same peers.
func SameSet(a, b []string) bool {
	keys := func(urls []string) []string {
		out := make([]string, len(urls))
		for i, u := range urls {
			out[i] = Key(u)
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return slices.Equal(keys(a), keys(b))
}
