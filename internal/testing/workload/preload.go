package workload

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Preload batches stay below etcd's default limits: 128 operations per
// transaction and 1.5 MiB per request.
const (
	preloadOpsPerTxn   = 128
	preloadBytesPerTxn = 1 << 20
	preloadParallelism = 4
)

// PreloadFigures describe the data written before the run.
type PreloadFigures struct {
	Keys, ValueSize int
	Duration        time.Duration
}

// Preload writes Options.PreloadKeys keys of Options.PreloadValueSize bytes
// under Prefix+"preload/" (overwriting earlier ones), so that a joining
// member has a realistic amount of data to catch up on. Puts are idempotent,
// so failed batches are retried like any request.
func (w *Workload) Preload(ctx context.Context) (PreloadFigures, error) {
	n, size := w.opts.PreloadKeys, w.opts.PreloadValueSize
	start := time.Now()
	if n == 0 {
		return PreloadFigures{}, nil
	}
	value := strings.Repeat("p", size)
	perTxn := max(1, min(preloadOpsPerTxn, preloadBytesPerTxn/(size+64)))

	batches := make(chan [2]int)
	errs := make(chan error, preloadParallelism)
	var wg sync.WaitGroup
	for range preloadParallelism {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				if err := w.putBatch(ctx, b[0], b[1], value); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for from := 0; from < n; from += perTxn {
		select {
		case batches <- [2]int{from, min(from+perTxn, n)}:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(batches)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	if err != nil {
		return PreloadFigures{}, fmt.Errorf("preloading %d keys of %d bytes: %w", n, size, err)
	}
	f := PreloadFigures{Keys: n, ValueSize: size, Duration: time.Since(start)}
	w.mu.Lock()
	w.preload = f
	w.mu.Unlock()
	w.log.Info("preloaded keys", "keys", n, "valueSize", size, "duration", f.Duration)
	return f, nil
}

func (w *Workload) putBatch(ctx context.Context, from, to int, value string) error {
	ops := make([]clientv3.Op, 0, to-from)
	for i := from; i < to; i++ {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("%spreload/%08d", w.opts.Prefix, i), value))
	}
	err := retry(ctx, w.opts, func(actx context.Context) error {
		_, err := w.client.Txn(actx).Then(ops...).Commit()
		return err
	})
	if err != nil {
		return fmt.Errorf("keys %d-%d: %w", from, to-1, err)
	}
	return nil
}
