package rebalance

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Spec is the rebalancing an operator asks for: where the cluster's sidecars
// are, the members it should end with, and which host group each member
// belongs to. It comes from flags (ParseSidecar, ParseTarget, ParseGroup) or
// from a YAML file (LoadSpec) of the same shape:
//
//	sidecars:
//	  - {member: a-0, url: "https://10.0.0.1:8090"}
//	  - {member: b-0, url: "https://10.0.1.1:8090"}
//	target:
//	  - {name: b-0, peerURLs: ["https://10.0.1.1:2380"], group: b}
//	groups:
//	  a: [a-0, a-1, a-2]
type Spec struct {
	// Sidecars reach the cluster: one per member, today's and the target's
	// (a target member's sidecar answers once its etcd runs). A removal is
	// never sent through the sidecar of the member it removes, so each
	// sidecar names its member.
	Sidecars []Sidecar `json:"sidecars"`
	// Target are the members the cluster ends with, as voters. Members that
	// are not in it are removed.
	Target []TargetMember `json:"target"`
	// Groups put members into host groups (sides), for the planner's tie
	// rule: a move of the majority from one group to another passes through
	// one tie only. A target member's own Group counts as well.
	Groups map[string][]string `json:"groups,omitempty"`
}

// Sidecar is the druid-stretch sidecar beside one etcd member.
type Sidecar struct {
	// Member is the etcd member name the sidecar runs beside.
	Member string `json:"member"`
	// URL is the sidecar's base URL, e.g. https://10.0.0.1:8090.
	URL string `json:"url"`
}

// TargetMember is one member the cluster ends with.
type TargetMember struct {
	// Name is the etcd member name (etcd's --name).
	Name string `json:"name"`
	// PeerURLs are its advertised peer URLs (--initial-advertise-peer-urls).
	PeerURLs []string `json:"peerURLs"`
	// Group is its host group; empty means the group Spec.Groups gives it.
	Group string `json:"group,omitempty"`
}

// LoadSpec reads a Spec from a YAML (or JSON) file, refusing unknown fields
// so that a misspelt key is an error rather than a silent default.
func LoadSpec(path string) (Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Spec{}, fmt.Errorf("reading the rebalance spec: %w", err)
	}
	return ParseSpec(data, path)
}

// ParseSpec decodes a Spec from YAML (or JSON) read from name, refusing
// unknown fields as LoadSpec does.
func ParseSpec(data []byte, name string) (Spec, error) {
	var s Spec
	if err := yaml.UnmarshalStrict(data, &s); err != nil {
		return Spec{}, fmt.Errorf("decoding the rebalance spec %s: %w", name, err)
	}
	return s, nil
}

// ParseSidecar parses a --sidecar value, NAME=URL.
func ParseSidecar(v string) (Sidecar, error) {
	name, u, ok := strings.Cut(v, "=")
	if !ok || name == "" || u == "" {
		return Sidecar{}, fmt.Errorf("--sidecar %q: want MEMBER=URL, e.g. a-0=https://10.0.0.1:8090", v)
	}
	return Sidecar{Member: name, URL: u}, nil
}

// ParseTarget parses a --target value, NAME=PEERURL[,PEERURL...], with an
// optional group in front: GROUP/NAME=PEERURL.
func ParseTarget(v string) (TargetMember, error) {
	name, urls, ok := strings.Cut(v, "=")
	if !ok || name == "" || urls == "" {
		return TargetMember{}, fmt.Errorf("--target %q: want [GROUP/]NAME=PEERURL[,PEERURL...], e.g. b/b-0=https://10.0.1.1:2380", v)
	}
	t := TargetMember{Name: name, PeerURLs: strings.Split(urls, ",")}
	if group, n, found := strings.Cut(name, "/"); found {
		t.Group, t.Name = group, n
	}
	return t, nil
}

// ParseGroup parses a --group value, GROUP=NAME[,NAME...], into groups.
func ParseGroup(v string, groups map[string][]string) error {
	group, names, ok := strings.Cut(v, "=")
	if !ok || group == "" || names == "" {
		return fmt.Errorf("--group %q: want GROUP=MEMBER[,MEMBER...], e.g. a=a-0,a-1,a-2", v)
	}
	groups[group] = append(groups[group], strings.Split(names, ",")...)
	return nil
}

// Validate checks the spec on its own (the cluster is not asked yet): every
// problem is named, and nothing is changed on account of a bad spec.
func (s Spec) Validate() error {
	var errs []error
	if len(s.Sidecars) == 0 {
		errs = append(errs, errors.New("no sidecar given (--sidecar MEMBER=URL): there is no way to reach the cluster"))
	}
	sidecarOf := map[string]string{}
	for i, sc := range s.Sidecars {
		where := fmt.Sprintf("sidecars[%d]", i)
		if err := checkName(sc.Member); err != nil {
			errs = append(errs, fmt.Errorf("%s.member: %w", where, err))
		}
		if err := checkSidecarURL(sc.URL); err != nil {
			errs = append(errs, fmt.Errorf("%s.url: %w", where, err))
		}
		if prev, dup := sidecarOf[sc.Member]; dup && prev != sc.URL {
			errs = append(errs, fmt.Errorf("%s: member %s has two sidecars, %s and %s", where, sc.Member, prev, sc.URL))
		}
		sidecarOf[sc.Member] = sc.URL
	}
	if len(s.Target) == 0 {
		errs = append(errs, errors.New("no target member given (--target NAME=PEERURL): the cluster cannot end with no member"))
	}
	groupOf := map[string]string{}
	for g, names := range s.Groups {
		if g == "" {
			errs = append(errs, errors.New("groups: a group without a name"))
		}
		for _, n := range names {
			if prev, dup := groupOf[n]; dup && prev != g {
				errs = append(errs, fmt.Errorf("groups: member %s is in groups %s and %s", n, prev, g))
			}
			groupOf[n] = g
		}
	}
	names := map[string]int{}
	owner := map[string]string{}
	for i, t := range s.Target {
		where := fmt.Sprintf("target[%d]", i)
		if err := checkName(t.Name); err != nil {
			errs = append(errs, fmt.Errorf("%s.name: %w", where, err))
		}
		if first, dup := names[t.Name]; dup {
			errs = append(errs, fmt.Errorf("%s.name: %s is also target[%d]", where, t.Name, first))
		}
		names[t.Name] = i
		if len(t.PeerURLs) == 0 {
			errs = append(errs, fmt.Errorf("%s.peerURLs: %s has no peer URL; etcd reaches a member at its peer URLs", where, t.Name))
		}
		for j, u := range t.PeerURLs {
			if err := checkPeerURL(u); err != nil {
				errs = append(errs, fmt.Errorf("%s.peerURLs[%d]: %w", where, j, err))
			}
			if o, taken := owner[u]; taken {
				errs = append(errs, fmt.Errorf("%s.peerURLs[%d]: %s is also a peer URL of %s", where, j, u, o))
			}
			owner[u] = t.Name
		}
		if g, listed := groupOf[t.Name]; listed && t.Group != "" && g != t.Group {
			errs = append(errs, fmt.Errorf("%s.group: %s is in group %s here and in group %s under groups", where, t.Name, t.Group, g))
		}
	}
	return errors.Join(errs...)
}

// group is the host group of a member: its target entry's, else Groups'.
func (s Spec) group(name string) string {
	for _, t := range s.Target {
		if t.Name == name && t.Group != "" {
			return t.Group
		}
	}
	for g, names := range s.Groups {
		if slices.Contains(names, name) {
			return g
		}
	}
	return ""
}

func (s Spec) targetMember(name string) (TargetMember, bool) {
	for _, t := range s.Target {
		if t.Name == name {
			return t, true
		}
	}
	return TargetMember{}, false
}

// checkName accepts what the sidecar accepts as a member name.
func checkName(name string) error {
	if name == "" {
		return errors.New("the member name is empty")
	}
	for i, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_'
		if !ok {
			return fmt.Errorf("member name %q has the character %q at position %d; allowed are letters, digits, '-', '.' and '_'", name, c, i)
		}
	}
	return nil
}

// checkPeerURL accepts what etcd accepts as an advertised peer URL.
func checkPeerURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("peer URL %q does not parse: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("peer URL %q has scheme %q; want http or https", raw, u.Scheme)
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("peer URL %q must be scheme://host:port without user, path, query or fragment", raw)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" {
		return fmt.Errorf("peer URL %q needs a host and a port", raw)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("peer URL %q has port %q; want 1-65535", raw, port)
	}
	return nil
}

func checkSidecarURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("sidecar URL %q does not parse: %w", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("sidecar URL %q: want http(s)://host[:port]", raw)
	}
	return nil
}
