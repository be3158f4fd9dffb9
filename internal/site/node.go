package site

import (
	"context"
	"net/url"
	"path/filepath"

	"github.com/druid-stretch/druid-stretch/internal/podhost"
	"github.com/druid-stretch/druid-stretch/internal/podnet"
	"github.com/druid-stretch/druid-stretch/internal/testbin"
)

// NodeName is the site's one node.
const NodeName = "node-0"

// SidecarImage is the druid-stretch image reference the site's webhook
// injects; the node runs the druid-stretch binary for it.
const SidecarImage = "registry.local/druid-stretch:site"

// Images is the site's image table: what each image reference that druid,
// druid-stretch and the tests put into Pods runs on the node stand-in,
// keyed by the last element of the repository (so any registry and tag
// match). There is no container runtime or registry on these machines.
//
//	etcd-wrapper   bin/etcd-wrapper, the etcd-wrapper stand-in (hack/standins/etcd-wrapper), at /etcd-wrapper
//	etcdbrctl      bin/etcdbrctl, the real etcd-backup-restore, at /etcdbrctl
//	druid-stretch  bin/druid-stretch-static, at /druid-stretch
//	kube-apiserver bin/envtest/kube-apiserver, the site's own, at /kube-apiserver (a shoot's, see NewShootAPIServer)
//	alpine         no binary: the host's shell and tools (druid's init container runs chown)
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
		"etcdbrctl":      {Binary: br, Entrypoint: "/etcdbrctl"},
		"druid-stretch":  {Binary: stretch, Entrypoint: "/druid-stretch"},
		"kube-apiserver": {Binary: apiserver, Entrypoint: "/kube-apiserver"},
		"alpine":         {},
	}, nil
}

// startNode creates the pod network and registers the node stand-in.
func (s *Site) startNode(ctx context.Context) error {
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
	h, err := podhost.Start(ctx, podhost.Options{
		Client:         s.Kube,
		NodeName:       NodeName,
		Dir:            filepath.Join(s.Dir, "node"),
		HostPathRoot:   s.HostPathRoot,
		Network:        n,
		APIServer:      api.Host,
		Images:         images,
		Sandbox:        sandbox,
		ClusterDomain:  ClusterDomain,
		ExternalDomain: s.opts.Domain,
		Logger:         s.log,
	})
	if err != nil {
		return err
	}
	s.Node = h
	s.onStop(h.Close)
	return nil
}
