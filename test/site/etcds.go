package site

import (
	"context"
	_ "embed"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	druidv1alpha1 "github.com/gardener/etcd-druid/api/core/v1alpha1"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
)

// EtcdMainManifest is a plain etcd-druid Etcd shaped like a Gardener
// shoot's etcd-main (manifests/etcd-main.yaml): three members, a Local
// backup store, client, peer and backup-restore TLS from the Secrets of
// ShootTLS, and no druid-stretch field.
//
//go:embed manifests/etcd-main.yaml
var EtcdMainManifest []byte

// ShootNamespaceLabels are the labels gardenlet gives a shoot's namespace
// on a seed; the sites' druid-stretch manages every Etcd of a namespace
// that has them (controller.manageEtcdsInNamespaces), as a seed's would.
var ShootNamespaceLabels = map[string]string{"gardener.cloud/role": "shoot"}

// CreateNamespace creates a namespace with labels (nil: none); one that
// exists already is fine, whatever its labels.
func (s *Site) CreateNamespace(ctx context.Context, name string, labels map[string]string) error {
	err := s.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// CreateEtcd creates the Etcd of EtcdMainManifest in namespace, edited by
// edit (nil: as it is), as an operator's `kubectl create` would (strict
// field validation), and returns its key.
func (s *Site) CreateEtcd(ctx context.Context, namespace string, edit func(*unstructured.Unstructured) error) (client.ObjectKey, error) {
	o := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(EtcdMainManifest, &o.Object); err != nil {
		return client.ObjectKey{}, fmt.Errorf("decoding the Etcd manifest: %w", err)
	}
	o.SetNamespace(namespace)
	if edit != nil {
		if err := edit(o); err != nil {
			return client.ObjectKey{}, fmt.Errorf("editing the Etcd manifest: %w", err)
		}
	}
	if err := s.Client.Create(ctx, o, client.FieldValidation("Strict")); err != nil {
		return client.ObjectKey{}, fmt.Errorf("creating Etcd %s/%s: %w", namespace, o.GetName(), err)
	}
	return client.ObjectKeyFromObject(o), nil
}

// WaitEtcdReady waits until druid reports the Etcd Ready, with its current
// spec reconciled and replicas ready members. On timeout the error says
// what druid, the StatefulSet and the pods said last: druid's Ready
// follows the StatefulSet's rollout (its revisions), which druid starts
// when a reconciled spec changes the pod template.
func (s *Site) WaitEtcdReady(ctx context.Context, key client.ObjectKey, replicas int32, timeout time.Duration) error {
	var last, readErr string
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		var e v1alpha1.Etcd
		if err := s.Client.Get(ctx, key, &e); err != nil {
			// Kept apart from last: the read that fails as the wait
			// runs out would otherwise hide what druid said before.
			readErr = err.Error()
			return false, nil
		}
		switch {
		case e.Status.ObservedGeneration == nil || *e.Status.ObservedGeneration != e.Generation:
			last = fmt.Sprintf("druid has not reconciled generation %d yet", e.Generation)
		case !e.DruidEtcd().IsReady():
			last = "druid's conditions: " + Conditions(e.Status.Conditions)
		case e.Status.ReadyReplicas != replicas:
			last = fmt.Sprintf("%d ready replicas, want %d", e.Status.ReadyReplicas, replicas)
		default:
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		if last == "" {
			last = "never read"
		}
		if readErr != "" {
			last += " (last read error: " + readErr + ")"
		}
		// The wait's context may have run out with the wait: describe the
		// objects under a context of their own.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return fmt.Errorf("etcd %s in %s is not Ready after %s: %s; statefulset: %s; pods: %s",
			key, s.opts.ClusterIdentity, timeout, last, s.statefulSetSummary(dctx, key), s.podSummaryOrError(dctx, key))
	}
	return nil
}

// statefulSetSummary describes the rollout of the Etcd's StatefulSet as
// druid's readiness check reads it: generations, ready, current and
// updated replicas, and the current and update revisions.
func (s *Site) statefulSetSummary(ctx context.Context, key client.ObjectKey) string {
	var sts appsv1.StatefulSet
	if err := s.Client.Get(ctx, key, &sts); err != nil {
		return err.Error()
	}
	st := sts.Status
	line := fmt.Sprintf("generation %d observed %d, %d ready, %d current, %d updated",
		sts.Generation, st.ObservedGeneration, st.ReadyReplicas, st.CurrentReplicas, st.UpdatedReplicas)
	if st.CurrentRevision != st.UpdateRevision {
		line += fmt.Sprintf(", rolling from revision %s to %s", st.CurrentRevision, st.UpdateRevision)
	}
	return line
}

// podSummaryOrError is PodSummary, or the error that kept it from being read.
func (s *Site) podSummaryOrError(ctx context.Context, key client.ObjectKey) string {
	pods, err := s.PodSummary(ctx, key)
	if err != nil {
		return err.Error()
	}
	return pods
}

// WaitVoters waits until druid-stretch reports n voters for the Etcd.
func (s *Site) WaitVoters(ctx context.Context, key client.ObjectKey, n int, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := etcdview.Get(ctx, s.Client, key)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		st := p.View.Status.Membership
		if st == nil {
			last = "no status.membership yet"
			return false, nil
		}
		v := st.Voters()
		last = fmt.Sprintf("voters %v", v)
		return len(v) == n, nil
	})
	if err != nil {
		return fmt.Errorf("etcd %s in %s has not %d voters after %s: %s", key, s.opts.ClusterIdentity, n, timeout, last)
	}
	return nil
}

// Conditions renders druid's conditions for a message.
func Conditions(cs []druidv1alpha1.Condition) string {
	var out []string
	for _, c := range cs {
		out = append(out, fmt.Sprintf("%s=%s (%s)", c.Type, c.Status, c.Message))
	}
	return strings.Join(out, "; ")
}

// EtcdPods are the Etcd's pods, by name.
func (s *Site) EtcdPods(ctx context.Context, key client.ObjectKey) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := s.Client.List(ctx, &list, client.InNamespace(key.Namespace),
		client.MatchingLabels{druidv1alpha1.LabelPartOfKey: key.Name}); err != nil {
		return nil, err
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}

// PodSummary is one line per pod of the Etcd: phase, and per container its
// state, readiness and restarts.
func (s *Site) PodSummary(ctx context.Context, key client.ObjectKey) (string, error) {
	pods, err := s.EtcdPods(ctx, key)
	if err != nil {
		return "", err
	}
	var out []string
	for _, p := range pods {
		var cs []string
		for _, c := range p.Status.ContainerStatuses {
			state := "running"
			switch {
			case c.State.Waiting != nil:
				state = "waiting " + c.State.Waiting.Reason
			case c.State.Terminated != nil:
				state = fmt.Sprintf("exited %d", c.State.Terminated.ExitCode)
			}
			cs = append(cs, fmt.Sprintf("%s %s ready=%t restarts=%d", c.Name, state, c.Ready, c.RestartCount))
		}
		out = append(out, fmt.Sprintf("%s %s [%s]", p.Name, p.Status.Phase, strings.Join(cs, ", ")))
	}
	return strings.Join(out, "; "), nil
}

// PodReady tells whether the pod's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// EtcdClient is an etcd client of the given client URLs, dialing through
// the site's pod network (and its peers'), over TLS with EtcdClientTLS.
// The caller closes it.
func (s *Site) EtcdClient(endpoints ...string) (*clientv3.Client, error) {
	t, err := s.EtcdClientTLS()
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: t,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return s.DialContext(ctx, "tcp", addr)
		})},
	})
}

// EtcdCrashes are the lines of every etcd container log on the site's
// nodes, of every pod that ran there, that tell of a panic or a fatal exit
// (etcd issue 21966: a member polled while it applies its own removal
// panics), each prefixed with the pod's folder.
func (s *Site) EtcdCrashes() ([]string, error) {
	logs, err := s.EtcdLogs()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "panic:") || strings.Contains(line, `"level":"panic"`) || strings.Contains(line, `"level":"fatal"`) {
				out = append(out, filepath.Base(filepath.Dir(f))+": "+strings.TrimSpace(line))
			}
		}
	}
	return out, nil
}

// EtcdLogs are the paths of every etcd container log on the site's nodes,
// of every pod that ran there.
func (s *Site) EtcdLogs() ([]string, error) {
	var logs []string
	for _, n := range s.Nodes {
		l, err := filepath.Glob(filepath.Join(n.Dir, "pods", "*", "etcd.log"))
		if err != nil {
			return nil, err
		}
		logs = append(logs, l...)
	}
	return logs, nil
}
