package apiload

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
)

// Server is one kube-apiserver the load talks to.
type Server struct {
	// Name labels the server in results and in its objects' names, so it
	// must be a DNS-1123 label (e.g. "site-a").
	Name string
	// Config reaches the server. It may carry a custom Dial (a server in
	// another network namespace); the load copies it and sets only Timeout,
	// QPS, Burst and UserAgent.
	Config *rest.Config
}

// Options configure a Load. Zero values take the defaults named below.
type Options struct {
	// Servers are the kube-apiservers, all backed by the same etcd cluster
	// (the one being moved): their requests form one linearizability domain.
	Servers []Server
	// Namespace holds the load's ConfigMaps; it is created when missing
	// (default "druid-stretch-apiload").
	Namespace string
	// ObjectsPerServer is the number of ConfigMaps each server's writers
	// share (default 4).
	ObjectsPerServer int
	// Writers and Readers are the goroutines per server (defaults 4 and 2).
	Writers, Readers int
	// Interval is each goroutine's pause between two requests (default 20 ms).
	Interval time.Duration
	// RequestTimeout is client-go's rest.Config.Timeout (default 30 s): a
	// client that waits, so that a hanging request shows as the hang it is.
	RequestTimeout time.Duration
	// QPS and Burst are client-go's client-side rate limit per server
	// (defaults 1000 and 1000), high enough that the limiter never shapes
	// the load. Everything else about the clients is client-go's default:
	// no retries or routing of our own, since the point is what a plain
	// client-go client sees.
	QPS   float32
	Burst int
	// ReadyzInterval is the pause between two /readyz probes of a server
	// (default 200 ms).
	ReadyzInterval time.Duration
	// ReadyzExclude names /readyz checks the probes leave out (kube-apiserver's
	// exclude parameter), for a server whose readiness for these clients
	// does not wait on them (see RBACBootstrapCheck). Empty: the full
	// /readyz, as a seed's probe asks it.
	ReadyzExclude []string
	// InitialPhase names the phase from Start to the first MarkPhase
	// (default "before").
	InitialPhase string
	// Log receives readiness changes and failed requests.
	Log logr.Logger
}

// withDefaults fills zero values and rejects values that cannot work,
// naming the option at fault.
func (o Options) withDefaults() (Options, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("apiload option "+format, args...))
	}
	if len(o.Servers) == 0 {
		bad("Servers is empty: give at least one kube-apiserver")
	}
	seen := map[string]bool{}
	for i, s := range o.Servers {
		switch msgs := validation.IsDNS1123Label(s.Name); {
		case s.Name == "":
			bad("Servers[%d].Name is empty", i)
		case len(msgs) > 0:
			bad("Servers[%d].Name %q is not a DNS-1123 label (it names the server's ConfigMaps): %s", i, s.Name, strings.Join(msgs, "; "))
		case seen[s.Name]:
			bad("Servers[%d].Name %q is used twice", i, s.Name)
		}
		seen[s.Name] = true
		if s.Config == nil {
			bad("Servers[%d].Config is nil", i)
		}
	}
	if o.Namespace != "" {
		if msgs := validation.IsDNS1123Label(o.Namespace); len(msgs) > 0 {
			bad("Namespace %q is not a valid namespace name: %s", o.Namespace, strings.Join(msgs, "; "))
		}
	}
	for _, f := range []struct {
		name  string
		value int
	}{{"ObjectsPerServer", o.ObjectsPerServer}, {"Writers", o.Writers}, {"Readers", o.Readers}, {"Burst", o.Burst}} {
		if f.value < 0 {
			bad("%s must not be negative, got %d", f.name, f.value)
		}
	}
	if o.QPS < 0 {
		bad("QPS must not be negative, got %g", o.QPS)
	}
	for _, f := range []struct {
		name  string
		value time.Duration
	}{{"Interval", o.Interval}, {"RequestTimeout", o.RequestTimeout}, {"ReadyzInterval", o.ReadyzInterval}} {
		if f.value < 0 {
			bad("%s must not be negative, got %s", f.name, f.value)
		}
	}
	for i, c := range o.ReadyzExclude {
		if c == "" || strings.ContainsAny(c, "?&= ") {
			bad("ReadyzExclude[%d] %q is not the name of a /readyz check", i, c)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return o, err
	}

	if o.Namespace == "" {
		o.Namespace = "druid-stretch-apiload"
	}
	defInt(&o.ObjectsPerServer, 4)
	defInt(&o.Writers, 4)
	defInt(&o.Readers, 2)
	defInt(&o.Burst, 1000)
	if o.QPS == 0 {
		o.QPS = 1000
	}
	defDuration(&o.Interval, 20*time.Millisecond)
	defDuration(&o.RequestTimeout, 30*time.Second)
	defDuration(&o.ReadyzInterval, 200*time.Millisecond)
	if o.InitialPhase == "" {
		o.InitialPhase = "before"
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	return o, nil
}

func defInt(v *int, d int) {
	if *v == 0 {
		*v = d
	}
}

func defDuration(v *time.Duration, d time.Duration) {
	if *v == 0 {
		*v = d
	}
}
