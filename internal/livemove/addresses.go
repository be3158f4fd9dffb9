package livemove

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/members"
	move "github.com/druid-stretch/druid-stretch/api/v1alpha1/migration"
)

// URLTemplates render a member's addresses from templates with the
// placeholders {pod} (the pod name), {member} (the etcd member name),
// {ordinal}, {name} (the Etcd's name) and {namespace}, for example
// "https://{pod}.{name}-peer.{namespace}.svc.seed-b.example.com:2380".
type URLTemplates struct {
	// Peer renders the peer URL. Required.
	Peer string
	// Client renders the client URL; empty for none.
	Client string
	// Sidecar renders the sidecar's base URL; empty for none (the other
	// cluster's controller then cannot act before a member of its own runs).
	Sidecar string
}

var placeholder = regexp.MustCompile(`\{[^{}]*\}`)

var knownPlaceholders = []string{"{pod}", "{member}", "{ordinal}", "{name}", "{namespace}"}

// Check refuses templates with an unknown placeholder or without a peer
// template, naming the flag-like field.
func (t URLTemplates) Check() error {
	if t.Peer == "" {
		return errors.New("the peer URL template is empty")
	}
	var errs []error
	for _, f := range []struct{ name, tmpl string }{{"peer", t.Peer}, {"client", t.Client}, {"sidecar", t.Sidecar}} {
		for _, p := range placeholder.FindAllString(f.tmpl, -1) {
			known := false
			for _, k := range knownPlaceholders {
				known = known || p == k
			}
			if !known {
				errs = append(errs, fmt.Errorf("the %s URL template %q has the unknown placeholder %s (known: %s)", f.name, f.tmpl, p, strings.Join(knownPlaceholders, " ")))
			}
		}
	}
	return errors.Join(errs...)
}

// Addresses turns the templates into the adapter's Addresses.
func (t URLTemplates) Addresses() move.Addresses {
	return func(e *v1alpha1.Etcd, memberName, podName string) (v1alpha1.ExternalMember, error) {
		if err := t.Check(); err != nil {
			return v1alpha1.ExternalMember{}, err
		}
		ordinal := ""
		if o, ok := members.Ordinal(e, memberName); ok {
			ordinal = fmt.Sprint(o)
		}
		r := strings.NewReplacer("{pod}", podName, "{member}", memberName, "{ordinal}", ordinal, "{name}", e.Name, "{namespace}", e.Namespace)
		m := v1alpha1.ExternalMember{PeerURLs: []string{r.Replace(t.Peer)}}
		if t.Client != "" {
			m.ClientURLs = []string{r.Replace(t.Client)}
		}
		if t.Sidecar != "" {
			m.SidecarURL = r.Replace(t.Sidecar)
		}
		return m, nil
	}
}
