package site

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CompactionJob is one compaction Job druid ran for an Etcd, as a watch on
// the Jobs of the Etcd's namespace saw it. Its instants are when the watch
// saw each change: a Job's own timestamps are whole seconds, too coarse to
// place a Job of some seconds among a move's steps.
type CompactionJob struct {
	// Site is the cluster identity of the site it ran in.
	Site string
	// Namespace, Etcd and Name are the Job's namespace, the Etcd that owns
	// it and its name (druid names every compaction Job of an Etcd alike,
	// <etcd>-compactor); UID tells its runs apart.
	Namespace, Etcd, Name string
	UID                   types.UID
	// Created is when the watch first saw the Job (its creation time if
	// it existed before the recording began), Ended when it saw its
	// Complete or Failed condition (zero: it had not ended when the
	// recording stopped), Deleted when it saw it go (druid deletes a
	// finished Job).
	Created, Ended, Deleted time.Time
	// Succeeded is its Complete condition; Failed its Failed one, with
	// that condition's Reason and Message.
	Succeeded, Failed bool
	Reason, Message   string
}

// BeganWithin tells whether the Job appeared at from or after it and at
// to or before it.
func (j CompactionJob) BeganWithin(from, to time.Time) bool {
	return !j.Created.Before(from) && !j.Created.After(to)
}

// Describe is one line on the Job, its instants as seconds after origin.
func (j CompactionJob) Describe(origin time.Time) string {
	at := func(t time.Time) string { return fmt.Sprintf("%+.1f s", t.Sub(origin).Seconds()) }
	s := fmt.Sprintf("%s %s/%s (uid %s): created %s", j.Site, j.Namespace, j.Name, j.UID, at(j.Created))
	switch {
	case j.Succeeded:
		s += fmt.Sprintf(", completed %s (%.1f s after its creation)", at(j.Ended), j.Ended.Sub(j.Created).Seconds())
	case j.Failed:
		s += fmt.Sprintf(", FAILED %s (%.1f s after its creation): %s: %s", at(j.Ended), j.Ended.Sub(j.Created).Seconds(), j.Reason, j.Message)
	default:
		s += ", not ended"
	}
	if !j.Deleted.IsZero() {
		s += ", deleted " + at(j.Deleted)
	}
	return s
}

// CompactionRecorder records druid's compaction Jobs in one namespace of a
// site, from RecordCompactionJobs until Stop or the site's Stop.
type CompactionRecorder struct {
	site    *Site
	started time.Time
	stop    chan struct{}
	once    sync.Once
	factory informers.SharedInformerFactory

	mu    sync.Mutex
	jobs  []*CompactionJob
	byUID map[types.UID]*CompactionJob
}

// RecordCompactionJobs watches the Jobs of namespace in s and records each
// compaction Job druid creates there: when it appeared, ended (complete or
// failed) and went. Jobs are watched, not listed at the end: druid deletes
// a compaction Job as soon as it has ended. It returns once the watch
// runs.
func (s *Site) RecordCompactionJobs(ctx context.Context, namespace string) (*CompactionRecorder, error) {
	r := &CompactionRecorder{
		site: s, started: time.Now(), stop: make(chan struct{}), byUID: map[types.UID]*CompactionJob{},
		factory: informers.NewSharedInformerFactoryWithOptions(s.Kube, 0, informers.WithNamespace(namespace)),
	}
	inf := r.factory.Batch().V1().Jobs().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.observe(o, false) },
		UpdateFunc: func(_, o any) { r.observe(o, false) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			r.observe(o, true)
		},
	}); err != nil {
		return nil, err
	}
	r.factory.Start(r.stop)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		r.Stop()
		return nil, fmt.Errorf("watching the Jobs of %s in %s: %w", namespace, s.opts.ClusterIdentity, context.Cause(ctx))
	}
	s.onStop(func() error { r.Stop(); return nil })
	return r, nil
}

// compactedEtcd is the Etcd whose compaction Job job is, "" if it is none:
// druid's compaction controller creates it controlled by the Etcd, under
// the Etcd's compaction Job name.
func compactedEtcd(job *batchv1.Job) string {
	ref := metav1.GetControllerOf(job)
	if ref == nil || ref.Kind != "Etcd" || ref.APIVersion != druidv1alpha1.SchemeGroupVersion.String() {
		return ""
	}
	if job.Name != druidv1alpha1.GetCompactionJobName(metav1.ObjectMeta{Name: ref.Name}) {
		return ""
	}
	return ref.Name
}

func (r *CompactionRecorder) observe(o any, deleted bool) {
	now := time.Now()
	job, ok := o.(*batchv1.Job)
	if !ok {
		return
	}
	etcd := compactedEtcd(job)
	if etcd == "" {
		return
	}
	log := r.site.log.WithValues("job", job.Namespace+"/"+job.Name, "uid", job.UID)
	r.mu.Lock()
	defer r.mu.Unlock()
	j := r.byUID[job.UID]
	if j == nil {
		created := now
		if t := job.CreationTimestamp.Time; t.Before(r.started) {
			created = t
		}
		j = &CompactionJob{Site: r.site.opts.ClusterIdentity, Namespace: job.Namespace, Etcd: etcd, Name: job.Name, UID: job.UID, Created: created}
		r.jobs = append(r.jobs, j)
		r.byUID[job.UID] = j
		log.Info("druid's compaction Job appeared")
	}
	if j.Ended.IsZero() {
		for _, c := range job.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				continue
			}
			switch c.Type {
			case batchv1.JobComplete:
				j.Ended, j.Succeeded = now, true
				log.Info("druid's compaction Job completed", "took", now.Sub(j.Created).String())
			case batchv1.JobFailed:
				j.Ended, j.Failed, j.Reason, j.Message = now, true, c.Reason, c.Message
				log.Info("druid's compaction Job failed", "took", now.Sub(j.Created).String(), "reason", c.Reason, "message", c.Message)
			}
		}
	}
	if deleted && j.Deleted.IsZero() {
		j.Deleted = now
		log.Info("druid's compaction Job deleted")
	}
}

// Stop ends the recording and returns the Jobs seen, in the order they
// appeared. Safe to call twice.
func (r *CompactionRecorder) Stop() []CompactionJob {
	r.once.Do(func() {
		close(r.stop)
		r.factory.Shutdown()
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]CompactionJob, 0, len(r.jobs))
	for _, j := range r.jobs {
		out = append(out, *j)
	}
	return out
}

// sortCompactionJobs orders Jobs of several sites by when they appeared.
func sortCompactionJobs(jobs []CompactionJob) {
	slices.SortStableFunc(jobs, func(a, b CompactionJob) int { return a.Created.Compare(b.Created) })
}

// SnapshotTaken is an out-of-schedule snapshot of an Etcd's backups that
// a test or a live move asked for (Site.TriggerSnapshot).
type SnapshotTaken struct {
	// At is when it was asked for, Pod the pod whose backup-restore took
	// it (the leading member's: only its snapshotter runs).
	At  time.Time
	Pod string
	Err error
}

// TriggerSnapshot asks the backup-restore of the Etcd's leading member for
// a snapshot out of its schedule, kind "full" or "delta" (its
// /snapshot/full or /snapshot/delta), trying every pod of the Etcd until
// one takes it, for up to a minute. After a delta snapshot backup-restore
// renews its delta snapshot lease with the snapshot's revision, and
// druid's compaction controller, which watches that lease, starts a
// compaction Job once the events since the last full snapshot reach its
// threshold: the lease is otherwise renewed once per delta snapshot
// period, which a short move may end before.
func (s *Site) TriggerSnapshot(ctx context.Context, key client.ObjectKey, kind string) SnapshotTaken {
	d := SnapshotTaken{At: time.Now()}
	if kind != "full" && kind != "delta" {
		d.Err = fmt.Errorf("a snapshot of kind %q: backup-restore takes full and delta snapshots", kind)
		return d
	}
	tlsConf, err := s.EtcdClientTLS()
	if err != nil {
		d.Err = err
		return d
	}
	// backup-restore serves with etcd's server certificate and wants a
	// client certificate of the shoot's etcd CA.
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: s.DialContext, TLSClientConfig: tlsConf}}
	defer hc.CloseIdleConnections()
	peers := druidv1alpha1.GetPeerServiceName(metav1.ObjectMeta{Name: key.Name})
	var last []string
	// A leader change moves the snapshotter: the next round asks again.
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := s.EtcdPods(ctx, key)
		if err != nil {
			last = []string{err.Error()}
			return false, nil
		}
		last = last[:0]
		for _, p := range pods {
			url := "https://" + net.JoinHostPort(p.Name+"."+peers+"."+key.Namespace+".svc", "8080") + "/snapshot/" + kind
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return false, err
			}
			resp, err := hc.Do(req)
			if err != nil {
				last = append(last, p.Name+": "+err.Error())
				continue
			}
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				d.Pod = p.Name
				return true, nil
			}
			last = append(last, fmt.Sprintf("%s: %s %s", p.Name, resp.Status, strings.TrimSpace(string(body))))
		}
		return false, nil
	})
	if err != nil {
		d.Err = fmt.Errorf("no backup-restore of %s in %s took a %s snapshot (%w): %s", key, s.opts.ClusterIdentity, kind, err, strings.Join(last, "; "))
	}
	return d
}
