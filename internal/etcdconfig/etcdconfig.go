// Package etcdconfig reads the etcd configuration etcd-druid renders into an
// Etcd's ConfigMap (key etcd.conf.yaml) and derives from it what one member of
// an Etcd that druid-stretch manages needs:
//
//   - the configuration its etcd starts with (ForMember), as etcd-backup-restore
//     would serve it on /config, but with the initial cluster and state that
//     druid-stretch's controller decided (druid's file lists only the pods at
//     ordinals 0..replicas-1 and always says "new");
//   - the configuration file etcd-backup-restore itself reads (ForBackupRestore):
//     druid's, with this member's own entries, and an initial cluster of this
//     member alone, which turns off backup-restore's multi-node membership
//     actions (its learner add, its promotion, its remove-and-re-add): the
//     membership of a managed Etcd has one actor, druid-stretch's planner.
//
// druid's file keeps every key etcd reads (data dir, listen URLs, TLS, quota,
// compaction, …); this package changes only the per-member keys and passes
// every other key through untouched, whatever druid version wrote it.
package etcdconfig

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// Keys of druid's etcd.conf.yaml that this package reads or writes.
const (
	KeyName                     = "name"
	KeyDataDir                  = "data-dir"
	KeyInitialCluster           = "initial-cluster"
	KeyInitialClusterState      = "initial-cluster-state"
	KeyInitialAdvertisePeerURLs = "initial-advertise-peer-urls"
	KeyAdvertiseClientURLs      = "advertise-client-urls"
	KeyListenClientURLs         = "listen-client-urls"
	KeyMemberNamePrefix         = "member-name-prefix"
	KeyMaxLearners              = "max-learners"
)

// Initial cluster states, etcd's values.
const (
	StateNew      = "new"
	StateExisting = "existing"
)

// DefaultPath is where druid mounts the file in the etcd and backup-restore
// containers.
const DefaultPath = "/var/etcd/config/etcd.conf.yaml"

// Member is one member as etcd's configuration names it.
type Member struct {
	// Name is the etcd member name (druid: <memberNamePrefix>-<pod>, or the
	// pod's name).
	Name string
	// PeerURLs and ClientURLs are the URLs it advertises.
	PeerURLs   []string
	ClientURLs []string
}

// File is druid's etcd.conf.yaml, parsed. Keys this package does not know
// are kept as they were.
type File struct {
	raw map[string]any
}

// Load reads and parses druid's file at path.
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading druid's etcd configuration: %w", err)
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Parse parses the content of druid's etcd.conf.yaml.
func Parse(b []byte) (*File, error) {
	raw := map[string]any{}
	if err := yaml.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("parsing druid's etcd configuration: %w", err)
	}
	if len(raw) == 0 {
		return nil, errors.New("druid's etcd configuration is empty")
	}
	return &File{raw: raw}, nil
}

// DataDir is etcd's data directory.
func (f *File) DataDir() string { return stringValue(f.raw[KeyDataDir]) }

// MemberNamePrefix is druid's spec.memberNamePrefix, "" when unset.
func (f *File) MemberNamePrefix() string { return stringValue(f.raw[KeyMemberNamePrefix]) }

// MemberName is the member name of a pod, as druid and backup-restore compute
// it: <prefix>-<pod>, or the pod's name without a prefix.
func (f *File) MemberName(pod string) string {
	if p := f.MemberNamePrefix(); p != "" {
		return p + "-" + pod
	}
	return pod
}

// Entry is the member's entry in druid's advertise maps; ok is false when
// druid's file has none (a pod outside ordinals 0..replicas-1).
func (f *File) Entry(name string) (m Member, ok bool) {
	peers, pok := urlMap(f.raw[KeyInitialAdvertisePeerURLs])[name]
	clients, cok := urlMap(f.raw[KeyAdvertiseClientURLs])[name]
	if !pok || !cok || len(peers) == 0 || len(clients) == 0 {
		return Member{Name: name}, false
	}
	return Member{Name: name, PeerURLs: peers, ClientURLs: clients}, true
}

// Resolve completes m from druid's file: the URLs of druid's entry for
// m.Name when it has one, otherwise m's own, which must then be set; then
// the extra peer URLs not listed yet, each with a client URL on its host
// (see clientURLBeside). Pass the member's
// spec.etcd.additionalAdvertisePeerURLs as extra: druid's file has them
// only when the member name is the pod name (druid looks them up by pod
// name, its validation names them by member name, so with
// spec.memberNamePrefix they never reach the file).
func (f *File) Resolve(m Member, extraPeerURLs ...string) (Member, error) {
	if e, ok := f.Entry(m.Name); ok {
		m = e
	} else if len(m.PeerURLs) == 0 || len(m.ClientURLs) == 0 {
		return m, fmt.Errorf("druid's etcd configuration has no entry for member %s and no peer and client URLs were given for it", m.Name)
	}
	m.PeerURLs, m.ClientURLs = slices.Clone(m.PeerURLs), slices.Clone(m.ClientURLs)
	like := m.ClientURLs[0]
	if len(extraPeerURLs) > 0 {
		m = f.apart(m)
	}
	for _, u := range extraPeerURLs {
		if !slices.Contains(m.PeerURLs, u) {
			m.PeerURLs = append(m.PeerURLs, u)
		}
		c, err := clientURLBeside(u, like)
		if err != nil {
			return m, fmt.Errorf("member %s: %w", m.Name, err)
		}
		if !slices.Contains(m.ClientURLs, c) {
			m.ClientURLs = append(m.ClientURLs, c)
		}
	}
	return m, nil
}

// apart drops from m the URLs of druid's entry whose peer URL druid's
// initial-cluster lists under another member's name: the source's members
// of spec.etcd.bootstrapWithExistingCluster, when the Etcd runs under the
// same name and namespace in both clusters (GEP-39). druid gives the pod
// the in-cluster peer URL of the source pod of the same ordinal, and etcd
// refuses a member with a peer URL another member has; the controller adds
// the member without it, with its additional peer URLs, which the caller
// appends. Client URLs on a dropped peer URL's host go too: in the other
// cluster that host names another pod.
func (f *File) apart(m Member) Member {
	others := map[string]bool{}
	for _, entry := range strings.Split(stringValue(f.raw[KeyInitialCluster]), ",") {
		name, u, ok := strings.Cut(strings.TrimSpace(entry), "=")
		if ok && name != m.Name {
			others[u] = true
		}
	}
	var hosts []string
	m.PeerURLs = slices.DeleteFunc(m.PeerURLs, func(u string) bool {
		if !others[u] {
			return false
		}
		if p, err := url.Parse(u); err == nil {
			hosts = append(hosts, p.Hostname())
		}
		return true
	})
	m.ClientURLs = slices.DeleteFunc(m.ClientURLs, func(u string) bool {
		p, err := url.Parse(u)
		return err == nil && slices.Contains(hosts, p.Hostname())
	})
	return m
}

// clientURLBeside is a client URL on the host of peerURL, with the scheme
// and port of the client URL like: the name under which another cluster
// reaches the member's peer port names the member for its clients too.
// druid advertises only in-cluster client URLs, which another cluster
// cannot resolve (or resolves to its own pod of the same name), and
// druid-stretch's sidecars poll every member's health on its client URLs.
func clientURLBeside(peerURL, like string) (string, error) {
	p, err := url.Parse(peerURL)
	if err != nil || p.Hostname() == "" {
		return "", fmt.Errorf("peer URL %q: not a URL with a host", peerURL)
	}
	l, err := url.Parse(like)
	if err != nil || l.Port() == "" {
		return "", fmt.Errorf("client URL %q: not a URL with a port", like)
	}
	return (&url.URL{Scheme: l.Scheme, Host: net.JoinHostPort(p.Hostname(), l.Port())}).String(), nil
}

// ForMember is the configuration etcd starts with for member m: druid's,
// with m's name and advertised URLs (as comma-separated strings, as
// backup-restore serves them), and the given initial cluster and state.
func (f *File) ForMember(m Member, initialCluster, state string) ([]byte, error) {
	if state != StateNew && state != StateExisting {
		return nil, fmt.Errorf("initial cluster state %q: want %q or %q", state, StateNew, StateExisting)
	}
	if err := checkInitialCluster(initialCluster, m); err != nil {
		return nil, err
	}
	out := f.copy()
	out[KeyName] = m.Name
	out[KeyInitialAdvertisePeerURLs] = strings.Join(m.PeerURLs, ",")
	out[KeyAdvertiseClientURLs] = strings.Join(m.ClientURLs, ",")
	out[KeyInitialCluster] = initialCluster
	out[KeyInitialClusterState] = state
	return yaml.Marshal(out)
}

// With is configuration b with key set to value, every other key kept:
// listen-client-urls where a gate stands in front of etcd's client port,
// max-learners where several learners may catch up at once.
func With(b []byte, key string, value any) ([]byte, error) {
	f, err := Parse(b)
	if err != nil {
		return nil, err
	}
	out := f.copy()
	out[key] = value
	return yaml.Marshal(out)
}

// ForBackupRestore is the file backup-restore of member m reads: druid's,
// with m's entries in both advertise maps (druid's file lacks them for pods
// outside ordinals 0..replicas-1, and backup-restore's lease renewal and
// peer-URL check read them) and an initial cluster of m alone.
//
// backup-restore sizes the cluster from that list: with one entry it takes
// no multi-node membership action (no learner add with a data wipe at
// start, no promotion of its member, no remove-and-re-add after data loss),
// which is what makes druid-stretch's planner the only actor. Its snapshots,
// leader election and lease renewal do not depend on the size.
func (f *File) ForBackupRestore(m Member) ([]byte, error) {
	out := f.copy()
	for key, urls := range map[string][]string{KeyInitialAdvertisePeerURLs: m.PeerURLs, KeyAdvertiseClientURLs: m.ClientURLs} {
		entries := map[string]any{}
		for k, v := range urlMap(out[key]) {
			entries[k] = v
		}
		entries[m.Name] = urls
		out[key] = entries
	}
	out[KeyInitialCluster] = FormatInitialCluster([]Member{m})
	return yaml.Marshal(out)
}

// FormatInitialCluster is etcd's initial-cluster for ms: name=peerURL for
// every peer URL of every member, sorted by name.
func FormatInitialCluster(ms []Member) string {
	sorted := append([]Member(nil), ms...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	var parts []string
	for _, m := range sorted {
		for _, u := range m.PeerURLs {
			parts = append(parts, m.Name+"="+u)
		}
	}
	return strings.Join(parts, ",")
}

// checkInitialCluster refuses an initial cluster that lacks one of m's peer
// URLs under m's name: etcd would refuse to start with it, later and with a
// less clear message.
func checkInitialCluster(initialCluster string, m Member) error {
	have := map[string]bool{}
	for _, entry := range strings.Split(initialCluster, ",") {
		name, url, ok := strings.Cut(strings.TrimSpace(entry), "=")
		if !ok || name == "" || url == "" {
			return fmt.Errorf("initial cluster %q: entry %q is not name=peerURL", initialCluster, entry)
		}
		if name == m.Name {
			have[url] = true
		}
	}
	for _, u := range m.PeerURLs {
		if !have[u] {
			return fmt.Errorf("initial cluster %q lacks %s=%s, the member's own peer URL", initialCluster, m.Name, u)
		}
	}
	return nil
}

func (f *File) copy() map[string]any {
	out := make(map[string]any, len(f.raw))
	for k, v := range f.raw {
		out[k] = v
	}
	return out
}

// WriteFile writes b to path atomically (a reader never sees half a file),
// with the mode etcd-wrapper and backup-restore use for it.
func WriteFile(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".etcd.conf.yaml-")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// urlMap reads one of druid's advertise maps (member name → URLs); a value
// that is a comma-separated string (as backup-restore serves it) is split.
func urlMap(v any) map[string][]string {
	out := map[string][]string{}
	m, ok := v.(map[string]any)
	if !ok {
		return out
	}
	for name, urls := range m {
		switch u := urls.(type) {
		case []any:
			for _, x := range u {
				if s := stringValue(x); s != "" {
					out[name] = append(out[name], s)
				}
			}
		case string:
			for _, s := range strings.Split(u, ",") {
				if s = strings.TrimSpace(s); s != "" {
					out[name] = append(out[name], s)
				}
			}
		}
	}
	return out
}

func stringValue(v any) string {
	s, _ := v.(string)
	return s
}
