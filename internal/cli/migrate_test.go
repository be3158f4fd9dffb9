package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/internal/etcdview"
	"github.com/druid-stretch/druid-stretch/internal/livemove"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// TestMigrateCommand runs `druid-stretch migrate` against two real
// kube-apiservers without controllers: the flags reach the move, which
// writes the destination's members from the URL templates into the source
// and then waits, up to --step-timeout, for a controller that never comes.
func TestMigrateCommand(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	dir := t.TempDir()
	kubeconfigs := make([]string, 2)
	clients := make([]client.Client, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, name := range []string{"source", "destination"} {
		env, err := testbin.Environment()
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = env.Stop() })
		wg.Go(func() {
			cfg, err := env.Start()
			if err != nil {
				errs[i] = err
				return
			}
			kubeconfigs[i] = filepath.Join(dir, name+".kubeconfig")
			if errs[i] = os.WriteFile(kubeconfigs[i], env.KubeConfig, 0o600); errs[i] != nil {
				return
			}
			clients[i], errs[i] = livemove.NewClient(cfg)
		})
	}
	wg.Wait()
	for _, err := range errs {
		g.Expect(err).NotTo(HaveOccurred())
	}
	ctx := context.Background()
	for _, c := range clients {
		g.Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shoot--p--s"}})).To(Succeed())
	}
	src := &v1alpha1.Etcd{ObjectMeta: metav1.ObjectMeta{Name: "etcd-main", Namespace: "shoot--p--s"}}
	src.Spec.Replicas = 3
	src.Spec.Labels = map[string]string{"app": "etcd-statefulset"}
	g.Expect(clients[0].Create(ctx, src)).To(Succeed())

	run := func(args ...string) (string, error) {
		cmd := newRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}
	_, err := run("migrate", "--source-kubeconfig", kubeconfigs[0], "--destination-kubeconfig", kubeconfigs[1], "--namespace", "shoot--p--s", "--name", "etcd-main",
		"--source-peer-url-template", "http://{pod}.seed-a.example:2380", "--destination-peer-url-template", "http://{pod}.{name}.seed-b.example:{port}")
	g.Expect(err).To(MatchError(ContainSubstring("unknown placeholder {port}")))

	out, err := run("migrate", "--source-kubeconfig", kubeconfigs[0], "--destination-kubeconfig", kubeconfigs[1], "--namespace", "shoot--p--s", "--name", "etcd-main",
		"--source-peer-url-template", "http://{pod}.seed-a.example:2380",
		"--destination-peer-url-template", "http://{pod}.seed-b.example:2380",
		"--destination-sidecar-url-template", "https://{pod}.seed-b.example:8090",
		"--destination-ordinal-start", "10", "--step-timeout", "1s")
	g.Expect(err).To(MatchError(ContainSubstring("step prepare-source did not finish within 1s")))
	g.Expect(exitCode(err)).To(Equal(ExitNotFinished))
	g.Expect(out).To(ContainSubstring("step prepare-source: starting (NotStarted)"))

	// The source as stored: the Etcd and the EtcdMembership that carries
	// druid-stretch's fields.
	stored := func() *etcdview.Pair {
		p, err := etcdview.Get(ctx, clients[0], client.ObjectKeyFromObject(src))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(p.Membership).NotTo(BeNil(), "the source's EtcdMembership")
		return p
	}
	unchanged := func(before *etcdview.Pair, why string) {
		after := stored()
		g.Expect(after.Etcd.ResourceVersion).To(Equal(before.Etcd.ResourceVersion), why)
		g.Expect(after.Membership.ResourceVersion).To(Equal(before.Membership.ResourceVersion), why)
	}
	got := stored()
	g.Expect(got.View.Spec.ExternalMembers).To(HaveLen(3))
	g.Expect(got.View.Spec.ExternalMembers[0]).To(Equal(v1alpha1.ExternalMember{
		Name: "etcd-main-10", PeerURLs: []string{"http://etcd-main-10.seed-b.example:2380"}, SidecarURL: "https://etcd-main-10.seed-b.example:8090",
	}))
	g.Expect(got.View.Spec.GetExternalMembersPolicy()).To(Equal(v1alpha1.ExternalMembersPolicyKeep))

	// --status reads where the move stands and changes nothing.
	base := []string{"migrate", "--source-kubeconfig", kubeconfigs[0], "--destination-kubeconfig", kubeconfigs[1], "--namespace", "shoot--p--s", "--name", "etcd-main"}
	out, err = run(append(base, "--status")...)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(ContainSubstring("PreparingSource: the source lists the destination's members; its controller has not converged yet"))
	g.Expect(out).To(ContainSubstring("next step: prepare-source"))
	g.Expect(out).To(ContainSubstring("source: replicas 3, 3 external members, policy Keep; not observed yet"))
	g.Expect(out).To(ContainSubstring("destination: no Etcd"))
	unchanged(got, "--status writes nothing")
	g.Expect(clients[1].Get(ctx, client.ObjectKeyFromObject(src), &v1alpha1.Etcd{})).To(MatchError(ContainSubstring("not found")))

	_, err = run(append(base, "--status", "--abort")...)
	g.Expect(err).To(MatchError(ContainSubstring("choose one")))
	g.Expect(exitCode(err)).To(Equal(ExitUsage))

	// -o json: the same report, for scripts.
	out, err = run(append(base, "--status", "-o", "json")...)
	g.Expect(err).NotTo(HaveOccurred())
	var report map[string]any
	g.Expect(json.Unmarshal([]byte(out), &report)).To(Succeed(), out)
	g.Expect(report).To(HaveKeyWithValue("phase", "PreparingSource"))
	g.Expect(report).To(HaveKeyWithValue("nextStep", "prepare-source"))
	g.Expect(report).To(HaveKeyWithValue("destination", BeNil()))
	g.Expect(report["source"]).To(HaveKeyWithValue("externalMembers", BeNumerically("==", 3)))

	// --dry-run prints the steps from here and changes nothing.
	out, err = run(append(base, "--dry-run")...)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(ContainSubstring("dry run: the steps from here, nothing was changed:"))
	g.Expect(out).To(MatchRegexp(`1\. prepare-source +the source lists`))
	g.Expect(out).To(MatchRegexp(`4\. finish +sets the source to replicas 0`))
	out, err = run(append(base, "--dry-run", "--abort", "-o", "yaml", "--switch-clients-command", "true")...)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(ContainSubstring("dryRun: true"))
	g.Expect(out).To(ContainSubstring("- does: sets the destination to replicas 0"))
	g.Expect(out).To(ContainSubstring("step: abort"))
	unchanged(got, "--dry-run writes nothing")
	_, err = run(append(base, "--dry-run", "-o", "wide")...)
	g.Expect(exitCode(err)).To(Equal(ExitUsage))
	// With the switch command, retire-source comes before switch-clients
	// by default (one source member held); --hold-source 0 switches the
	// clients first. An explicit hold needs the switch command, and a
	// count of members.
	out, err = run(append(base, "--dry-run", "--switch-clients-command", "true")...)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(MatchRegexp(`3\. retire-source +sets the destination's policy to Retire`))
	g.Expect(out).To(MatchRegexp(`4\. switch-clients +runs --switch-clients-command`))
	out, err = run(append(base, "--dry-run", "--switch-clients-command", "true", "--hold-source", "0")...)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(MatchRegexp(`3\. switch-clients +runs --switch-clients-command`))
	g.Expect(out).To(MatchRegexp(`4\. retire-source +sets the destination's policy to Retire`))
	_, err = run(append(base, "--dry-run", "--hold-source", "1")...)
	g.Expect(err).To(MatchError(ContainSubstring("--hold-source 1 needs --switch-clients-command")))
	g.Expect(exitCode(err)).To(Equal(ExitUsage))
	_, err = run(append(base, "--dry-run", "--switch-clients-command", "true", "--hold-source", "-1")...)
	g.Expect(err).To(MatchError(ContainSubstring("--hold-source -1")))
	g.Expect(exitCode(err)).To(Equal(ExitUsage))
	// --gep39 writes druid's own fields only: it needs the destination's
	// prefix and the source's client endpoints, and runs forward only.
	_, err = run(append(base, "--gep39")...)
	g.Expect(err).To(MatchError(ContainSubstring("--gep39 needs --destination-member-name-prefix")))
	g.Expect(exitCode(err)).To(Equal(ExitUsage))
	_, err = run(append(base, "--gep39", "--destination-member-name-prefix", "seed-b", "--source-client-endpoints", "https://c:2379", "--abort")...)
	g.Expect(err).To(MatchError(ContainSubstring("--gep39 runs GEP-39's stages forward only")))
	g.Expect(exitCode(err)).To(Equal(ExitUsage))
	// --status of a GEP-39 move names its stage, not druid-stretch's phase.
	out, err = run(append(base, "--gep39", "--destination-member-name-prefix", "seed-b", "--source-client-endpoints", "https://c:2379", "--status")...)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(HavePrefix("SourceEtcdPreparedForPeerJoin: "))
	g.Expect(out).To(ContainSubstring("next step: SourceEtcdPreparedForPeerJoin"))
	unchanged(got, "a refused call writes nothing")

	// Two contexts of one kubeconfig, as kubectl takes them.
	merged := clientcmdapi.NewConfig()
	for i, side := range []string{"seed-a", "seed-b"} {
		kc, err := clientcmd.LoadFromFile(kubeconfigs[i])
		g.Expect(err).NotTo(HaveOccurred())
		kctx := kc.Contexts[kc.CurrentContext]
		merged.Clusters[side] = kc.Clusters[kctx.Cluster]
		merged.AuthInfos[side] = kc.AuthInfos[kctx.AuthInfo]
		merged.Contexts[side] = &clientcmdapi.Context{Cluster: side, AuthInfo: side}
	}
	merged.CurrentContext = "seed-b"
	mergedPath := filepath.Join(dir, "both.kubeconfig")
	g.Expect(clientcmd.WriteToFile(*merged, mergedPath)).To(Succeed())
	byContext := []string{"migrate", "--source-kubeconfig", mergedPath, "--source-context", "seed-a",
		"--destination-kubeconfig", mergedPath, "--destination-context", "seed-b", "--namespace", "shoot--p--s", "--name", "etcd-main"}
	out, err = run(append(byContext, "--status")...)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(ContainSubstring("source: replicas 3, 3 external members"), "the source context reaches seed A")
	_, err = run("migrate", "--source-kubeconfig", mergedPath, "--source-context", "seed-c", "--destination-kubeconfig", mergedPath, "--namespace", "shoot--p--s", "--name", "etcd-main", "--status")
	g.Expect(err).To(MatchError(And(ContainSubstring("--source-context"), ContainSubstring(`context "seed-c"`))))

	// --wait=false starts the step under way and returns at once.
	out, err = run(append(byContext, "--wait=false", "--step-timeout", "1m",
		"--source-peer-url-template", "http://{pod}.seed-a.example:2380",
		"--destination-peer-url-template", "http://{pod}.seed-b.example:2380")...)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(ContainSubstring("step prepare-source started; not waiting (--wait=false)"))
}

// The switch hook runs its shell command with the Etcd's namespace and
// name; a failing command stops the move with its exit status and last
// line of output, and one that outlives the move's context is ended.
func TestSwitchClientsCommand(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	var out bytes.Buffer
	marker := filepath.Join(dir, "switched")
	ok := shellHook("--switch-clients-command", `echo "$DRUID_STRETCH_NAMESPACE/$DRUID_STRETCH_NAME" > `+marker+`; echo switched`, "shoot--dev--demo", "etcd-main", &out)
	g.Expect(ok(t.Context())).To(Succeed())
	g.Expect(os.ReadFile(marker)).To(Equal([]byte("shoot--dev--demo/etcd-main\n")))
	g.Expect(out.String()).To(Equal("switched\n"))

	failing := shellHook("--switch-clients-command", `echo "updating the DNS record"; echo "dns: permission denied" >&2; exit 3`, "ns", "etcd", &out)
	err := failing(t.Context())
	g.Expect(err).To(MatchError(And(ContainSubstring("--switch-clients-command"), ContainSubstring("exit status 3"), HaveSuffix("dns: permission denied"))))

	// A command still running when the move's context ends is killed
	// with the processes it started.
	pidFile := filepath.Join(dir, "child")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- shellHook("--switch-clients-command", "sleep 60 & echo $! > "+pidFile+"; wait", "ns", "etcd", &out)(ctx)
	}()
	var child int
	g.Eventually(func() error {
		b, err := os.ReadFile(pidFile)
		if err == nil {
			_, err = fmt.Sscanf(string(b), "%d", &child)
		}
		return err
	}).WithTimeout(10 * time.Second).Should(Succeed())
	cancel()
	g.Eventually(done).WithTimeout(10 * time.Second).Should(Receive(MatchError(ContainSubstring("signal: killed"))))
	g.Eventually(func() error { return syscall.Kill(child, 0) }).WithTimeout(10*time.Second).
		Should(MatchError(syscall.ESRCH), "the command's child %d is gone", child)
}
