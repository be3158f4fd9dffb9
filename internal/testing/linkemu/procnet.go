package linkemu

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// dialerPid returns which of pids holds the dialing end of c, an accepted
// loopback connection (Linux only: see the package doc). ok is false when no
// candidate holds it, including when c came from this process or /proc is
// unreadable.
func dialerPid(c net.Conn, pids []int) (pid int, ok bool) {
	// From the accepted side, the dialer's socket is the row whose local
	// address is our remote one and whose remote address is our local one.
	dialer, okR := c.RemoteAddr().(*net.TCPAddr)
	proxy, okL := c.LocalAddr().(*net.TCPAddr)
	if !okR || !okL || len(pids) == 0 {
		return 0, false
	}
	inode, found := socketInode(dialer, proxy)
	if !found {
		return 0, false
	}
	want := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	for _, pid := range pids {
		if holdsFd(pid, want) {
			return pid, true
		}
	}
	return 0, false
}

// socketInode finds the inode of the TCP socket bound to local and connected
// to remote. An IPv4 socket is listed in /proc/net/tcp; a dual-stack one in
// /proc/net/tcp6 under v4-mapped addresses.
func socketInode(local, remote *net.TCPAddr) (uint64, bool) {
	for _, table := range []struct {
		path string
		v6   bool
	}{{"/proc/net/tcp", false}, {"/proc/net/tcp6", true}} {
		l, okL := procNetAddr(local, table.v6)
		r, okR := procNetAddr(remote, table.v6)
		if !okL || !okR {
			continue
		}
		if inode, ok := scanProcNet(table.path, l, r); ok {
			return inode, true
		}
	}
	return 0, false
}

func scanProcNet(path, local, remote string) (uint64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	// Row: sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[1] != local || fields[2] != remote {
			continue
		}
		inode, err := strconv.ParseUint(fields[9], 10, 64)
		if err != nil || inode == 0 { // 0: a socket no process holds any more
			continue
		}
		return inode, true
	}
	return 0, false
}

// procNetAddr writes an address the way the kernel prints it in
// /proc/net/tcp{,6}: each 32-bit word of the address in host byte order as
// %08X, then the port as %04X.
func procNetAddr(a *net.TCPAddr, v6 bool) (string, bool) {
	ip := a.IP.To4()
	if v6 {
		ip = a.IP.To16()
	}
	if ip == nil {
		return "", false
	}
	var sb strings.Builder
	for i := 0; i < len(ip); i += 4 {
		fmt.Fprintf(&sb, "%08X", binary.NativeEndian.Uint32(ip[i:i+4]))
	}
	fmt.Fprintf(&sb, ":%04X", a.Port)
	return sb.String(), true
}

func holdsFd(pid int, link string) bool {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false // gone, or not ours to read
	}
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && target == link {
			return true
		}
	}
	return false
}
