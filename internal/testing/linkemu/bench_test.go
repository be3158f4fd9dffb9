package linkemu

import (
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkAddedLatency measures how far the one-way delay through a Link
// at 90 ms strays from 90 ms (target: within 5 ms), with conns connections
// doing round trips at once and, in the "+bulk" case, a bulk transfer through
// another Link in the same process. One iteration is 10 round trips per
// connection, so -benchtime 1x already gives figures. Errors are measured −
// 90 ms per one-way trip. The "direct" case runs the same load without a Link
// (errors measured − 0): the machine's own loopback and scheduling noise,
// which the other figures include.
func BenchmarkAddedLatency(b *testing.B) {
	const msg = 1 << 10
	const tripsPerIter = 10
	for _, tc := range []struct {
		conns  int
		bulk   bool
		direct bool
	}{{1, false, false}, {64, false, false}, {64, true, false}, {64, true, true}} {
		delay := 90 * time.Millisecond
		name := fmt.Sprintf("conns=%d", tc.conns)
		if tc.bulk {
			name += "+bulk"
		}
		if tc.direct {
			name += "/direct"
			delay = 0
		}
		b.Run(name, func(b *testing.B) {
			srv := startStamp(b, msg)
			addr := srv.addr()
			if !tc.direct {
				l, err := Listen(srv.addr(), Options{Delay: delay})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = l.Close() })
				addr = l.Addr()
			}
			conns := make([]net.Conn, tc.conns)
			for i := range conns {
				var err error
				if conns[i], err = net.Dial("tcp", addr); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = conns[i].Close() })
				// Warm up: the first bytes also wait for the proxy to dial the target.
				if _, _, err := stampRoundTrip(conns[i], msg); err != nil {
					b.Fatal(err)
				}
			}
			if tc.bulk {
				startBulk(b)
			}

			var mu sync.Mutex
			var errs []time.Duration
			b.ResetTimer()
			for range b.N {
				var wg sync.WaitGroup
				for i, c := range conns {
					wg.Go(func() {
						// Spread the connections over a 90 ms round trip: a
						// steady stream of messages rather than 64 in lockstep.
						time.Sleep(time.Duration(i) * 180 * time.Millisecond / time.Duration(len(conns)))
						local := make([]time.Duration, 0, 2*tripsPerIter)
						for range tripsPerIter {
							up, down, err := stampRoundTrip(c, msg)
							if err != nil {
								b.Error(err)
								return
							}
							local = append(local, up-delay, down-delay)
						}
						mu.Lock()
						errs = append(errs, local...)
						mu.Unlock()
					})
				}
				wg.Wait()
			}
			b.StopTimer()
			reportErrors(b, errs)
		})
	}
}

// BenchmarkSleepLateness is the floor for BenchmarkAddedLatency on this
// machine at this moment: how late 64 goroutines waking from a 90 ms sleep
// are, under the same bulk load. A Link releases each chunk from such a
// wake-up, so on a machine whose other processes keep the cores busy, its
// error cannot be lower than this.
func BenchmarkSleepLateness(b *testing.B) {
	const sleep = 90 * time.Millisecond
	const sleepsPerIter = 20
	startBulk(b)
	var mu sync.Mutex
	var errs []time.Duration
	b.ResetTimer()
	for range b.N {
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() {
				local := make([]time.Duration, 0, sleepsPerIter)
				for range sleepsPerIter {
					start := time.Now()
					time.Sleep(sleep)
					local = append(local, time.Since(start)-sleep)
				}
				mu.Lock()
				errs = append(errs, local...)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	b.StopTimer()
	reportErrors(b, errs)
}

// startBulk keeps about 20 MB/s flowing through a 90 ms Link to a sink until the
// benchmark ends: load that competes with the measured Link for CPU.
func startBulk(b *testing.B) {
	sink := startServer(b, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	l, err := Listen(sink.addr(), Options{Delay: 90 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		block := make([]byte, 64<<10)
		tick := time.NewTicker(3 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if _, err := c.Write(block); err != nil {
					return
				}
			}
		}
	})
	b.Cleanup(func() { close(done); _ = c.Close(); wg.Wait() })
}

func reportErrors(b *testing.B, errs []time.Duration) {
	if len(errs) == 0 {
		return
	}
	slices.Sort(errs)
	var sum time.Duration
	for _, e := range errs {
		sum += e
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(sum/time.Duration(len(errs))), "err-mean-ms")
	b.ReportMetric(ms(errs[len(errs)*99/100]), "err-p99-ms")
	b.ReportMetric(ms(errs[len(errs)-1]), "err-max-ms")
	b.ReportMetric(ms(errs[0]), "err-min-ms")
	b.ReportMetric(0, "ns/op") // an iteration is a fixed batch of round trips; its time says nothing
}

// BenchmarkThroughput pushes 64 MiB per iteration one way over one
// connection and reports the rate at which the sink received it (MB/s),
// so the one-off delay of the first byte does not count. "direct" is
// loopback without a Link, for comparison.
func BenchmarkThroughput(b *testing.B) {
	const perIter = 64 << 20
	for _, tc := range []struct {
		name  string
		delay time.Duration
		link  bool
	}{{"direct", 0, false}, {"delay=0", 0, true}, {"delay=90ms", 90 * time.Millisecond, true}} {
		b.Run(tc.name, func(b *testing.B) {
			// The sink times each iteration from its first to its last byte.
			spans := make(chan time.Duration, 1)
			sink := startServer(b, func(c net.Conn) {
				buf := make([]byte, 256<<10)
				var got int
				var first time.Time
				for {
					n, err := c.Read(buf)
					if n > 0 && got == 0 {
						first = time.Now()
					}
					got += n
					if got >= perIter {
						spans <- time.Since(first)
						got -= perIter
						first = time.Now()
					}
					if err != nil {
						return
					}
				}
			})
			addr := sink.addr()
			if tc.link {
				l, err := Listen(addr, Options{Delay: tc.delay})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = l.Close() })
				addr = l.Addr()
			}
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = c.Close() })
			block := make([]byte, perIter)
			var total time.Duration
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(block); err != nil {
					b.Fatal(err)
				}
				total += <-spans
			}
			b.StopTimer()
			b.ReportMetric(float64(perIter)*float64(b.N)/total.Seconds()/1e6, "MB/s")
		})
	}
}
