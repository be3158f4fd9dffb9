// Package podhost is the node stand-in of a test site: where kubelet would
// run, it registers a Node (through virtual-kubelet's node and pod
// controllers) and runs every Pod bound to it as host processes, from the Pod
// exactly as the API server holds it.
//
// Each Pod gets its own network namespace (package podnet: its own loopback,
// ports and IP, reachable from the other pods by IP and by DNS name), and each
// container runs through the pod-sandbox helper (package sandbox): chrooted
// into a root made of the image's binary, the host's system folders and the
// Pod's volumes at their mountPaths, under the user and groups of its
// security context. Volumes are files: ConfigMaps, Secrets, projected
// ServiceAccount tokens and downward API fields are written out;
// PersistentVolumeClaims are the folders of their bound hostPath volumes and
// outlive the pod; hostPath volumes are folders under Options.HostPathRoot.
// Readiness, liveness and startup probes run against the pod's IP; the Pod
// status (phase, conditions, container states, restarts, pod IP) is written
// back. Services get DNS names resolving to their ready endpoints.
//
// What a real kubelet does that this stand-in does not is listed in
// docs/sites.md, each with its reason.
package podhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/druid-stretch/druid-stretch/test/infrastructure/podnet"
)

// Options configure a Host.
type Options struct {
	// Client is an admin client of the site's kube-apiserver. Required.
	Client kubernetes.Interface
	// NodeName names the Node (default "node-0").
	NodeName string
	// Dir holds the pods' roots, volumes and container logs. Required.
	Dir string
	// HostPathRoot is where hostPath volumes live (default Dir/hostpath).
	HostPathRoot string
	// Network gives each pod its network namespace, IP and DNS. Required.
	Network *podnet.Network
	// APIServer is the kube-apiserver's host:port in this process's network
	// namespace. Each pod reaches it at 127.0.0.1 on the same port
	// (KUBERNETES_SERVICE_HOST and _PORT), so that its serving certificate
	// for 127.0.0.1 stays valid. Required.
	APIServer string
	// Images maps the pods' image references to local binaries. Required.
	Images Images
	// Sandbox is the path of the pod-sandbox helper binary. Required.
	Sandbox string
	// ClusterDomain is the DNS domain of the site (default cluster.local).
	ClusterDomain string
	// ExternalDomain, when set, also names each StatefulSet pod
	// <hostname>.<namespace>.<ExternalDomain>, as a seed's external DNS
	// would: the name under which other sites reach it (podnet.Peer).
	ExternalDomain string
	// SkipServiceDNS leaves the Services' DNS names to another Host on the
	// same Network. Those names are the cluster's, not a node's: two Hosts
	// publishing them from two informer caches would each overwrite the
	// other's fresher records with staler ones while endpoints change.
	SkipServiceDNS bool
	// VolumeSyncPeriod is how often a running pod's Secret and ConfigMap
	// volumes are compared with their objects and updated in place
	// (default 10 s; kubelet's sync is about a minute): a renewed
	// certificate reaches the containers without a restart.
	VolumeSyncPeriod time.Duration
	// MaxRestartBackoff caps the wait between restarts of a failing
	// container (default 20 s; kubelet's is 5 minutes, far longer than a
	// test).
	MaxRestartBackoff time.Duration
	// Logger receives the node stand-in's events.
	Logger logr.Logger
}

// Host is a running node stand-in.
type Host struct {
	opts    Options
	log     logr.Logger
	apiPort int
	node    *nodeutil.Node
	dns     *serviceDNS
	cancel  context.CancelFunc
	done    chan struct{}

	mu     sync.Mutex
	pods   map[string]*podRun // namespace/name
	notify func(*corev1.Pod)
	closed bool
	runs   sync.WaitGroup
}

// Start registers the Node and serves its pods until Close.
func Start(ctx context.Context, opts Options) (*Host, error) {
	if opts.Client == nil || opts.Dir == "" || opts.Network == nil || opts.APIServer == "" || opts.Sandbox == "" || opts.Images == nil {
		return nil, errors.New("podhost: Client, Dir, Network, APIServer, Sandbox and Images are required")
	}
	if opts.NodeName == "" {
		opts.NodeName = "node-0"
	}
	if opts.HostPathRoot == "" {
		opts.HostPathRoot = filepath.Join(opts.Dir, "hostpath")
	}
	if opts.ClusterDomain == "" {
		opts.ClusterDomain = "cluster.local"
	}
	if opts.VolumeSyncPeriod <= 0 {
		opts.VolumeSyncPeriod = 10 * time.Second
	}
	if opts.MaxRestartBackoff <= 0 {
		opts.MaxRestartBackoff = 20 * time.Second
	}
	_, port, err := net.SplitHostPort(opts.APIServer)
	if err != nil {
		return nil, fmt.Errorf("podhost: APIServer %q: %w", opts.APIServer, err)
	}
	apiPort, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("podhost: APIServer %q: %w", opts.APIServer, err)
	}
	if _, err := os.Stat(opts.Sandbox); err != nil {
		return nil, fmt.Errorf("podhost: the pod-sandbox helper: %w (build it with hack/test-binaries.sh)", err)
	}
	h := &Host{
		opts:    opts,
		log:     opts.Logger.WithName("node").WithValues("node", opts.NodeName),
		apiPort: apiPort,
		pods:    map[string]*podRun{},
		done:    make(chan struct{}),
	}
	n, err := nodeutil.NewNode(opts.NodeName, func(cfg nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		describeNode(cfg.Node)
		return h, nil, nil
	}, nodeutil.WithClient(opts.Client), func(c *nodeutil.NodeConfig) error {
		// kubelet's API (logs, exec) is not served: nothing here calls it.
		c.HTTPListenAddr = "127.0.0.1:0"
		c.Handler = noKubeletAPI{}
		c.NumWorkers = 4
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("podhost: %w", err)
	}
	h.node = n
	runCtx, cancel := context.WithCancel(vklog.WithLogger(context.Background(), vkLogger{h.log.WithName("virtual-kubelet")}))
	h.cancel = cancel
	if !opts.SkipServiceDNS {
		h.dns = newServiceDNS(opts.Client, opts.Network, opts.ClusterDomain, h.log)
		go h.dns.run(runCtx)
	}
	go func() {
		defer close(h.done)
		if err := n.Run(runCtx); err != nil && runCtx.Err() == nil {
			h.log.Error(err, "node stand-in stopped")
		}
	}()
	if err := n.WaitReady(ctx, time.Minute); err != nil {
		_ = h.Close()
		return nil, fmt.Errorf("podhost: the node did not get ready: %w", err)
	}
	return h, nil
}

// describeNode fills in what the scheduler and a reader look at.
func describeNode(n *corev1.Node) {
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	n.Labels["kubernetes.io/os"] = "linux"
	n.Status.Capacity = res
	n.Status.Allocatable = res
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: n.Name}}
	n.Status.NodeInfo = corev1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64", KubeletVersion: "druid-stretch-node-standin"}
}

// Close stops every pod (as a node drain would, with each pod's grace
// period) and the node controllers. It is safe to call twice.
func (h *Host) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	runs := make([]*podRun, 0, len(h.pods))
	for _, r := range h.pods {
		runs = append(runs, r)
	}
	h.mu.Unlock()
	for _, r := range runs {
		r.stop(5 * time.Second)
	}
	h.runs.Wait()
	if h.cancel != nil {
		h.cancel()
		<-h.done
	}
	return nil
}

// Pod returns what the stand-in knows of a pod it runs: its IP and the
// folder of its container logs.
func (h *Host) Pod(namespace, name string) (ip net.IP, logDir string, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.pods[namespace+"/"+name]
	if !ok {
		return nil, "", false
	}
	return r.ip, r.dir, true
}

// CreatePod starts a pod's lifecycle; it returns at once and reports
// progress through the pod status.
func (h *Host) CreatePod(_ context.Context, pod *corev1.Pod) error {
	key := pod.Namespace + "/" + pod.Name
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return errors.New("the node stand-in is shutting down")
	}
	if old, ok := h.pods[key]; ok && old.pod.UID == pod.UID {
		return nil
	}
	r := newPodRun(h, pod.DeepCopy())
	h.pods[key] = r
	h.runs.Add(1)
	go func() {
		defer h.runs.Done()
		r.run()
	}()
	return nil
}

// UpdatePod takes a changed pod spec. A pod's containers do not change in
// place (Kubernetes forbids it except for the image, which the stand-in
// does not roll); the new object is kept for its status.
func (h *Host) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	h.mu.Lock()
	r, ok := h.pods[pod.Namespace+"/"+pod.Name]
	h.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("pod %s/%s is not running here", pod.Namespace, pod.Name)
	}
	r.update(pod.DeepCopy())
	return nil
}

// DeletePod stops a pod's containers within its grace period and reports it
// terminated.
func (h *Host) DeletePod(_ context.Context, pod *corev1.Pod) error {
	key := pod.Namespace + "/" + pod.Name
	h.mu.Lock()
	r, ok := h.pods[key]
	h.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("pod %s is not running here", key)
	}
	grace := 30 * time.Second
	if pod.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	} else if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	go func() {
		r.stop(grace)
		h.deleteTerminated(pod)
	}()
	return nil
}

// deleteTerminated deletes the Pod object of a pod being deleted once its
// containers have ended, as kubelet's status manager does (grace 0, on the
// UID the deletion was for). virtual-kubelet would delete it only when the
// pod's grace period has passed since the deletion began, or at its next
// sync: a pod that stopped 1.6 s into a 5 s grace period stayed in the API
// for 3.4 s more, and whoever waited for it to go (a Deployment scaled to
// 0, a StatefulSet's ordered rollout) waited that long.
func (h *Host) deleteTerminated(pod *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := h.opts.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	switch {
	case err == nil:
		h.log.Info("deleted the terminated pod", "pod", pod.Namespace+"/"+pod.Name)
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// Gone already, or a new pod of the same name (a StatefulSet's).
	default:
		h.log.Info("deleting the terminated pod failed; virtual-kubelet deletes it after its grace period", "pod", pod.Namespace+"/"+pod.Name, "error", err.Error())
	}
}

// forget drops a pod that has ended, if it is still the one registered.
func (h *Host) forget(r *podRun) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pods[r.key] == r {
		delete(h.pods, r.key)
	}
}

// GetPod returns the pod as last given, with its current status.
func (h *Host) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	h.mu.Lock()
	r, ok := h.pods[namespace+"/"+name]
	h.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not running here", namespace, name)
	}
	return r.snapshot(), nil
}

// GetPodStatus returns a pod's current status.
func (h *Host) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	p, err := h.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &p.Status, nil
}

// GetPods returns every pod the stand-in runs.
func (h *Host) GetPods(context.Context) ([]*corev1.Pod, error) {
	h.mu.Lock()
	runs := make([]*podRun, 0, len(h.pods))
	for _, r := range h.pods {
		runs = append(runs, r)
	}
	h.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(runs))
	for _, r := range runs {
		pods = append(pods, r.snapshot())
	}
	return pods, nil
}

// NotifyPods takes the callback through which status changes reach the
// API server.
func (h *Host) NotifyPods(_ context.Context, f func(*corev1.Pod)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notify = f
}

// changed reports a pod's new status.
func (h *Host) changed(p *corev1.Pod) {
	h.mu.Lock()
	f := h.notify
	h.mu.Unlock()
	if f != nil {
		f(p)
	}
}

// GetContainerLogs returns a container's log file.
func (h *Host) GetContainerLogs(_ context.Context, namespace, podName, containerName string, _ api.ContainerLogOpts) (io.ReadCloser, error) {
	_, dir, ok := h.Pod(namespace, podName)
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s is not running here", namespace, podName)
	}
	return os.Open(filepath.Join(dir, containerName+".log"))
}

// RunInContainer is not supported: no test execs into a pod.
func (h *Host) RunInContainer(context.Context, string, string, string, []string, api.AttachIO) error {
	return errdefs.InvalidInput("exec is not supported by the node stand-in")
}

// AttachToContainer is not supported.
func (h *Host) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return errdefs.InvalidInput("attach is not supported by the node stand-in")
}

// GetStatsSummary is not supported.
func (h *Host) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errdefs.InvalidInput("stats are not supported by the node stand-in")
}

// GetMetricsResource is not supported.
func (h *Host) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, errdefs.InvalidInput("metrics are not supported by the node stand-in")
}

// PortForward is not supported.
func (h *Host) PortForward(context.Context, string, string, int32, io.ReadWriteCloser) error {
	return errdefs.InvalidInput("port-forward is not supported by the node stand-in")
}

// noKubeletAPI answers every kubelet API call with 501.
type noKubeletAPI struct{}

func (noKubeletAPI) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "the node stand-in serves no kubelet API", http.StatusNotImplemented)
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// statGID is a file's group.
func statGID(st os.FileInfo) int {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(s.Gid)
	}
	return -1
}
