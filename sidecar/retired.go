package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Retirement records say that a controller removed a member for good. They
// live in the etcd cluster itself, the one thing two controllers of a live
// move share, so that a member one controller retired is never added again
// by the other. A record has no lease: it outlives every controller, and only
// its writer deletes it again (when its policy stops retiring the member).
//
//	PUT    /v1/retired/{name}  {"by": holder}   record a retirement
//	DELETE /v1/retired/{name}                   drop the record
//
// GET /v1/members lists the records as "retired": [{"name","by"}].

// retiredPrefix holds one key per retired member name; the value is the
// holder that retired it.
const retiredPrefix = keyPrefix + "retired/"

// ReasonRetiredByOther: the retirement record of that member was written by
// another holder; only its writer may replace or delete it.
const ReasonRetiredByOther = "RetiredByOther"

// RetiredMember is one retirement record: the member Name was removed for
// good by the lock holder By.
type RetiredMember struct {
	Name string `json:"name"`
	By   string `json:"by"`
}

// RetireRequest is the body of PUT /v1/retired/{name}.
type RetireRequest struct {
	By string `json:"by"`
}

// RetireResult answers a successful PUT or DELETE /v1/retired/{name}.
// Changed is false when the record was already as asked.
type RetireResult struct {
	Retired RetiredMember `json:"retired"`
	Changed bool          `json:"changed"`
}

// retire answers PUT /v1/retired/{name}.
func (s *Server) retire(r *http.Request) (int, any, *Error) {
	name := r.PathValue("name")
	if e := validateName("member name", name); e != nil {
		return 0, nil, e
	}
	var req RetireRequest
	if e := decodeJSON(r, &req); e != nil {
		return 0, nil, e
	}
	if e := validateName("by", req.By); e != nil {
		return 0, nil, e
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	if e := s.checkLockNow(ctx, r); e != nil {
		return 0, nil, e
	}
	key := retiredPrefix + name
	want := RetiredMember{Name: name, By: req.By}
	kv, err := s.readKey(ctx, key)
	if err != nil {
		return 0, nil, etcdError("reading the retirement record", err)
	}
	if kv != nil {
		if by := string(kv.Value); by != req.By {
			return 0, nil, retiredByOther(name, by, "retire it again")
		}
		return http.StatusOK, RetireResult{Retired: want}, nil
	}
	// Created only if absent, so two writers never overwrite each other.
	var txn *clientv3.TxnResponse
	err = s.withCluster(ctx, func(c *clientv3.Client) (err error) {
		txn, err = c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, req.By)).Else(clientv3.OpGet(key)).Commit()
		return err
	})
	if err != nil {
		return 0, nil, etcdError("writing the retirement record", err)
	}
	if !txn.Succeeded {
		if by := firstValue(txn); by != req.By {
			return 0, nil, retiredByOther(name, by, "retire it again")
		}
		return http.StatusOK, RetireResult{Retired: want}, nil
	}
	return http.StatusCreated, RetireResult{Retired: want, Changed: true}, nil
}

// unretire answers DELETE /v1/retired/{name}. A caller that names itself
// in X-Druid-Stretch-Lock-Holder deletes only its own record; without the
// header (an operator with curl) any record is deleted.
func (s *Server) unretire(r *http.Request) (int, any, *Error) {
	name := r.PathValue("name")
	if e := validateName("member name", name); e != nil {
		return 0, nil, e
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	if e := s.checkLockNow(ctx, r); e != nil {
		return 0, nil, e
	}
	key := retiredPrefix + name
	kv, err := s.readKey(ctx, key)
	if err != nil {
		return 0, nil, etcdError("reading the retirement record", err)
	}
	if kv == nil {
		return http.StatusOK, RetireResult{Retired: RetiredMember{Name: name}}, nil
	}
	by := string(kv.Value)
	if holder := r.Header.Get(HeaderLockHolder); holder != "" && holder != by {
		return 0, nil, retiredByOther(name, by, "delete the record")
	}
	var txn *clientv3.TxnResponse
	err = s.withCluster(ctx, func(c *clientv3.Client) (err error) {
		txn, err = c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(key)).Commit()
		return err
	})
	if err != nil {
		return 0, nil, etcdError("deleting the retirement record", err)
	}
	if !txn.Succeeded {
		return 0, nil, &Error{StatusCode: http.StatusConflict, Reason: ReasonMembershipChanged,
			Message: fmt.Sprintf("the retirement record of %q changed while it was being deleted; read it again", name)}
	}
	return http.StatusOK, RetireResult{Retired: RetiredMember{Name: name, By: by}, Changed: true}, nil
}

// retiredMembers reads every retirement record, sorted by name.
func (s *Server) retiredMembers(ctx context.Context) ([]RetiredMember, error) {
	var resp *clientv3.GetResponse
	err := s.readCluster(ctx, func(c *clientv3.Client) (err error) {
		resp, err = c.Get(ctx, retiredPrefix, clientv3.WithPrefix())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reading the retirement records: %w", err)
	}
	return retiredRecords(resp.Kvs), nil
}

// retiredRecords reads the retirement records' keys, sorted by name; never
// nil.
func retiredRecords(kvs []*mvccpb.KeyValue) []RetiredMember {
	out := make([]RetiredMember, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, RetiredMember{Name: strings.TrimPrefix(string(kv.Key), retiredPrefix), By: string(kv.Value)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// checkLockNow is checkLock on a fresh read of the lock key: a record
// change needs no member list.
func (s *Server) checkLockNow(ctx context.Context, r *http.Request) *Error {
	if r.Header.Get(HeaderLockHolder) == "" {
		return nil
	}
	kv, err := s.readLock(ctx)
	if err != nil {
		return etcdError("reading the membership lock", err)
	}
	return s.checkLock(ctx, r, &view{lock: kv})
}

func (s *Server) readKey(ctx context.Context, key string) (*mvccpb.KeyValue, error) {
	var resp *clientv3.GetResponse
	err := s.withCluster(ctx, func(c *clientv3.Client) (err error) {
		resp, err = c.Get(ctx, key)
		return err
	})
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	return resp.Kvs[0], nil
}

func firstValue(txn *clientv3.TxnResponse) string {
	for _, r := range txn.Responses {
		if rr := r.GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
			return string(rr.Kvs[0].Value)
		}
	}
	return ""
}

func retiredByOther(name, by, doing string) *Error {
	return &Error{StatusCode: http.StatusConflict, Reason: ReasonRetiredByOther,
		Message: fmt.Sprintf("member %q was retired by %q; only %q may %s", name, by, by, doing)}
}

// Retire records that holder retired the member name: no controller that
// honours the records adds that name again. o.LockHolder, when set, must
// hold the membership lock. A record by another holder gives *Error
// RetiredByOther.
func (c *Client) Retire(ctx context.Context, name, holder string, o CallOptions) (*RetireResult, error) {
	var out RetireResult
	err := c.do(ctx, http.MethodPut, "/v1/retired/"+url.PathEscape(name), RetireRequest{By: holder}, CallOptions{LockHolder: o.LockHolder, LockToken: o.LockToken}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Unretire deletes the retirement record of name. With o.LockHolder set,
// only that holder's own record is deleted (another's gives *Error
// RetiredByOther) and the holder must hold the membership lock.
func (c *Client) Unretire(ctx context.Context, name string, o CallOptions) (*RetireResult, error) {
	var out RetireResult
	if err := c.do(ctx, http.MethodDelete, "/v1/retired/"+url.PathEscape(name), nil, CallOptions{LockHolder: o.LockHolder, LockToken: o.LockToken}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
