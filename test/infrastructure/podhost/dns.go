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

	"github.com/druid-stretch/druid-stretch/test/infrastructure/podnet"
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
	want := serviceRecords(svcs, slices, d.domain)
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

// serviceRecords are the DNS names of svcs (under domain) with the
// addresses of their ready endpoints in slices; a name with no address is
// listed empty, to be withdrawn.
func serviceRecords(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice, domain string) map[string][]net.IP {
	want := map[string][]net.IP{}
	headless := map[string]bool{}
	for _, s := range svcs {
		name := fmt.Sprintf("%s.%s.svc.%s", s.Name, s.Namespace, domain)
		want[name] = nil
		headless[name] = s.Spec.ClusterIP == corev1.ClusterIPNone
	}
	for _, es := range slices {
		svc := es.Labels[discoveryv1.LabelServiceName]
		if svc == "" {
			continue
		}
		name := fmt.Sprintf("%s.%s.svc.%s", svc, es.Namespace, domain)
		if _, ok := want[name]; !ok {
			continue
		}
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			var ips []net.IP
			for _, a := range ep.Addresses {
				if ip := net.ParseIP(a); ip != nil {
					ips = append(ips, ip)
				}
			}
			want[name] = append(want[name], ips...)
			// A headless Service's endpoint with a hostname is also
			// <hostname>.<svc>.<ns>.svc, as CoreDNS answers it. For a pod's
			// endpoint the pod runner publishes that name as the pod starts
			// (podRun.fqdns); here come the endpoints no pod of this site
			// backs, such as those druid-stretch writes for members in
			// another cluster.
			if ep.Hostname != nil && headless[name] && (ep.TargetRef == nil || ep.TargetRef.Kind != "Pod") {
				want[*ep.Hostname+"."+name] = append(want[*ep.Hostname+"."+name], ips...)
			}
		}
	}
	return want
}
