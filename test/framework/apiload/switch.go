package apiload

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Switch moves the clients of server from to server to, as a Gardener live
// control-plane migration switches the shoot's API endpoint (a DNS name)
// from the source kube-apiserver to the destination's before it shuts the
// source down. From then on every new request of from's writers and
// readers goes through to; they keep writing from's objects with from's
// cache, so the history and the lost-write check go on unbroken. Requests
// already in flight through from finish there. Clients of other servers
// that an earlier Switch moved to from move to to as well, so that nothing
// reaches from any more.
//
// Switch returns once no request is in flight through from: the caller may
// then stop from's kube-apiserver without cutting a client's request. When
// ctx ends first, Switch returns ctx's error, and the switch stands. It
// changes nothing and returns an error when the load is not running
// (before Start, after Stop), when ctx has already ended, when a name is
// unknown, when from and to are the same, when either was switched away
// already (to would take clients only to lose them), or when to never
// answered /readyz with 200.
//
// /readyz polling of from goes on, so the report shows the server going
// away. from's goroutines still waiting for from's first readiness start
// at once, since to is ready. Switch records the Mark "switch from -> to".
func (l *Load) Switch(ctx context.Context, from, to string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("apiload: Switch %s -> %s: %w", from, to, err)
	}
	src, dst := l.serverNamed(from), l.serverNamed(to)
	l.mu.Lock()
	l.route.Lock()
	err := l.checkSwitch(src, dst, from, to)
	if err != nil {
		l.route.Unlock()
		l.mu.Unlock()
		return err
	}
	at := l.now()
	for _, s := range l.servers {
		if s.via == src {
			s.via = dst
		}
	}
	src.switchedTo, src.switchedAt = dst, at
	close(src.switched)
	l.marks = append(l.marks, Mark{At: at, Name: fmt.Sprintf("switch %s -> %s", from, to)})
	inflight := src.inflight
	var drained chan struct{}
	if inflight > 0 {
		drained = make(chan struct{})
		src.drained = drained
	}
	l.route.Unlock()
	l.mu.Unlock()
	l.log.Info("clients switched", "from", from, "to", to, "at", at, "inFlightThroughFrom", inflight)
	if drained == nil {
		return nil
	}
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("apiload: switched %s -> %s, but requests through %s were still in flight: %w", from, to, from, ctx.Err())
	}
}

// checkSwitch names what forbids switching src to dst, or returns nil.
// The caller holds mu and route.
func (l *Load) checkSwitch(src, dst *server, from, to string) error {
	switch {
	case !l.started:
		return fmt.Errorf("apiload: Switch %s -> %s before Start: there is no traffic to switch", from, to)
	case l.stopped:
		return fmt.Errorf("apiload: Switch %s -> %s after Stop: the traffic has ended", from, to)
	case src == nil:
		return fmt.Errorf("apiload: Switch from unknown server %q (servers: %s)", from, l.serverNames())
	case dst == nil:
		return fmt.Errorf("apiload: Switch to unknown server %q (servers: %s)", to, l.serverNames())
	case src == dst:
		return fmt.Errorf("apiload: Switch from %s to itself", from)
	case src.switchedTo != nil:
		return fmt.Errorf("apiload: Switch %s -> %s: %s was switched to %s already", from, to, from, src.switchedTo.name)
	case dst.switchedTo != nil:
		return fmt.Errorf("apiload: Switch %s -> %s: %s was switched to %s already, its clients no longer reach it", from, to, to, dst.switchedTo.name)
	case !dst.becameReady():
		return fmt.Errorf("apiload: Switch %s -> %s: %s never answered /readyz with 200", from, to, to)
	}
	return nil
}

func (l *Load) serverNamed(name string) *server {
	for _, s := range l.servers {
		if s.name == name {
			return s
		}
	}
	return nil
}

func (l *Load) serverNames() string {
	names := make([]string, 0, len(l.servers))
	for _, s := range l.servers {
		names = append(names, s.name)
	}
	return strings.Join(names, ", ")
}

// acquire is the server home's clients reach now, with one more request
// counted in flight through it; release must follow once the request has
// returned. Choosing and counting under one lock is what lets Switch know
// that no request through the old server can start after it looked.
func (l *Load) acquire(home *server) *server {
	l.route.Lock()
	defer l.route.Unlock()
	via := home.via
	via.inflight++
	return via
}

// release ends a request through via that acquire counted.
func (l *Load) release(via *server) {
	l.route.Lock()
	defer l.route.Unlock()
	via.inflight--
	if via.inflight == 0 && via.drained != nil {
		close(via.drained)
		via.drained = nil
	}
}

// switchedAway is where and when Switch moved s's clients; ok is false
// while they still reach s.
func (l *Load) switchedAway(s *server) (to string, at time.Duration, ok bool) {
	l.route.Lock()
	defer l.route.Unlock()
	if s.switchedTo == nil {
		return "", 0, false
	}
	return s.switchedTo.name, s.switchedAt, true
}

// origin is the name of a request's clients' home server when another
// server served it, else "".
func origin(home, via *server) string {
	if home == via {
		return ""
	}
	return home.name
}
