// Package linkemu emulates network distance between processes on one machine.
// The kernels here have no netem, so latency, bandwidth limits and partitions
// come from userspace TCP proxies instead.
//
// A Link is one proxy on a free 127.0.0.1 port in front of a target address.
// Each direction of every connection gets a fixed one-way delay. Each chunk of
// bytes is stamped when the proxy reads it and released at stamp + delay. The
// delay therefore does not pile up: a destination that reads slowly holds back
// only the chunks it has not yet taken, and later chunks keep their own release
// times. An optional bandwidth cap per direction spaces the chunks out, as the
// bottleneck of a real path would. Partition works like a blackhole. Open
// connections are cut. New ones are accepted but get no answer until Heal. A
// held client that is still waiting at Heal is then forwarded, with what it sent
// in the meantime, as TCP retransmission would do. A client that gave up is
// dropped. Every setting can change while traffic flows. A delay change applies
// to bytes read after it.
//
// A WAN places several "sites" (stand-ins for clusters) on one machine, with a
// one-way delay and a partition switch between each pair of sites. WAN.Front
// puts a Link in a site, in front of a member's port. A connection through a
// front crosses the pair (source site, front site). Peers in the same site
// cross nothing, so they see no delay.
//
// The source site of a connection is found from the process that opened it.
// This is why the WAN needs Linux. Every member is a child process that dials
// from 127.0.0.1, so the address tells nothing. The proxy therefore looks up
// the accepted connection's remote end (the dialer's own socket) in
// /proc/net/tcp and /proc/net/tcp6 to get its socket inode. It then looks for
// that inode as "socket:[inode]" among /proc/<pid>/fd of the processes given
// to RegisterProcess. Only registered pids are searched, so the lookup stays
// cheap. Code of this process sits in a site by dialing with WAN.Dialer(site),
// which binds to a loopback source address of that site's own; the front
// places such a connection by its address, before any /proc lookup. Any other
// connection from this process itself (in-process clients), from a process
// that is not registered, or made where /proc cannot be read, is placed in the
// WAN's local site. The lookup runs once, at accept
// time. Register a child process before it can dial (right after it starts).
//
// The TCP handshake itself is not delayed: a client's connect completes at
// once against the proxy, and the first round trip is paid by the first bytes.
package linkemu
