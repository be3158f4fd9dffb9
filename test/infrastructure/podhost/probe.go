package podhost

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probe runs the container's startup, readiness and liveness probes while
// its process runs, as kubelet does: readiness and liveness only once the
// startup probe passed; a failed liveness (or startup) probe kills the
// process, and the pod's restartPolicy decides what follows. The channel
// closes when every probe loop has ended.
func (c *container) probe(ctx context.Context, cmd *exec.Cmd) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	startedCh := make(chan struct{})
	if c.spec.StartupProbe == nil {
		close(startedCh)
	} else {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.loop(ctx, c.spec.StartupProbe, func(ok bool) bool {
				if ok {
					c.r.mu.Lock()
					c.started = true
					c.ready = c.spec.ReadinessProbe == nil
					c.r.mu.Unlock()
					c.r.publish()
					close(startedCh)
				}
				return false // one verdict ends the startup probe
			}) {
				c.log.Info("startup probe failed; killing the container")
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			}
		}()
	}
	if p := c.spec.ReadinessProbe; p != nil && !c.init {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-ctx.Done():
				return
			case <-startedCh:
			}
			c.loop(ctx, p, func(ok bool) bool {
				c.r.mu.Lock()
				changed := c.ready != ok
				c.ready = ok
				c.r.mu.Unlock()
				if changed {
					c.log.Info("readiness changed", "ready", ok)
					c.r.publish()
				}
				return true
			})
		}()
	}
	if p := c.spec.LivenessProbe; p != nil && !c.init {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-ctx.Done():
				return
			case <-startedCh:
			}
			if c.loop(ctx, p, func(ok bool) bool { return ok }) {
				c.log.Info("liveness probe failed; killing the container")
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			}
		}()
	}
	go func() {
		wg.Wait()
		close(done)
	}()
	return done
}

// loop probes every period after the initial delay and hands each verdict
// (once the success or failure threshold is reached) to on, which says
// whether to go on probing. It returns true when it stopped on a failure
// verdict, false when it stopped on a success verdict or because ctx ended.
func (c *container) loop(ctx context.Context, p *corev1.Probe, on func(ok bool) bool) bool {
	period := seconds(p.PeriodSeconds, 10)
	timeout := seconds(p.TimeoutSeconds, 1)
	success, failure := max(p.SuccessThreshold, 1), max(p.FailureThreshold, 3)
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Duration(p.InitialDelaySeconds) * time.Second):
	}
	var oks, fails int32
	for {
		err := c.check(ctx, p, timeout)
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			oks, fails = oks+1, 0
			if oks >= success && !on(true) {
				return false
			}
		} else {
			oks, fails = 0, fails+1
			c.log.V(1).Info("probe failed", "err", err.Error())
			if fails >= failure && !on(false) {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(period):
		}
	}
}

func seconds(v int32, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

// check runs one probe against the pod's IP.
func (c *container) check(ctx context.Context, p *corev1.Probe, timeout time.Duration) error {
	c.r.mu.Lock()
	ip := c.r.ip
	c.r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dial := c.r.h.opts.Network.DialContext
	switch {
	case p.HTTPGet != nil:
		port, err := c.port(p.HTTPGet.Port)
		if err != nil {
			return err
		}
		host := ip.String()
		if p.HTTPGet.Host != "" {
			host = p.HTTPGet.Host
		}
		scheme := "http"
		if p.HTTPGet.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		u := probeURL(scheme, host, port, p.HTTPGet.Path)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return err
		}
		for _, hd := range p.HTTPGet.HTTPHeaders {
			req.Header.Add(hd.Name, hd.Value)
		}
		req.Header.Set("User-Agent", "kube-probe/standin")
		// kubelet does not verify the certificate of an HTTPS probe.
		tr := &http.Transport{DialContext: dial, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe %s answered %s", u.String(), resp.Status)
		}
		return nil
	case p.TCPSocket != nil:
		port, err := c.port(p.TCPSocket.Port)
		if err != nil {
			return err
		}
		conn, err := dial(ctx, "tcp", net.JoinHostPort(ip.String(), strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	}
	return errUnsupportedProbe
}

// port resolves a probe's port, by number or by the container port's name.
// probeURL is an httpGet probe's URL as kubelet builds it: the path may
// carry a query (a kube-apiserver's /readyz?exclude=...), and a path that
// does not parse goes as it is.
func probeURL(scheme, host string, port int, path string) *url.URL {
	u, err := url.Parse(path)
	if err != nil {
		u = &url.URL{Path: path}
	}
	u.Scheme, u.Host = scheme, net.JoinHostPort(host, strconv.Itoa(port))
	return u
}

func (c *container) port(p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.spec.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("container %s has no port named %q", c.spec.Name, p.StrVal)
}
