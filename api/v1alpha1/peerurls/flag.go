package peerurls

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The sidecar and its init container take the additional peer URLs of the
// members a StatefulSet may run as one flag, --additional-peer-urls, of
// comma-separated member=url entries. FlagEntry writes an entry and
// ParseFlagEntry reads one; convert checks every URL with ParseFlagEntry,
// so that a URL the webhooks admit never stops a sidecar at its start.

// FlagEntry is member's entry for peer URL u in --additional-peer-urls.
func FlagEntry(member, u string) string { return member + "=" + u }

// ParseFlagEntry reads one member=url entry of --additional-peer-urls: the
// member name before the first '=', and a URL etcd takes as a peer URL,
// http:// or https:// with a host and a port, no path, query, fragment or
// user, and no blank, comma or invisible character.
func ParseFlagEntry(entry string) (member, peerURL string, err error) {
	member, peerURL, ok := strings.Cut(entry, "=")
	if !ok || member == "" || peerURL == "" {
		return "", "", fmt.Errorf("entry %q is not member=url", entry)
	}
	if !utf8.ValidString(entry) || strings.ContainsFunc(entry, func(r rune) bool { return r == ',' || unicode.IsSpace(r) || !unicode.IsGraphic(r) }) {
		return "", "", fmt.Errorf("entry %q has a comma, a blank or an invisible character: the flag separates entries by commas, and etcd takes none of these in a peer URL", entry)
	}
	u, err := url.Parse(peerURL)
	if err != nil {
		return "", "", fmt.Errorf("peer URL %q of member %s: %w", peerURL, member, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", "", fmt.Errorf("peer URL %q of member %s: want http:// or https://", peerURL, member)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" || port == "" {
		return "", "", fmt.Errorf("peer URL %q of member %s: want a host and a port, as etcd takes peer URLs", peerURL, member)
	}
	// url.Parse lets quotes and other sub-delimiters into a host name.
	if net.ParseIP(host) == nil && len(validation.IsDNS1123Subdomain(strings.ToLower(host))) > 0 {
		return "", "", fmt.Errorf("peer URL %q of member %s: the host %q is neither an IP address nor a DNS name", peerURL, member, host)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil || u.Opaque != "" {
		return "", "", fmt.Errorf("peer URL %q of member %s: want scheme://host:port only, without path, query, fragment or user", peerURL, member)
	}
	return member, peerURL, nil
}
