package site

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/test/infrastructure/podhost"
	"github.com/druid-stretch/druid-stretch/test/infrastructure/podnet"
)

// NodeName is the node of a site started without Options.Nodes.
const NodeName = "node-0"

// NodeOptions configure one node of a site.
type NodeOptions struct {
	// Name names the Node; required and unique in the site.
	Name string
	// Labels are set on the Node once it registered, as an operator labels
	// a node (kubectl label node): node groups are told apart by them.
	Labels map[string]string
}

// SidecarImage is the druid-stretch image reference the site's webhook
// injects; the node runs the druid-stretch binary for it.
const SidecarImage = "registry.local/druid-stretch:site"

// Images is the site's image table: what each image reference that druid,
// druid-stretch and the tests put into Pods runs on the node stand-in,
// keyed by the last element of the repository (so any registry and tag
// match). There is no container runtime or registry on these machines.
//
//	etcd-wrapper   bin/etcd-wrapper, the etcd-wrapper stand-in (test/cmd/etcd-wrapper), at /etcd-wrapper
//	etcdbrctl      bin/etcdbrctl, the real etcd-backup-restore, at /etcdbrctl, USER 65532:65532
//	druid-stretch  bin/druid-stretch-static, at /druid-stretch
//	kube-apiserver bin/envtest/kube-apiserver, the site's own, at /kube-apiserver (a shoot's, see NewShootAPIServer)
//	alpine         no binary: the host's shell and tools (druid's init container runs chown)
//
// etcdbrctl's image is distroless's static nonroot (etcd-backup-restore's
// build/Dockerfile), so a container that names no user runs as 65532 with
// the home /home/nonroot: druid's compaction Job names none and mounts the
// Local store under that home. druid's StatefulSet names its users itself.
func Images() (podhost.Images, error) {
	wrapper, err := testbin.EtcdWrapper()
	if err != nil {
		return nil, err
	}
	br, err := testbin.Etcdbrctl()
	if err != nil {
		return nil, err
	}
	stretch, err := testbin.DruidStretchStatic()
	if err != nil {
		return nil, err
	}
	apiserver, err := testbin.KubeAPIServer()
	if err != nil {
		return nil, err
	}
	return podhost.Images{
		"etcd-wrapper":   {Binary: wrapper, Entrypoint: "/etcd-wrapper"},
		"etcdbrctl":      {Binary: br, Entrypoint: "/etcdbrctl", User: &podhost.ImageUser{UID: 65532, GID: 65532}},
		"druid-stretch":  {Binary: stretch, Entrypoint: "/druid-stretch"},
		"kube-apiserver": {Binary: apiserver, Entrypoint: "/kube-apiserver"},
		"alpine":         {},
	}, nil
}

// Node is one node of a site: a node stand-in on the site's pod network,
// with the site's hostPath root.
type Node struct {
	// Name is the Node's name.
	Name string
	// Dir holds the pods the node ran, one folder each:
	// pods/<namespace>_<pod>_<uid>/<container>.log. It is the site's node/
	// for a site of one node, nodes/<name>/ for each node of a site of
	// several.
	Dir string
	// Host is the node stand-in.
	Host *podhost.Host
}

// nodeOptions are the site's nodes: Options.Nodes, or the one node
// NodeName.
func (o Options) nodeOptions() ([]NodeOptions, error) {
	if len(o.Nodes) == 0 {
		return []NodeOptions{{Name: NodeName}}, nil
	}
	seen := map[string]bool{}
	for i, n := range o.Nodes {
		if n.Name == "" {
			return nil, fmt.Errorf("site: Options.Nodes[%d] has no name", i)
		}
		if seen[n.Name] {
			return nil, fmt.Errorf("site: Options.Nodes names %q twice", n.Name)
		}
		seen[n.Name] = true
	}
	return o.Nodes, nil
}

// startNodes creates the pod network and registers the node stand-ins, all
// on that one network and hostPath root, as the nodes of one cluster share
// its pod network and the site's volumes are reachable from every node.
func (s *Site) startNodes(ctx context.Context) error {
	nodes, err := s.opts.nodeOptions()
	if err != nil {
		return err
	}
	n, err := podnet.New(podnet.Options{CIDR: s.opts.PodCIDR})
	if err != nil {
		return err
	}
	n.SetZone(s.opts.Domain)
	s.Network = n
	s.onStop(n.Close)
	images, err := Images()
	if err != nil {
		return err
	}
	sandbox, err := testbin.PodSandbox()
	if err != nil {
		return err
	}
	api, err := url.Parse(s.Config.Host)
	if err != nil {
		return err
	}
	for i, no := range nodes {
		dir := filepath.Join(s.Dir, "node")
		if len(nodes) > 1 {
			dir = filepath.Join(s.Dir, "nodes", no.Name)
		}
		h, err := podhost.Start(ctx, podhost.Options{
			Client:         s.Kube,
			NodeName:       no.Name,
			Dir:            dir,
			HostPathRoot:   s.HostPathRoot,
			Network:        n,
			APIServer:      api.Host,
			Images:         images,
			Sandbox:        sandbox,
			ClusterDomain:  ClusterDomain,
			ExternalDomain: s.opts.Domain,
			// One publisher of the Services' names per network: the
			// first node's.
			SkipServiceDNS: i > 0,
			Logger:         s.log,
		})
		if err != nil {
			return fmt.Errorf("node %s: %w", no.Name, err)
		}
		s.onStop(h.Close)
		if err := s.labelNode(ctx, no.Name, no.Labels); err != nil {
			return err
		}
		s.Nodes = append(s.Nodes, &Node{Name: no.Name, Dir: dir, Host: h})
	}
	s.Node = s.Nodes[0].Host
	return nil
}

// labelNode adds labels to a registered Node, as an operator does with
// kubectl label node (virtual-kubelet's status updates keep labels others
// set).
func (s *Site) labelNode(ctx context.Context, name string, labels map[string]string) error {
	if len(labels) == 0 {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	if _, err := s.Kube.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling node %s: %w", name, err)
	}
	return nil
}

// NodeNamed is the site's node of that name, nil if it has none.
func (s *Site) NodeNamed(name string) *Node {
	for _, n := range s.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// PodFolders are the folders of the pods every node of the site ran whose
// folder name (<namespace>_<pod>_<uid>) matches pattern (filepath.Match),
// a deleted and recreated pod's every run included.
func (s *Site) PodFolders(pattern string) ([]string, error) {
	var out []string
	for _, n := range s.Nodes {
		dirs, err := filepath.Glob(filepath.Join(n.Dir, "pods", pattern))
		if err != nil {
			return nil, err
		}
		out = append(out, dirs...)
	}
	return out, nil
}

// Cordon marks a node unschedulable (spec.unschedulable), as kubectl cordon
// does, or schedulable again (kubectl uncordon). Pods already bound to it
// keep running; the scheduler binds no new pod to it.
func (s *Site) Cordon(ctx context.Context, node string, cordoned bool) error {
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": cordoned}})
	if err != nil {
		return err
	}
	if _, err := s.Kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("setting spec.unschedulable of node %s to %t: %w", node, cordoned, err)
	}
	return nil
}

// ContainerLogs is a container's output over every run of the pod of that
// name on any node of the site, a deleted and recreated one included (a
// node keeps each pod's folder, named by its UID), and how many runs that
// were.
func (s *Site) ContainerLogs(namespace, pod, container string) (log string, runs int, err error) {
	dirs, err := s.PodFolders(namespace + "_" + pod + "_*")
	if err != nil {
		return "", 0, err
	}
	var out strings.Builder
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, container+".log"))
		if err != nil && !os.IsNotExist(err) {
			return "", 0, err
		}
		out.Write(b)
	}
	return out.String(), len(dirs), nil
}
