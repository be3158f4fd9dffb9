package workload

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// Options configure a workload. Zero values take the defaults named below.
type Options struct {
	// Endpoints are the client URLs to start with; SetEndpoints changes them.
	// Pass only members whose readiness passes: a member that joined by
	// snapshot may not serve clients for many seconds.
	Endpoints []string
	// TLS is the client TLS configuration (nil: plain TCP).
	TLS *tls.Config
	// DialContext, when set, makes the client's connections (for members
	// in another network namespace, such as the test sites' pods).
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)

	// Prefix is prepended to every key the workload touches
	// (default "/druid-stretch/workload/").
	Prefix string
	// Keys is the number of keys the writers and readers share (default 8).
	Keys int
	// ValueSize is the size in bytes of each written value (default 256; a
	// value is never shorter than its unique id, about 16 bytes).
	ValueSize int
	// Writers and Readers are the numbers of goroutines (defaults 4 and 2).
	Writers, Readers int
	// WriteInterval and ReadInterval are each goroutine's pause between two
	// requests (defaults 10 ms and 50 ms), so the load is steady and small.
	WriteInterval, ReadInterval time.Duration

	// AttemptTimeout bounds one RPC attempt (default DefaultAttemptTimeout).
	AttemptTimeout time.Duration
	// RequestDeadline bounds a request including its retries (default
	// DefaultRequestDeadline). A request without an answer by then is failed.
	RequestDeadline time.Duration

	// PreloadKeys keys of PreloadValueSize bytes (default 1024) are written
	// under Prefix+"preload/" by Preload, to give the cluster a realistic size.
	PreloadKeys, PreloadValueSize int

	// InitialPhase names the phase from Start to the first MarkPhase
	// (default "before").
	InitialPhase string

	// Log receives retries (V(1)) and failed requests.
	Log logr.Logger
}

// withDefaults fills zero values and rejects values that cannot work.
func (o Options) withDefaults() (Options, error) {
	var errs []error
	for _, f := range []struct {
		name  string
		value int
	}{
		{"Keys", o.Keys}, {"ValueSize", o.ValueSize}, {"Writers", o.Writers}, {"Readers", o.Readers},
		{"PreloadKeys", o.PreloadKeys}, {"PreloadValueSize", o.PreloadValueSize},
	} {
		if f.value < 0 {
			errs = append(errs, fmt.Errorf("workload option %s must not be negative, got %d", f.name, f.value))
		}
	}
	for _, f := range []struct {
		name  string
		value time.Duration
	}{
		{"WriteInterval", o.WriteInterval}, {"ReadInterval", o.ReadInterval},
		{"AttemptTimeout", o.AttemptTimeout}, {"RequestDeadline", o.RequestDeadline},
	} {
		if f.value < 0 {
			errs = append(errs, fmt.Errorf("workload option %s must not be negative, got %s", f.name, f.value))
		}
	}
	if len(o.Endpoints) == 0 {
		errs = append(errs, errors.New("workload option Endpoints is empty: give at least one client URL"))
	}
	for _, ep := range o.Endpoints {
		if strings.TrimSpace(ep) == "" {
			errs = append(errs, errors.New("workload option Endpoints holds an empty URL"))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return o, err
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if o.Prefix == "" {
		o.Prefix = "/druid-stretch/workload/"
	}
	def(&o.Keys, 8)
	def(&o.ValueSize, 256)
	def(&o.Writers, 4)
	def(&o.Readers, 2)
	def(&o.PreloadValueSize, 1024)
	defDur(&o.WriteInterval, 10*time.Millisecond)
	defDur(&o.ReadInterval, 50*time.Millisecond)
	defDur(&o.AttemptTimeout, DefaultAttemptTimeout)
	defDur(&o.RequestDeadline, DefaultRequestDeadline)
	if o.RequestDeadline < o.AttemptTimeout {
		return o, fmt.Errorf("workload option RequestDeadline (%s) is shorter than AttemptTimeout (%s)", o.RequestDeadline, o.AttemptTimeout)
	}
	if o.InitialPhase == "" {
		o.InitialPhase = "before"
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	return o, nil
}
