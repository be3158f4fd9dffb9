// Package podnet gives the pods of the real test site a network of their own,
// as a CNI bridge plugin would on a real node.
//
// A Network is one "switch" network namespace holding a Linux bridge with the
// gateway address of the pod CIDR (10.244.0.1 in 10.244.0.0/16 by default).
// Each pod gets its own network namespace with lo up (so 127.0.0.1 and every
// port are the pod's own) and eth0, one end of a veth pair whose other end is
// a port of the bridge. Pods therefore reach each other by pod IP, and two
// pods may both bind 0.0.0.0 on the same port.
//
// Nothing is added to the host's root namespace: no interface, address or
// route. The namespaces have no name (nothing under /var/run/netns); each is
// kept alive by a file descriptor of this process, so they vanish with it even
// when it crashes. The root namespace talks to the pod network only through
// this package: DialContext dials from inside the switch namespace,
// ForwardIntoPod lets a pod reach a listener of the host (the kube-apiserver
// on 127.0.0.1), ForwardFromHost lets a host process reach a pod.
//
// A DNS server on the gateway address (port 53, UDP and TCP) answers A and
// AAAA queries from a table kept with SetHost and DeleteHost; other names get
// NXDOMAIN, so resolvers go on with their next search suffix.
//
// A pod's IP is reserved for its key for the Network's lifetime, and its eth0
// MAC address is derived from the IP: a pod recreated under the same key comes
// back at the same address, and the ARP caches of its peers stay right.
//
// Goroutines enter a namespace only on an OS thread locked for the purpose,
// and return to the original namespace before unlocking it (see
// withLockedThread). Every other thread of the process stays in the root
// namespace, which is what lets plain goroutines (forwarders dialing the host)
// ignore namespaces altogether.
package podnet
