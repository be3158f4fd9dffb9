package podhost

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/druid-stretch/druid-stretch/internal/podnet"
)

// serviceDNS publishes each Service's name, <svc>.<ns>.svc.<domain>, with the
// addresses of its ready endpoints (all endpoints for a Service that
// publishes not-ready addresses, as the EndpointSlice controller marks
// them). A ClusterIP Service resolves to its endpoints too: there is no
// kube-proxy here to answer on a virtual IP, and every client of these sites
// dials by name.
type serviceDNS struct {
	client kubernetes.Interface
	net    *podnet.Network
	domain string
	log    logr.Logger

	mu        sync.Mutex
	published map[string]bool // fqdn
}

func newServiceDNS(c kubernetes.Interface, n *podnet.Network, domain string, log logr.Logger) *serviceDNS {
	return &serviceDNS{client: c, net: n, domain: domain, log: log.WithName("dns"), published: map[string]bool{}}
}

func (d *serviceDNS) run(ctx context.Context) {
	f := informers.NewSharedInformerFactory(d.client, 10*time.Minute)
	slices := f.Discovery().V1().EndpointSlices()
	services := f.Core().V1().Services()
	resync := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case resync <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke}
	if _, err := slices.Informer().AddEventHandler(handler); err != nil {
		d.log.Error(err, "watching EndpointSlices")
		return
	}
	if _, err := services.Informer().AddEventHandler(handler); err != nil {
		d.log.Error(err, "watching Services")
		return
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	for {
		select {
		case <-ctx.Done():
			return
		case <-resync:
		}
		svcs, err := services.Lister().List(labels.Everything())
		if err != nil {
			continue
		}
		all, err := slices.Lister().List(labels.Everything())
		if err != nil {
			continue
		}
		d.sync(svcs, all)
	}
}

// sync replaces the published records with those of svcs and slices.
func (d *serviceDNS) sync(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice) {
	want := map[string][]net.IP{}
	for _, s := range svcs {
		want[fmt.Sprintf("%s.%s.svc.%s", s.Name, s.Namespace, d.domain)] = nil
	}
	for _, es := range slices {
		svc := es.Labels[discoveryv1.LabelServiceName]
		if svc == "" {
			continue
		}
		name := fmt.Sprintf("%s.%s.svc.%s", svc, es.Namespace, d.domain)
		if _, ok := want[name]; !ok {
			continue
		}
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				if ip := net.ParseIP(a); ip != nil {
					want[name] = append(want[name], ip)
				}
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for name := range d.published {
		if _, ok := want[name]; !ok {
			d.net.DeleteHost(name)
			delete(d.published, name)
		}
	}
	for name, ips := range want {
		if len(ips) == 0 {
			d.net.DeleteHost(name)
			delete(d.published, name)
			continue
		}
		d.net.SetHost(name, ips...)
		d.published[name] = true
	}
}
