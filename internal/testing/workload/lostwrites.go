package workload

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// LostWrites is the outcome of reading back every acknowledged write.
type LostWrites struct {
	// Checked is the number of acknowledged writes read back.
	Checked int
	// Lost are acknowledged writes that the store does not hold at the
	// revision etcd acknowledged them with (a different value, no value, or
	// a revision the store has not reached: a rollback).
	Lost []LostWrite
	// Unverifiable counts acknowledged writes whose revision was compacted
	// away, so they could not be read back; a run should not compact.
	Unverifiable int
	// FinalMismatches are keys whose current value is not the last
	// acknowledged write (nor a later ambiguous write that was applied).
	FinalMismatches []FinalMismatch
}

// LostWrite is one acknowledged write that the store does not hold.
type LostWrite struct {
	Write Op
	// Found is what the store holds for the key at Write.Rev.
	Found KeyValue
	// Reason says how the write is missing.
	Reason string
}

// FinalMismatch is a key whose final value contradicts the acknowledged writes.
type FinalMismatch struct {
	Key string
	// LastAcknowledged is the acknowledged write with the highest revision
	// (the initial state when there was none).
	LastAcknowledged KeyValue
	Found            KeyValue
}

const verifyParallelism = 8

// CheckLostWrites reads every acknowledged write of h back at the revision
// it was acknowledged with (Get WithRev, batched in read-only transactions)
// and checks it holds the value
// written, then reads every key once more and checks the final value is the
// last acknowledged write. kv should reach a healthy cluster; transient
// errors are retried like workload requests, and an error is returned only
// when a read could not be made at all.
func CheckLostWrites(ctx context.Context, kv clientv3.KV, h *History) (LostWrites, error) {
	o := Options{AttemptTimeout: DefaultAttemptTimeout, RequestDeadline: DefaultRequestDeadline}
	ops := h.Ops()
	var acked []Op
	for _, op := range ops {
		if op.Acknowledged() {
			acked = append(acked, op)
		}
	}

	var (
		mu     sync.Mutex
		result LostWrites
		errs   []error
		wg     sync.WaitGroup
		work   = make(chan []Op)
	)
	for range verifyParallelism {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range work {
				checks := readBackBatch(ctx, kv, batch, o)
				mu.Lock()
				for _, c := range checks {
					switch {
					case errors.Is(c.err, rpctypes.ErrCompacted):
						result.Unverifiable++
					case c.err != nil:
						errs = append(errs, fmt.Errorf("reading back %s: %w", c.op, c.err))
					default:
						result.Checked++
						if c.reason != "" {
							result.Lost = append(result.Lost, LostWrite{Write: c.op, Found: c.found, Reason: c.reason})
						}
					}
				}
				mu.Unlock()
			}
		}()
	}
	for from := 0; from < len(acked) && ctx.Err() == nil; from += readBackBatchSize {
		work <- acked[from:min(from+readBackBatchSize, len(acked))]
	}
	close(work)
	wg.Wait()
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return result, fmt.Errorf("checking acknowledged writes: %w", err)
	}
	slices.SortFunc(result.Lost, func(a, b LostWrite) int { return compareDuration(a.Write.Call, b.Write.Call) })

	final, err := finalCheck(ctx, kv, h, ops, o)
	if err != nil {
		return result, err
	}
	result.FinalMismatches = final
	return result, nil
}

type readBackCheck struct {
	op     Op
	found  KeyValue
	reason string
	err    error
}

// readBackBatchSize Gets go in one read-only transaction (each Get with its
// own revision), well below etcd's 128 operations per transaction; this
// saves a round trip per acknowledged write.
const readBackBatchSize = 64

// readBackBatch reads the writes of batch back in one transaction. When one
// revision is compacted or not reached, the whole transaction is refused,
// so the batch is read back write by write to tell which.
func readBackBatch(ctx context.Context, kv clientv3.KV, batch []Op, o Options) []readBackCheck {
	gets := make([]clientv3.Op, len(batch))
	for i, op := range batch {
		gets[i] = clientv3.OpGet(op.Key, clientv3.WithRev(op.Rev))
	}
	var resp *clientv3.TxnResponse
	err := retry(ctx, o, func(actx context.Context) error {
		var err error
		resp, err = kv.Txn(actx).Then(gets...).Commit()
		return err
	})
	checks := make([]readBackCheck, len(batch))
	for i, op := range batch {
		checks[i].op = op
		switch {
		case err == nil:
			checks[i].found, checks[i].reason = judge(op, resp.Responses[i].GetResponseRange().Kvs)
		case errors.Is(err, rpctypes.ErrCompacted) || errors.Is(err, rpctypes.ErrFutureRev):
			checks[i].found, checks[i].reason, checks[i].err = readBack(ctx, kv, op, o)
		default:
			checks[i].err = err
		}
	}
	return checks
}

// readBack returns what the store holds for op.Key at op.Rev and, when that
// is not op's value, why.
func readBack(ctx context.Context, kv clientv3.KV, op Op, o Options) (KeyValue, string, error) {
	var resp *clientv3.GetResponse
	err := retry(ctx, o, func(actx context.Context) error {
		var err error
		resp, err = kv.Get(actx, op.Key, clientv3.WithRev(op.Rev))
		return err
	})
	switch {
	case errors.Is(err, rpctypes.ErrFutureRev):
		return KeyValue{}, fmt.Sprintf("the store has not reached revision %d", op.Rev), nil
	case err != nil:
		return KeyValue{}, "", err
	}
	found, reason := judge(op, resp.Kvs)
	return found, reason, nil
}

// judge compares what the store holds at op.Rev with what op wrote.
func judge(op Op, kvs []*mvccpb.KeyValue) (KeyValue, string) {
	found := firstKeyValue(kvs)
	switch {
	case len(kvs) == 0:
		return found, fmt.Sprintf("key absent at revision %d", op.Rev)
	case found.Rev != op.Rev || found.Value != op.Value:
		return found, fmt.Sprintf("revision %d holds %q written at %d", op.Rev, short(found.Value), found.Rev)
	}
	return found, ""
}

// finalCheck compares each key's current value with its last acknowledged
// write. A later value is fine only when it is an ambiguous write of ours
// that was applied after all.
func finalCheck(ctx context.Context, kv clientv3.KV, h *History, ops []Op, o Options) ([]FinalMismatch, error) {
	last := map[string]KeyValue{}
	ambiguous := map[string]map[string]bool{}
	keys := map[string]bool{}
	for _, op := range ops {
		if op.Kind != Write {
			continue
		}
		keys[op.Key] = true
		switch {
		case op.Acknowledged():
			if op.Rev > last[op.Key].Rev {
				last[op.Key] = KeyValue{Value: op.Value, Rev: op.Rev}
			}
		case op.Outcome == Failed:
			if ambiguous[op.Key] == nil {
				ambiguous[op.Key] = map[string]bool{}
			}
			ambiguous[op.Key][op.Value] = true
		}
	}
	var mismatches []FinalMismatch
	for key := range keys {
		want, ok := last[key]
		if !ok {
			want = h.Initial(key)
		}
		var resp *clientv3.GetResponse
		err := retry(ctx, o, func(actx context.Context) error {
			var err error
			resp, err = kv.Get(actx, key)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("final read of %s: %w", key, err)
		}
		got := firstKeyValue(resp.Kvs)
		laterAmbiguous := got.Rev > want.Rev && ambiguous[key][got.Value]
		if got != want && !laterAmbiguous {
			mismatches = append(mismatches, FinalMismatch{Key: key, LastAcknowledged: want, Found: got})
		}
	}
	return mismatches, nil
}

// retry runs f like a workload request: short attempts, transient errors
// retried until the request deadline or ctx ends.
func retry(ctx context.Context, o Options, f func(context.Context) error) error {
	r := newRetrier(o)
	for {
		err, again := r.attempt(func(actx context.Context) error {
			actx, cancel := context.WithCancel(actx)
			defer cancel()
			defer context.AfterFunc(ctx, cancel)()
			return f(actx)
		})
		if err == nil || !again {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
