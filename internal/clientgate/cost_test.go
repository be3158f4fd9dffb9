package clientgate_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd/etcdtest"
)

// Each cell of BenchmarkGateCost measures its two paths in costSlices
// alternating slices of costSlice each (direct, gate, gate, direct, ...),
// so that whatever else loads the machine meanwhile hits both paths alike.
// One iteration is one whole measurement: -benchtime 1x measures as much
// as any other count.
const (
	costSlices = 4
	costSlice  = time.Second
	// costStreamsPerConn is how many concurrent callers share one client
	// connection: kube-apiserver multiplexes its many concurrent calls over
	// a few etcd client connections.
	costStreamsPerConn = 16
	// costValue is the size of a put's value, a small Kubernetes object.
	costValue = 512
	costKeys  = 64
)

// BenchmarkGateCost measures what the gate costs every call that passes it,
// against the same member's own client port, with TLS on every hop as in a
// pod: etcd serves its clients TLS, the gate serves them TLS with etcd's own
// server certificate and reaches etcd with a client certificate of its own,
// and the clients present client certificates. The member is the leader, so
// that etcd's own share of a call is the smallest and the gate's share the
// most visible. Cells: puts and linearizable gets at 1, 16 and 64
// concurrent callers, costStreamsPerConn of them per client connection. It
// prints a table and asserts nothing.
func BenchmarkGateCost(b *testing.B) {
	quiet := funcr.New(func(_, _ string) {}, funcr.Options{})
	c := etcdtest.Start(b, etcdtest.Options{Names: etcdtest.Numbered("m", 3), Logger: quiet, SidecarPollInterval: -1})
	m := leaderMember(b, c)
	serving, err := tls.LoadX509KeyPair(m.TLS.CertFile, m.TLS.KeyFile)
	if err != nil {
		b.Fatal(err)
	}
	gatePair, err := c.CA.Issue("client-gate")
	if err != nil {
		b.Fatal(err)
	}
	backendTLS, err := c.CA.ClientConfig(&gatePair)
	if err != nil {
		b.Fatal(err)
	}
	_, gateURL := serveGate(b, m, &tls.Config{Certificates: []tls.Certificate{serving}, MinVersion: tls.VersionTLS12}, backendTLS)
	// What the process spends without calls (the gate's probe, the
	// runtime), taken off every slice's CPU time so that it does not count
	// more per call on the path with fewer calls.
	idleFrom := time.Now()
	idleCPU, _ := processUse(b)
	time.Sleep(costSlice)
	idleEnd, _ := processUse(b)
	idle := float64(idleEnd-idleCPU) / float64(time.Since(idleFrom))

	value := strings.Repeat("v", costValue)
	ops := []struct {
		name string
		op   func(ctx context.Context, cli *clientv3.Client, key string) error
	}{
		{"put", func(ctx context.Context, cli *clientv3.Client, key string) error {
			_, err := cli.Put(ctx, key, value)
			return err
		}},
		{"get", func(ctx context.Context, cli *clientv3.Client, key string) error {
			_, err := cli.Get(ctx, key) // linearizable: etcd's default
			return err
		}},
	}
	var rows []costRow
	for _, o := range ops {
		for _, callers := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/clients=%d", o.name, callers), func(b *testing.B) {
				for range b.N {
					direct := costClients(b, c, m.LocalClientURL, callers)
					gated := costClients(b, c, gateURL, callers)
					var d, g costSample
					for round := range costSlices {
						paths := []struct {
							clis []*clientv3.Client
							into *costSample
						}{{direct, &d}, {gated, &g}}
						if round%2 == 1 {
							slices.Reverse(paths)
						}
						for _, p := range paths {
							p.into.add(runCost(b, p.clis, callers, o.op))
						}
					}
					row := costRow{cell: b.Name()[strings.Index(b.Name(), "/")+1:], direct: d.stats(idle), gate: g.stats(idle)}
					rows = append(rows, row)
					b.Log("\n" + costHeader + row.String())
					b.ReportMetric(row.direct.opsPerSec, "direct-ops/s")
					b.ReportMetric(row.gate.opsPerSec, "gate-ops/s")
					b.ReportMetric(row.gate.opsPerSec/row.direct.opsPerSec, "throughput-ratio")
					b.ReportMetric(ratio(row.gate.p50, row.direct.p50), "p50-ratio")
					b.ReportMetric(ratio(row.gate.p99, row.direct.p99), "p99-ratio")
					b.ReportMetric(ms(row.gate.p50-row.direct.p50), "p50-added-ms")
					b.ReportMetric(row.gateCPU(), "gate-cpu-us/op")
					b.ReportMetric(row.gate.syscalls-row.direct.syscalls, "gate-syscalls/op")
				}
			})
		}
	}
	var table strings.Builder
	table.WriteString(costHeader)
	for _, r := range rows {
		table.WriteString(r.String())
	}
	// A parent benchmark's log is not shown: the table goes to stdout.
	fmt.Printf("the client gate's cost, member %s (the leader), %d×%v per path and cell, interleaved; idle CPU %.3f:\n%s", m.Name, costSlices, costSlice, idle, table.String())
}

// leaderMember is the member that leads c.
func leaderMember(b *testing.B, c *etcdtest.Cluster) *localetcd.Member {
	b.Helper()
	cli, err := c.Members[0].Client()
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, c.Members[0].LocalClientURL)
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range c.Members {
		if memberID(b, cli, m.Name) == st.Leader {
			return m
		}
	}
	b.Fatalf("no member leads (leader ID %x)", st.Leader)
	return nil
}

// costClients opens one client connection to url per costStreamsPerConn
// callers, with the cluster's client certificate, each connected before it
// is returned; they close when b ends.
func costClients(b *testing.B, c *etcdtest.Cluster, url string, callers int) []*clientv3.Client {
	b.Helper()
	var clis []*clientv3.Client
	for range (callers + costStreamsPerConn - 1) / costStreamsPerConn {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, TLS: c.ClientTLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cli.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = cli.Get(ctx, "/gatecost/warm")
		cancel()
		if err != nil {
			b.Fatalf("%s: %v", url, err)
		}
		clis = append(clis, cli)
	}
	return clis
}

// runCost runs op from callers goroutines over clis for one costSlice and
// returns every call's latency. A failed call fails the benchmark: its
// figures would not be the gate's cost.
func runCost(b *testing.B, clis []*clientv3.Client, callers int, op func(context.Context, *clientv3.Client, string) error) costSample {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), costSlice)
	defer cancel()
	lat := make([][]time.Duration, callers)
	errs := make([]error, callers)
	start := time.Now()
	cpu, sys := processUse(b)
	busy, all := machineCPU(b)
	var wg sync.WaitGroup
	for i := range callers {
		cli, key := clis[i%len(clis)], fmt.Sprintf("/gatecost/%d", i%costKeys)
		wg.Go(func() {
			for ctx.Err() == nil {
				callCtx, callCancel := context.WithTimeout(context.Background(), 10*time.Second)
				t0 := time.Now()
				err := op(callCtx, cli, key)
				took := time.Since(t0)
				callCancel()
				if err != nil {
					errs[i] = err
					return
				}
				lat[i] = append(lat[i], took)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	cpuEnd, sysEnd := processUse(b)
	busyEnd, allEnd := machineCPU(b)
	return costSample{lat: slices.Concat(lat...), took: time.Since(start), cpu: cpuEnd - cpu, syscalls: sysEnd - sys,
		machineBusy: busyEnd - busy, machineAll: allEnd - all}
}

// processUse is the CPU time this process (the clients, and the gate when
// it serves them) has used so far, and the read and write system calls it
// made: unlike a call's latency neither depends on what else runs on the
// machine.
func processUse(b *testing.B) (cpu time.Duration, syscalls int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	io, err := os.ReadFile("/proc/self/io")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(io)) {
		var n int64
		if _, err := fmt.Sscanf(line, "syscr: %d", &n); err == nil {
			syscalls += n
		} else if _, err := fmt.Sscanf(line, "syscw: %d", &n); err == nil {
			syscalls += n
		}
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), syscalls
}

// machineCPU is the machine's CPU time so far, busy and in all, in clock
// ticks (/proc/stat): whether the machine had CPU left, etcd's members
// included.
func machineCPU(b *testing.B) (busy, all int64) {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(stat), "\n")
	// user nice system idle iowait irq softirq steal; guest time is in user.
	fields := strings.Fields(line)
	if len(fields) < 9 {
		b.Fatalf("/proc/stat: %q", line)
	}
	for i, f := range fields[1:9] {
		var n int64
		if _, err := fmt.Sscan(f, &n); err != nil {
			b.Fatalf("/proc/stat: %q: %v", line, err)
		}
		all += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, all
}

// costSample is the calls of one path: their latencies, the time spent,
// and the CPU time and system calls of the process meanwhile.
type costSample struct {
	lat       []time.Duration
	took, cpu time.Duration
	syscalls  int64
	// machineBusy of machineAll is the machine's CPU use.
	machineBusy, machineAll int64
}

func (s *costSample) add(o costSample) {
	s.lat = append(s.lat, o.lat...)
	s.took += o.took
	s.cpu += o.cpu
	s.syscalls += o.syscalls
	s.machineBusy += o.machineBusy
	s.machineAll += o.machineAll
}

type costStats struct {
	opsPerSec     float64
	p50, p99, cpu time.Duration // cpu per call
	syscalls      float64       // per call
	busy          float64       // the machine's CPU use, 0..1
}

// stats sums s up; idle is the share of a CPU the process uses without
// calls.
func (s costSample) stats(idle float64) costStats {
	slices.Sort(s.lat)
	at := func(q float64) time.Duration { return s.lat[int(q*float64(len(s.lat)-1))] }
	n := len(s.lat)
	return costStats{
		opsPerSec: float64(n) / s.took.Seconds(),
		p50:       at(0.50),
		p99:       at(0.99),
		cpu:       (s.cpu - time.Duration(idle*float64(s.took))) / time.Duration(n),
		syscalls:  float64(s.syscalls) / float64(n),
		busy:      float64(s.machineBusy) / float64(s.machineAll),
	}
}

// costRow is one cell of the printed table.
type costRow struct {
	cell         string
	direct, gate costStats
}

const costHeader = "| cell | ops/s direct | ops/s gate | ratio | p50 direct | p50 gate | ratio | p99 direct | p99 gate | ratio | p50 added | gate CPU per call | gate syscalls per call | machine busy direct, gate |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"

func (r costRow) String() string {
	return fmt.Sprintf("| %s | %.0f | %.0f | %.2f | %.2f ms | %.2f ms | %.2f | %.2f ms | %.2f ms | %.2f | %+.2f ms | %.0f µs | %.1f | %.0f%%, %.0f%% |\n", r.cell,
		r.direct.opsPerSec, r.gate.opsPerSec, r.gate.opsPerSec/r.direct.opsPerSec,
		ms(r.direct.p50), ms(r.gate.p50), ratio(r.gate.p50, r.direct.p50),
		ms(r.direct.p99), ms(r.gate.p99), ratio(r.gate.p99, r.direct.p99),
		ms(r.gate.p50-r.direct.p50), r.gateCPU(), r.gate.syscalls-r.direct.syscalls, 100*r.direct.busy, 100*r.gate.busy)
}

// gateCPU is what the gate costs a call in CPU time, in µs: the process's
// CPU time per call through the gate less that per direct call.
func (r costRow) gateCPU() float64 {
	return float64(r.gate.cpu-r.direct.cpu) / float64(time.Microsecond)
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
