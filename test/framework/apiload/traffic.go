package apiload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/druid-stretch/druid-stretch/internal/testing/workload"
)

// Request is one API request as its client saw it.
type Request struct {
	// Server is the kube-apiserver that served the request.
	Server string
	// Origin names the server whose clients sent the request when that is
	// not Server: after a Switch, the server they were moved away from.
	Origin string
	Kind   workload.Kind
	// Object is the ConfigMap's namespace/name.
	Object string
	// Call and Return are offsets on the load's clock.
	Call, Return time.Duration
	// Code is the HTTP status, 0 when no HTTP answer came (transport error
	// or client-side timeout).
	Code int
	// Outcome: Succeeded (a write acknowledged, or a read answered, 404
	// included), Conflict (409 on a write: its compare failed), or Failed.
	Outcome workload.Outcome
	// Class is set for a failed request only.
	Class FailureClass
	// Err is the error text of a failed or conflicting request.
	Err   string
	Phase string
}

// Latency is the time from call to answer.
func (r Request) Latency() time.Duration { return r.Return - r.Call }

// Failed reports whether the request got no usable answer.
func (r Request) Failed() bool { return r.Outcome == workload.Failed }

// Acknowledged reports whether the request is a write the server applied.
func (r Request) Acknowledged() bool {
	return r.Kind == workload.Write && r.Outcome == workload.Succeeded
}

// runWriter updates random objects of its server. A server's writers share
// a cache of the objects' state, as a controller's workers share an
// informer cache: a stale entry costs a conflict, and the read that follows
// the conflict refreshes it.
func (l *Load) runWriter(s *server, client int) {
	defer l.done.Done()
	if !l.awaitReady(s) {
		return
	}
	rng := rand.New(rand.NewPCG(uint64(client), uint64(l.start.UnixNano())))
	for seq := 0; ; seq++ {
		obj := s.objects[rng.IntN(len(s.objects))]
		l.write(s, client, obj, s.cache.get(obj.key), fmt.Sprintf("%s-w%d-%d-%s", s.name, client, seq, l.tag))
		if !l.pause(l.opts.Interval) {
			return
		}
	}
}

// runReader reads random objects of every server.
func (l *Load) runReader(s *server, client int) {
	defer l.done.Done()
	if !l.awaitReady(s) {
		return
	}
	rng := rand.New(rand.NewPCG(uint64(client), uint64(l.start.UnixNano())))
	for {
		obj := l.objects[rng.IntN(len(l.objects))]
		req, kv := l.routedGet(s, obj)
		op := readOp(client, obj, req, kv)
		l.record(req, &op)
		if !l.pause(l.opts.Interval) {
			return
		}
	}
}

// write is one Update with metadata.resourceVersion set, through the
// server s's clients reach now, recorded; on a conflict it reads the
// object, as a client does before trying again, and the read's answer is
// what the compare saw (revisions only grow, so the object still differs
// from expected when the read is served).
func (l *Load) write(s *server, client int, obj object, expected workload.KeyValue, value string) {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: obj.name, Namespace: l.opts.Namespace, ResourceVersion: strconv.FormatInt(expected.Rev, 10)},
		Data:       map[string]string{valueKey: value},
	}
	via := l.acquire(s)
	req := Request{Server: via.name, Origin: origin(s, via), Kind: workload.Write, Object: obj.key, Call: l.now(), Phase: l.currentPhase()}
	op := workload.Op{
		Client: client, Kind: workload.Write, Key: obj.key, Call: req.Call, Phase: req.Phase,
		ExpectedValue: expected.Value, ExpectedRev: expected.Rev, Value: value, Attempts: 1,
	}
	// The request is not tied to Stop: a write cut off by us would be
	// ambiguous for no reason of the move. RequestTimeout bounds it.
	updated, err := via.clients.CoreV1().ConfigMaps(l.opts.Namespace).Update(context.Background(), cm, metav1.UpdateOptions{})
	req.Return = l.now()
	l.release(via)
	op.Return = req.Return
	switch {
	case err == nil:
		kv, kerr := keyValue(updated)
		if kerr != nil {
			req.Outcome, req.Code, req.Class, req.Err = workload.Failed, http.StatusOK, Other, kerr.Error()
			op.Outcome, op.Err = workload.Failed, req.Err
			break
		}
		req.Outcome, req.Code = workload.Succeeded, http.StatusOK
		op.Outcome, op.Rev = workload.Succeeded, kv.Rev
		s.cache.observe(obj.key, workload.KeyValue{Value: value, Rev: kv.Rev})
	case apierrors.IsConflict(err):
		req.Outcome, req.Code, req.Err = workload.Conflict, http.StatusConflict, err.Error()
		l.record(req, nil)
		seenReq, seen := l.routedGet(s, obj)
		op.Return = seenReq.Return
		if seenReq.Failed() {
			// The write was not applied, but what the compare saw is
			// unknown; as an ambiguous write the model allows both.
			op.Outcome, op.Err = workload.Failed, "conflict, then the read of the object failed: "+seenReq.Err
		} else {
			op.Outcome, op.SeenValue, op.Rev = workload.Conflict, seen.Value, seen.Rev
			s.cache.observe(obj.key, seen)
		}
		l.record(seenReq, &op)
		return
	default:
		req.Outcome, req.Code, req.Err = workload.Failed, statusCode(err), err.Error()
		req.Class = Classify(req.Code, req.Err)
		op.Outcome, op.Err = workload.Failed, req.Err
	}
	l.record(req, &op)
}

// get is one GET of obj through s, not recorded and not routed (the
// clients' reads go through routedGet). The load's own requests pass a ctx
// that Stop does not cancel. Without a resourceVersion kube-apiserver
// serves it from etcd with a quorum read, so it is a linearizable read.
// 404 is an answer: the object is absent (revision 0).
func (l *Load) get(ctx context.Context, s *server, obj object) (Request, workload.KeyValue) {
	req := Request{Server: s.name, Kind: workload.Read, Object: obj.key, Call: l.now(), Phase: l.currentPhase()}
	cm, err := s.clients.CoreV1().ConfigMaps(l.opts.Namespace).Get(ctx, obj.name, metav1.GetOptions{})
	req.Return = l.now()
	var kv workload.KeyValue
	switch {
	case err == nil:
		kv, err = keyValue(cm)
		if err != nil {
			req.Outcome, req.Code, req.Class, req.Err = workload.Failed, http.StatusOK, Other, err.Error()
			break
		}
		req.Outcome, req.Code = workload.Succeeded, http.StatusOK
	case apierrors.IsNotFound(err):
		req.Outcome, req.Code = workload.Succeeded, http.StatusNotFound
	default:
		req.Outcome, req.Code, req.Err = workload.Failed, statusCode(err), err.Error()
		req.Class = Classify(req.Code, req.Err)
	}
	return req, kv
}

// routedGet is get through the server home's clients reach now, counted
// in flight through it for Switch.
func (l *Load) routedGet(home *server, obj object) (Request, workload.KeyValue) {
	via := l.acquire(home)
	req, kv := l.get(context.Background(), via, obj)
	l.release(via)
	req.Origin = origin(home, via)
	return req, kv
}

// readOp is the history's record of a read.
func readOp(client int, obj object, req Request, kv workload.KeyValue) workload.Op {
	op := workload.Op{
		Client: client, Kind: workload.Read, Key: obj.key, Call: req.Call, Return: req.Return,
		Outcome: req.Outcome, SeenValue: kv.Value, Rev: kv.Rev, Err: req.Err, Phase: req.Phase, Attempts: 1,
	}
	return op
}

// keyValue is a ConfigMap's value and resourceVersion, which is its etcd
// ModRevision.
func keyValue(cm *corev1.ConfigMap) (workload.KeyValue, error) {
	rev, err := strconv.ParseInt(cm.ResourceVersion, 10, 64)
	if err != nil {
		return workload.KeyValue{}, fmt.Errorf("resourceVersion %q is not an etcd revision: %w", cm.ResourceVersion, err)
	}
	return workload.KeyValue{Value: cm.Data[valueKey], Rev: rev}, nil
}

// objectCache is a server's writers' shared belief of each object's state.
type objectCache struct {
	mu sync.Mutex
	kv map[string]workload.KeyValue
}

func newObjectCache() *objectCache {
	return &objectCache{kv: map[string]workload.KeyValue{}}
}

func (c *objectCache) get(key string) workload.KeyValue {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kv[key]
}

// observe keeps the newest state seen; answers arrive out of order.
func (c *objectCache) observe(key string, kv workload.KeyValue) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if kv.Rev > c.kv[key].Rev {
		c.kv[key] = kv
	}
}
