package linkemu

import (
	"net"
	"sort"
	"sync"
	"testing"
	"time"
)

func TestZZDebugLatency(t *testing.T) {
	const delay = 90 * time.Millisecond
	srv := startStamp(t, 1024)
	l, _ := Listen(srv.addr(), Options{Delay: delay})
	defer l.Close()
	type s struct{ at, err time.Duration; dir string }
	var mu sync.Mutex
	var all []s
	var wg sync.WaitGroup
	for i := range 64 {
		c, _ := net.Dial("tcp", l.Addr())
		defer c.Close()
		stampRoundTrip(c, 1024)
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 180 * time.Millisecond / 64)
			for range 20 {
				st := sinceEpoch()
				up, down, err := stampRoundTrip(c, 1024)
				if err != nil { t.Error(err); return }
				mu.Lock()
				all = append(all, s{st, up - delay, "up"}, s{st + up, down - delay, "down"})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sort.Slice(all, func(i, j int) bool { return all[i].at < all[j].at })
	for _, x := range all {
		if x.err > 5*time.Millisecond {
			t.Logf("at %v %s err %v", x.at.Round(time.Millisecond), x.dir, x.err.Round(100*time.Microsecond))
		}
	}
}
