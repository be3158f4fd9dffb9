package podhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/internal/testing/childproc"
	"github.com/druid-stretch/druid-stretch/test/infrastructure/podhost/sandbox"
)

// podRun is the life of one pod on the node stand-in.
type podRun struct {
	h   *Host
	key string
	log logr.Logger
	dir string

	ctx    context.Context // ends when the pod is to stop
	cancel context.CancelFunc
	ended  chan struct{}

	mu         sync.Mutex
	pod        *corev1.Pod
	ip         net.IP
	netns      string
	phase      corev1.PodPhase
	message    string
	reason     string
	started    *metav1.Time
	initDone   bool
	containers []*container // init containers first
	stopping   bool
}

func newPodRun(h *Host, pod *corev1.Pod) *podRun {
	ctx, cancel := context.WithCancel(context.Background())
	key := pod.Namespace + "/" + pod.Name
	r := &podRun{
		h:      h,
		key:    key,
		log:    h.log.WithValues("pod", key),
		dir:    filepath.Join(h.opts.Dir, "pods", pod.Namespace+"_"+pod.Name+"_"+string(pod.UID)),
		ctx:    ctx,
		cancel: cancel,
		ended:  make(chan struct{}),
		pod:    pod,
		phase:  corev1.PodPending,
	}
	for i := range pod.Spec.InitContainers {
		r.containers = append(r.containers, newContainer(r, pod.Spec.InitContainers[i], true))
	}
	for i := range pod.Spec.Containers {
		r.containers = append(r.containers, newContainer(r, pod.Spec.Containers[i], false))
	}
	return r
}

func (r *podRun) update(pod *corev1.Pod) {
	r.mu.Lock()
	r.pod = pod
	r.mu.Unlock()
	r.publish()
}

// run sets the pod up, runs its init containers to completion and then its
// containers, until stop; then it tears the pod down.
func (r *podRun) run() {
	defer close(r.ended)
	defer r.h.forget(r)
	defer r.teardown()
	now := metav1.Now()
	r.mu.Lock()
	r.started = &now
	r.mu.Unlock()
	var paths map[string]string
	backoff := time.Second
	for {
		var err error
		if paths, err = r.setup(); err == nil {
			break
		}
		r.log.Info("pod not ready to start", "reason", err.Error())
		r.setMessage("ContainerCreating", err.Error())
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
	r.setMessage("", "")
	go r.syncVolumes()
	for _, c := range r.containers {
		if !c.init {
			continue
		}
		if !c.runToCompletion(paths) {
			return
		}
	}
	r.mu.Lock()
	r.initDone = true
	r.phase = corev1.PodRunning
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range r.containers {
		if c.init {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.supervise(paths)
		}()
	}
	r.publish()
	wg.Wait()
	r.mu.Lock()
	if r.ctx.Err() == nil {
		// Every container ended by itself, as the restartPolicy lets them
		// (Never, or OnFailure after a success): kubelet reports the pod
		// Succeeded when all exited 0, Failed otherwise. A Job counts its
		// pod by that phase; the teardown's default (Failed for a pod not
		// being deleted) would fail every Job.
		r.phase = r.endedPhaseLocked()
	}
	r.mu.Unlock()
}

// endedPhaseLocked is the phase of a pod whose containers all ended.
func (r *podRun) endedPhaseLocked() corev1.PodPhase {
	for _, c := range r.containers {
		if t := c.state.Terminated; !c.init && (t == nil || t.ExitCode != 0) {
			return corev1.PodFailed
		}
	}
	return corev1.PodSucceeded
}

// setup gives the pod its network, its /etc files and its volumes.
func (r *podRun) setup() (map[string]string, error) {
	r.mu.Lock()
	pod := r.pod.DeepCopy()
	have := r.ip != nil
	r.mu.Unlock()
	if !have {
		np, err := r.h.opts.Network.AddPod(r.key)
		if err != nil {
			return nil, fmt.Errorf("pod network: %w", err)
		}
		api := net.JoinHostPort("127.0.0.1", strconv.Itoa(r.h.apiPort))
		if _, err := r.h.opts.Network.ForwardIntoPod(r.key, api, r.h.opts.APIServer); err != nil {
			_ = r.h.opts.Network.RemovePod(r.key)
			return nil, fmt.Errorf("forwarding the kube-apiserver into the pod: %w", err)
		}
		r.mu.Lock()
		r.ip, r.netns = np.IP, np.NetnsPath
		r.mu.Unlock()
		for _, fqdn := range r.fqdns(pod) {
			r.h.opts.Network.SetHost(fqdn, np.IP)
		}
		r.publish()
	}
	if err := os.MkdirAll(filepath.Join(r.dir, "etc"), 0o755); err != nil {
		return nil, err
	}
	if err := r.writeEtc(pod); err != nil {
		return nil, err
	}
	return r.h.volumes(r.ctx, pod, r.dir)
}

// fqdn is the pod's own DNS name: <hostname>.<subdomain>.<ns>.svc.<domain>
// when it has a subdomain (a StatefulSet's headless Service), else empty.
// fqdns are the DNS names of a pod with a subdomain (a StatefulSet's): its
// in-cluster name, and with Options.ExternalDomain the name the site
// publishes to its peers.
func (r *podRun) fqdns(pod *corev1.Pod) []string {
	if pod.Spec.Subdomain == "" {
		return nil
	}
	names := []string{fmt.Sprintf("%s.%s.%s.svc.%s", hostname(pod), pod.Spec.Subdomain, pod.Namespace, r.h.opts.ClusterDomain)}
	if d := r.h.opts.ExternalDomain; d != "" {
		names = append(names, fmt.Sprintf("%s.%s.%s", hostname(pod), pod.Namespace, d))
	}
	return names
}

func hostname(pod *corev1.Pod) string {
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	return pod.Name
}

// writeEtc writes the pod's /etc/hosts (its own names and its hostAliases,
// as kubelet manages it), /etc/resolv.conf (the site's DNS with the
// cluster's search path) and /etc/hostname.
func (r *podRun) writeEtc(pod *corev1.Pod) error {
	r.mu.Lock()
	ip := r.ip
	r.mu.Unlock()
	var hosts strings.Builder
	hosts.WriteString("# Kubernetes-managed hosts file (druid-stretch node stand-in).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	names := hostname(pod)
	if fqdns := r.fqdns(pod); len(fqdns) > 0 {
		names = fqdns[0] + "\t" + names // kubelet writes the in-cluster name only
	}
	fmt.Fprintf(&hosts, "%s\t%s\n", ip, names)
	if len(pod.Spec.HostAliases) > 0 {
		hosts.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range pod.Spec.HostAliases {
			fmt.Fprintf(&hosts, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
		}
	}
	d := r.h.opts.ClusterDomain
	resolv := fmt.Sprintf("nameserver %s\nsearch %s.svc.%s svc.%s %s\noptions ndots:5\n", r.h.opts.Network.DNSServer(), pod.Namespace, d, d, d)
	for name, data := range map[string]string{"hosts": hosts.String(), "resolv.conf": resolv, "hostname": hostname(pod) + "\n"} {
		if err := os.WriteFile(filepath.Join(r.dir, "etc", name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// stop ends the pod: each container gets SIGTERM, then SIGKILL after grace.
// It returns when the pod is torn down.
func (r *podRun) stop(grace time.Duration) {
	r.mu.Lock()
	first := !r.stopping
	r.stopping = true
	r.mu.Unlock()
	if first {
		r.log.Info("stopping pod", "grace", grace)
		r.cancel()
		var wg sync.WaitGroup
		for _, c := range r.containers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.kill(grace)
			}()
		}
		wg.Wait()
	}
	<-r.ended
}

// teardown releases the network and reports every container terminated:
// virtual-kubelet deletes the Pod object once nothing runs.
func (r *podRun) teardown() {
	r.mu.Lock()
	r.stopping = true
	if r.phase == corev1.PodRunning || r.phase == corev1.PodPending {
		r.phase = corev1.PodSucceeded
		if r.pod.DeletionTimestamp == nil {
			r.phase = corev1.PodFailed
		}
	}
	pod := r.pod
	have := r.ip != nil
	r.mu.Unlock()
	r.cancel()
	if have {
		for _, fqdn := range r.fqdns(pod) {
			r.h.opts.Network.DeleteHost(fqdn)
		}
		if err := r.h.opts.Network.RemovePod(r.key); err != nil {
			r.log.Error(err, "releasing the pod network")
		}
	}
	r.publish()
}

func (r *podRun) setMessage(reason, message string) {
	r.mu.Lock()
	r.reason, r.message = reason, message
	r.mu.Unlock()
	r.publish()
}

// publish sends the current status to the API server.
func (r *podRun) publish() { r.h.changed(r.snapshot()) }

// snapshot is the pod with its current status.
func (r *podRun) snapshot() *corev1.Pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pod.DeepCopy()
	p.Status = r.statusLocked()
	return p
}

// statusLocked computes the PodStatus kubelet would report.
func (r *podRun) statusLocked() corev1.PodStatus {
	s := corev1.PodStatus{
		Phase:     r.phase,
		Reason:    "",
		Message:   r.message,
		HostIP:    "127.0.0.1",
		HostIPs:   []corev1.HostIP{{IP: "127.0.0.1"}},
		StartTime: r.started,
		// The API server sets the QoS class at creation and refuses a
		// change.
		QOSClass: r.pod.Status.QOSClass,
	}
	if r.ip != nil {
		s.PodIP = r.ip.String()
		s.PodIPs = []corev1.PodIP{{IP: s.PodIP}}
	}
	allReady := true
	for _, c := range r.containers {
		cs := c.statusLocked()
		if c.init {
			s.InitContainerStatuses = append(s.InitContainerStatuses, cs)
			continue
		}
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
		allReady = allReady && cs.Ready
	}
	allReady = allReady && r.initDone && !r.stopping
	now := metav1.Now()
	cond := func(t corev1.PodConditionType, ok bool, reason string) corev1.PodCondition {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, LastTransitionTime: now, Reason: reason}
		if ok {
			c.Status, c.Reason = corev1.ConditionTrue, ""
		}
		// Keep the transition time of an unchanged condition.
		for _, old := range r.pod.Status.Conditions {
			if old.Type == t && old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		return c
	}
	s.Conditions = []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, r.ip != nil && !r.stopping, ""),
		cond(corev1.PodInitialized, r.initDone, "ContainersNotInitialized"),
		cond(corev1.ContainersReady, allReady, "ContainersNotReady"),
		cond(corev1.PodReady, allReady, "ContainersNotReady"),
		cond(corev1.PodScheduled, true, ""),
	}
	if r.reason != "" && r.phase == corev1.PodPending {
		s.Reason = r.reason
	}
	return s
}

// container is one container of a pod and its process.
type container struct {
	r    *podRun
	spec corev1.Container
	init bool
	log  logr.Logger

	// guarded by r.mu
	state     corev1.ContainerState
	lastState corev1.ContainerState
	restarts  int32
	ready     bool
	started   bool
	cmd       *exec.Cmd
	exited    chan struct{}
}

func newContainer(r *podRun, spec corev1.Container, init bool) *container {
	return &container{
		r: r, spec: spec, init: init,
		log:   r.log.WithValues("container", spec.Name),
		state: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}},
	}
}

func (c *container) statusLocked() corev1.ContainerStatus {
	cs := corev1.ContainerStatus{
		Name:                 c.spec.Name,
		Image:                c.spec.Image,
		ImageID:              "standin://" + c.spec.Image,
		State:                c.state,
		LastTerminationState: c.lastState,
		RestartCount:         c.restarts,
		Ready:                c.ready,
		Started:              ptr.To(c.started),
	}
	if c.cmd != nil && c.cmd.Process != nil {
		cs.ContainerID = fmt.Sprintf("standin://%d", c.cmd.Process.Pid)
	}
	return cs
}

// runToCompletion runs an init container until it exits 0, restarting it
// after failures unless the pod's restartPolicy is Never. It returns false
// when the pod stops or fails first.
func (c *container) runToCompletion(paths map[string]string) bool {
	backoff := time.Second
	for {
		code, err := c.runOnce(paths)
		if c.r.ctx.Err() != nil {
			return false
		}
		if err == nil && code == 0 {
			return true
		}
		if c.r.pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
			c.r.mu.Lock()
			c.r.phase = corev1.PodFailed
			c.r.mu.Unlock()
			c.r.publish()
			return false
		}
		if !c.backoff(&backoff) {
			return false
		}
	}
}

// supervise keeps a container running as the pod's restartPolicy says.
func (c *container) supervise(paths map[string]string) {
	backoff := time.Second
	for {
		startedAt := time.Now()
		code, _ := c.runOnce(paths)
		if c.r.ctx.Err() != nil {
			return
		}
		switch c.r.pod.Spec.RestartPolicy {
		case corev1.RestartPolicyNever:
			return
		case corev1.RestartPolicyOnFailure:
			if code == 0 {
				return
			}
		}
		if time.Since(startedAt) > time.Minute {
			backoff = time.Second // ran long enough: a fresh failure
		}
		if !c.backoff(&backoff) {
			return
		}
	}
}

// backoff waits before a restart, showing CrashLoopBackOff as kubelet does.
func (c *container) backoff(d *time.Duration) bool {
	c.r.mu.Lock()
	c.restarts++
	c.lastState = c.state
	c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
		Reason: "CrashLoopBackOff", Message: fmt.Sprintf("back-off %s restarting failed container %s", *d, c.spec.Name),
	}}
	c.r.mu.Unlock()
	c.r.publish()
	select {
	case <-c.r.ctx.Done():
		return false
	case <-time.After(*d):
	}
	*d = min(2**d, c.r.h.opts.MaxRestartBackoff)
	return true
}

// runOnce starts the container's process, probes it while it runs and
// records how it ended.
func (c *container) runOnce(paths map[string]string) (int, error) {
	cmd, logFile, err := c.command(paths)
	if err != nil {
		c.log.Error(err, "container cannot start")
		c.setTerminated(128, "StartError", err.Error())
		return 128, err
	}
	defer func() { _ = logFile.Close() }()
	// The pod dies with the node stand-in's process, as with a kubelet
	// whose node goes away.
	if err := childproc.Start(cmd); err != nil {
		c.setTerminated(128, "StartError", err.Error())
		return 128, err
	}
	exited := make(chan struct{})
	c.r.mu.Lock()
	c.cmd, c.exited = cmd, exited
	c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
	c.started = c.spec.StartupProbe == nil
	c.ready = c.spec.ReadinessProbe == nil && c.started && !c.init
	c.r.mu.Unlock()
	c.log.Info("container started", "pid", cmd.Process.Pid)
	c.r.publish()
	probeCtx, stopProbes := context.WithCancel(c.r.ctx)
	probesDone := c.probe(probeCtx, cmd)
	err = cmd.Wait()
	stopProbes()
	<-probesDone
	close(exited)
	code := cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	c.log.Info("container exited", "code", code)
	c.setTerminated(code, reason, "")
	return code, err
}

func (c *container) setTerminated(code int, reason, message string) {
	c.r.mu.Lock()
	c.ready, c.started = false, false
	c.state = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: int32(code), Reason: reason, Message: message, FinishedAt: metav1.Now(),
	}}
	c.r.mu.Unlock()
	c.r.publish()
}

// kill ends the container's process group as kubelet does: its preStop
// hook, then SIGTERM, then SIGKILL once grace (counted from the hook's
// start) has passed.
func (c *container) kill(grace time.Duration) {
	c.r.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.r.mu.Unlock()
	if cmd == nil || cmd.Process == nil || exited == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	grace = c.preStop(grace, exited)
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		c.log.Info("container did not stop within its grace period; killing it", "grace", grace)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}

// minimumGrace is what kubelet leaves a container between SIGTERM and
// SIGKILL when its preStop hook used up the grace period (kubelet's
// minimumGracePeriodInSeconds).
const minimumGrace = 2 * time.Second

// preStop runs the container's preStop hook and returns the grace left for
// the stop that follows. The stand-in runs the sleep action only: an
// HTTP or exec hook needs a kubelet's prober or runtime, and is skipped
// with a log line (none of the site's pods has one).
func (c *container) preStop(grace time.Duration, exited <-chan struct{}) time.Duration {
	if c.spec.Lifecycle == nil || c.spec.Lifecycle.PreStop == nil {
		return grace
	}
	hook := c.spec.Lifecycle.PreStop
	if hook.Sleep == nil {
		c.log.Info("the stand-in runs only the sleep action of a preStop hook; this one is skipped")
		return grace
	}
	d := min(time.Duration(hook.Sleep.Seconds)*time.Second, grace)
	c.log.Info("running the preStop hook", "sleep", d)
	began := time.Now()
	select {
	case <-exited:
	case <-time.After(d):
	}
	return max(grace-time.Since(began), minimumGrace)
}

// command builds the sandboxed process of the container.
func (c *container) command(paths map[string]string) (*exec.Cmd, io.WriteCloser, error) {
	r := c.r
	r.mu.Lock()
	pod := r.pod.DeepCopy()
	netns := r.netns
	r.mu.Unlock()
	img, err := r.h.opts.Images.Lookup(c.spec.Image)
	if err != nil {
		return nil, nil, err
	}
	env := c.env(pod, img)
	args, err := commandLine(c.spec, img, env)
	if err != nil {
		return nil, nil, err
	}
	root := filepath.Join(r.dir, "roots", c.spec.Name)
	tmp := filepath.Join(r.dir, "tmp", c.spec.Name)
	for _, d := range []string{root, tmp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, nil, err
		}
	}
	if err := os.Chmod(tmp, 0o1777); err != nil {
		return nil, nil, err
	}
	var mounts []sandbox.Mount
	// The host's system folders stand in for the image's own: the images'
	// programs are static binaries, and a shell image's tools are the host's.
	for _, d := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc/ssl"} {
		if _, err := os.Stat(d); err == nil {
			mounts = append(mounts, sandbox.Mount{Source: d, Target: d, ReadOnly: true})
		}
	}
	mounts = append(mounts,
		sandbox.Mount{Source: "/dev", Target: "/dev"},
		sandbox.Mount{Source: "/proc", Target: "/proc"},
		sandbox.Mount{Source: tmp, Target: "/tmp"},
		sandbox.Mount{Source: filepath.Join(r.dir, "etc", "hosts"), Target: "/etc/hosts", ReadOnly: true},
		sandbox.Mount{Source: filepath.Join(r.dir, "etc", "resolv.conf"), Target: "/etc/resolv.conf", ReadOnly: true},
		sandbox.Mount{Source: filepath.Join(r.dir, "etc", "hostname"), Target: "/etc/hostname", ReadOnly: true},
	)
	if img.Binary != "" {
		mounts = append(mounts, sandbox.Mount{Source: img.Binary, Target: img.Entrypoint, ReadOnly: true})
	}
	uid, gid, groups := credentials(pod, c.spec, img)
	// An image's home folder belongs to its user and is writable (the
	// etcd-wrapper writes its etcd config there); volumes mounted below it
	// come after it in the list and so on top of it.
	if h := home(uid); h != "/" {
		dir := filepath.Join(r.dir, "home", c.spec.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, nil, err
		}
		if err := os.Chown(dir, int(uid), int(gid)); err != nil {
			return nil, nil, err
		}
		mounts = append(mounts, sandbox.Mount{Source: dir, Target: h})
	}
	for _, vm := range c.spec.VolumeMounts {
		src, ok := paths[vm.Name]
		if !ok {
			return nil, nil, fmt.Errorf("volumeMount %q names no volume of the pod", vm.Name)
		}
		if vm.SubPath != "" {
			src = filepath.Join(src, filepath.Clean("/"+vm.SubPath))
			if err := os.MkdirAll(src, 0o755); err != nil {
				return nil, nil, err
			}
		}
		mounts = append(mounts, sandbox.Mount{Source: src, Target: vm.MountPath, ReadOnly: vm.ReadOnly})
	}
	cmd, err := sandbox.Command(r.h.opts.Sandbox, sandbox.Spec{
		Netns: netns, Hostname: hostname(pod), Root: root, Mounts: mounts,
		Args: args, Env: env, WorkingDir: c.spec.WorkingDir,
		UID: uid, GID: gid, Groups: groups,
	})
	if err != nil {
		return nil, nil, err
	}
	logFile, err := os.OpenFile(filepath.Join(r.dir, c.spec.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	return cmd, logFile, nil
}

// env is the container's environment: kubelet's service variables for the
// kube-apiserver, the hostname, then the container's own variables (their
// valueFrom already resolved by virtual-kubelet).
func (c *container) env(pod *corev1.Pod, img Image) []string {
	port := strconv.Itoa(c.r.h.apiPort)
	uid, _, _ := credentials(pod, c.spec, img)
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOSTNAME=" + hostname(pod),
		"HOME=" + home(uid),
		"KUBERNETES_SERVICE_HOST=127.0.0.1",
		"KUBERNETES_SERVICE_PORT=" + port,
		"KUBERNETES_SERVICE_PORT_HTTPS=" + port,
	}
	for _, e := range c.spec.Env {
		env = append(env, e.Name+"="+expand(e.Value, env))
	}
	return env
}

// home is the HOME a container runtime sets from the image's /etc/passwd.
// druid's images are distroless: root's home is /root and the nonroot user
// 65532's /home/nonroot (backup-restore's Local store lives there).
func home(uid uint32) string {
	switch uid {
	case 0:
		return "/root"
	case 65532:
		return "/home/nonroot"
	}
	return "/"
}

// commandLine is the container's argv: its command, or the image's
// entrypoint, followed by its args, with $(VAR) references expanded from
// env as Kubernetes does.
func commandLine(spec corev1.Container, img Image, env []string) ([]string, error) {
	argv := append([]string{}, spec.Command...)
	if len(argv) == 0 {
		if img.Entrypoint == "" {
			return nil, fmt.Errorf("container %s has no command and its image %s no entrypoint", spec.Name, spec.Image)
		}
		argv = []string{img.Entrypoint}
	}
	argv = append(argv, spec.Args...)
	for i := range argv {
		argv[i] = expand(argv[i], env)
	}
	return argv, nil
}

// expand replaces $(NAME) by NAME's value in env; $$ escapes a $, and a
// reference to an unknown variable stays as written, as in Kubernetes.
func expand(s string, env []string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	lookup := func(name string) (string, bool) {
		for i := len(env) - 1; i >= 0; i-- {
			if v, ok := strings.CutPrefix(env[i], name+"="); ok {
				return v, true
			}
		}
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+end+1])
			}
			i += end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// credentials are the user, group and supplementary groups of a container:
// its security context over the pod's; when neither names a user, the
// image's USER (with its group unless one is named), as a container
// runtime runs it; root when the image has none either. A Job druid
// creates names no user: its etcdbrctl runs as distroless's nonroot, whose
// home holds the Local backup store.
func credentials(pod *corev1.Pod, c corev1.Container, img Image) (uid, gid uint32, groups []uint32) {
	var u, g *int64
	if ps := pod.Spec.SecurityContext; ps != nil {
		u, g = ps.RunAsUser, ps.RunAsGroup
		for _, sg := range ps.SupplementalGroups {
			groups = append(groups, uint32(sg))
		}
		if ps.FSGroup != nil {
			groups = append(groups, uint32(*ps.FSGroup))
		}
	}
	if cs := c.SecurityContext; cs != nil {
		if cs.RunAsUser != nil {
			u = cs.RunAsUser
		}
		if cs.RunAsGroup != nil {
			g = cs.RunAsGroup
		}
	}
	if u == nil && img.User != nil {
		uid, gid = img.User.UID, img.User.GID
		if g != nil {
			gid = uint32(*g)
		}
		return uid, gid, groups
	}
	return uint32(ptr.Deref(u, 0)), uint32(ptr.Deref(g, 0)), groups
}

var errUnsupportedProbe = errors.New("this probe handler is not supported by the node stand-in (httpGet and tcpSocket are)")
