package livemove_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	stretchv1alpha1 "github.com/druid-stretch/druid-stretch/api/stretch/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
	"github.com/druid-stretch/druid-stretch/internal/testing/freeport"
	"github.com/druid-stretch/druid-stretch/internal/testing/pki"
)

// webhook is a validating admission webhook of the source cluster for the
// Etcds and EtcdMemberships of one namespace, as druid-stretch's is for
// every managed Etcd, whose server can be down (its controller
// restarting), up and admitting, or up and refusing.
type webhook struct {
	addr    string
	tls     *tls.Config
	deny    string // when set, every review is refused with this message
	reviews atomic.Int32

	mu  sync.Mutex
	srv *http.Server
}

// newWebhook registers the webhook in the source cluster for namespace,
// with failurePolicy Fail (as druid-stretch's chart does), its server down.
func newWebhook(t *testing.T, namespace string) *webhook {
	t.Helper()
	g := NewWithT(t)
	ca, err := pki.NewCA("migration-test-webhook")
	g.Expect(err).NotTo(HaveOccurred())
	pair, err := ca.Issue("webhook", "127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	cert, err := pair.Certificate()
	g.Expect(err).NotTo(HaveOccurred())
	port, err := freeport.Pick()
	g.Expect(err).NotTo(HaveOccurred())
	w := &webhook{addr: fmt.Sprintf("127.0.0.1:%d", port), tls: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}

	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "migration-test-" + namespace},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "etcds.migration-test.druid-stretch.example",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://" + w.addr + "/validate"), CABundle: ca.CertPEM()},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](2),
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": namespace}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{
					APIGroups:   []string{v1alpha1.GroupVersion.Group, stretchv1alpha1.GroupVersion.Group},
					APIVersions: []string{"*"},
					Resources:   []string{"etcds", "etcdmemberships"},
				},
			}},
		}},
	}
	g.Expect(srcClient.Create(t.Context(), cfg)).To(Succeed())
	t.Cleanup(func() {
		_ = srcClient.Delete(context.Background(), cfg)
		w.down()
	})
	// The API server takes a moment to see a new configuration: a write
	// refused by the down server shows it does.
	// Each try reads the Etcd afresh: a probe the API server admitted
	// before it saw the configuration moved the resourceVersion on, and
	// a stale copy would then only ever be refused as a conflict.
	g.Eventually(func() string {
		p := &v1alpha1.Etcd{}
		if err := srcClient.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: "etcd-main"}, p); err != nil {
			return err.Error()
		}
		p.Annotations = map[string]string{"migration-test/probe": time.Now().String()}
		err := srcClient.Update(t.Context(), p)
		if err == nil {
			return ""
		}
		return err.Error()
	}).WithTimeout(30*time.Second).Should(ContainSubstring("failed calling webhook"), "the API server calls the webhook")
	return w
}

// up starts the webhook's server.
func (w *webhook) up(t *testing.T) {
	t.Helper()
	l, err := net.Listen("tcp", w.addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(w.review), TLSConfig: w.tls, ReadHeaderTimeout: 5 * time.Second}
	w.mu.Lock()
	w.srv = srv
	w.mu.Unlock()
	go func() { _ = srv.ServeTLS(l, "", "") }()
}

func (w *webhook) down() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.srv != nil {
		_ = w.srv.Close()
		w.srv = nil
	}
}

func (w *webhook) review(rw http.ResponseWriter, r *http.Request) {
	var rev admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&rev); err != nil || rev.Request == nil {
		http.Error(rw, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	w.reviews.Add(1)
	rev.Response = &admissionv1.AdmissionResponse{UID: rev.Request.UID, Allowed: w.deny == ""}
	if w.deny != "" {
		rev.Response.Result = &metav1.Status{Message: w.deny, Code: http.StatusForbidden}
	}
	rev.Request = nil
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(rev)
}

// waitingFor collects the messages of the WriteWaiting events: the Mover
// waits for an API server to admit a write.
func waitingFor(events []livemove.Event) []string {
	var out []string
	for _, e := range events {
		if e.Kind == livemove.WriteWaiting {
			out = append(out, e.Message)
		}
	}
	return out
}

// A webhook that is down (druid-stretch's controller restarting) makes the
// API server answer the Mover's patch with "failed calling webhook". The
// Mover waits, says what it waits for, and tries again: once the webhook
// serves, the patch lands and the step goes on to wait for the
// controllers (which this test has none of, so the step then times out).
func TestMoverWaitsForARestartingWebhook(t *testing.T) {
	g := NewWithT(t)
	ns, _ := setup(t)
	w := newWebhook(t, ns)
	var (
		events []livemove.Event
		mu     sync.Mutex
	)
	var once sync.Once
	m := mover(t, ns, nil, func(o *livemove.Options) {
		o.StepTimeout = 20 * time.Second
		o.Progress = func(e livemove.Event) {
			mu.Lock()
			events = append(events, e)
			n := len(waitingFor(events))
			mu.Unlock()
			// The webhook comes back after the Mover has waited for it
			// twice.
			if n >= 2 {
				once.Do(func() { w.up(t) })
			}
		}
	})
	err := m.Move(t.Context())
	g.Expect(err).To(MatchError(ContainSubstring("step prepare-source did not finish within 20s")), "the patch landed; the step then waits for the controllers")
	g.Expect(err.Error()).NotTo(ContainSubstring("admit"), "the time limit was not spent on the webhook")
	g.Expect(get(t, srcClient, ns).Spec.ExternalMembers).To(HaveLen(3), "the patch landed once the webhook served")
	g.Expect(w.reviews.Load()).To(BeNumerically(">=", 1), "the webhook admitted the patch")
	mu.Lock()
	defer mu.Unlock()
	waits := waitingFor(events)
	g.Expect(len(waits)).To(BeNumerically(">=", 2))
	g.Expect(waits[0]).To(And(ContainSubstring("waiting for the source API server to admit a write"), ContainSubstring("failed calling webhook")))
}

// A webhook that stays down: the step ends at its time limit with an error
// that names the webhook, exit code 3 for the migrate command (the
// deadline), and the source Etcd is as it was.
func TestMoverStopsAtTheTimeLimitWhenTheWebhookStaysDown(t *testing.T) {
	g := NewWithT(t)
	ns, _ := setup(t)
	newWebhook(t, ns)
	before := get(t, srcClient, ns)
	err := mover(t, ns, nil, func(o *livemove.Options) { o.StepTimeout = 5 * time.Second }).Move(t.Context())
	g.Expect(err).To(MatchError(context.DeadlineExceeded))
	g.Expect(err.Error()).To(And(ContainSubstring("did not admit the write before the step's time limit"), ContainSubstring("failed calling webhook")))
	after := get(t, srcClient, ns)
	g.Expect(after.Spec).To(Equal(before.Spec), "nothing changed")
	g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "nothing was written")
}

// A webhook that refuses is not waited for: the step ends at once with the
// refusal, and the source Etcd is as it was.
func TestMoverDoesNotRetryAWebhooksRefusal(t *testing.T) {
	g := NewWithT(t)
	ns, _ := setup(t)
	w := newWebhook(t, ns)
	w.deny = "refused by the test's webhook"
	w.up(t)
	before := get(t, srcClient, ns)
	var events []livemove.Event
	err := mover(t, ns, &events, func(o *livemove.Options) { o.StepTimeout = 20 * time.Second }).Move(t.Context())
	g.Expect(err).To(MatchError(ContainSubstring("refused by the test's webhook")))
	g.Expect(errors.Is(err, context.DeadlineExceeded)).To(BeFalse(), "the step ended on the refusal, not at its time limit")
	g.Expect(waitingFor(events)).To(BeEmpty(), "a refusal is not waited for")
	g.Expect(w.reviews.Load()).To(BeNumerically(">=", 1))
	after := get(t, srcClient, ns)
	g.Expect(after.Spec).To(Equal(before.Spec), "nothing changed")
	g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "nothing was written")
}
