package podhost

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
)

// TestStopRunsThePreStopSleepBeforeSIGTERM stops a process the way a pod's
// deletion does: a container with a preStop sleep gets SIGTERM only once
// the sleep ended, one without a hook at once, and a hook longer than the
// grace period is cut to it. The process records when SIGTERM reached it.
func TestStopRunsThePreStopSleepBeforeSIGTERM(t *testing.T) {
	for _, tc := range []struct {
		name         string
		sleep        int64 // 0: no hook
		grace        time.Duration
		atLeast, lte time.Duration
	}{
		// The upper bounds are loose (a loaded machine delivers signals
		// late) but far below what a missing or uncut hook would take.
		{name: "no hook", grace: 30 * time.Second, lte: 1500 * time.Millisecond},
		{name: "a 2 s sleep", sleep: 2, grace: 30 * time.Second, atLeast: 2 * time.Second, lte: 10 * time.Second},
		{name: "a sleep beyond the grace period", sleep: 60, grace: time.Second, atLeast: time.Second, lte: 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			stamp := filepath.Join(t.TempDir(), "sigterm")
			// The shell writes the time SIGTERM arrived, in nanoseconds, and
			// exits; ready says its trap is set.
			ready := stamp + ".ready"
			cmd := exec.Command("sh", "-c", `trap 'date +%s%N > `+stamp+`; exit 0' TERM; touch `+ready+`; while :; do sleep 0.05; done`)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			g.Expect(cmd.Start()).To(Succeed())
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-exited })
			g.Eventually(func() error { _, err := os.Stat(ready); return err }).WithTimeout(10 * time.Second).Should(Succeed())

			spec := corev1.Container{Name: "etcd"}
			if tc.sleep > 0 {
				spec.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: tc.sleep}}}
			}
			c := &container{r: &podRun{}, spec: spec, log: testr.New(t), cmd: cmd, exited: exited}
			began := time.Now()
			c.kill(tc.grace)

			b, err := os.ReadFile(stamp)
			g.Expect(err).NotTo(HaveOccurred(), "the process got SIGTERM")
			ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			g.Expect(err).NotTo(HaveOccurred())
			after := time.Unix(0, ns).Sub(began)
			g.Expect(after).To(BeNumerically(">=", tc.atLeast), "SIGTERM came after the hook")
			g.Expect(after).To(BeNumerically("<=", tc.lte), "and not later than the hook (or the grace period) asks")
		})
	}
}
