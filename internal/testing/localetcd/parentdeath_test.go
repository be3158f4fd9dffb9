package localetcd

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
)

// helperEnv makes the test binary act as a program that starts a member
// and then dies without any cleanup (see TestHelperHoldsMember).
const helperEnv = "LOCALETCD_TEST_HELPER_DIR"

// TestHelperHoldsMember is not a test: run by TestChildrenDieWithParent in
// a child process, it starts one member, prints its pid and waits to be
// killed, never calling Close.
func TestHelperHoldsMember(t *testing.T) {
	dir := os.Getenv(helperEnv)
	if dir == "" {
		t.Skip("helper process for TestChildrenDieWithParent")
	}
	r, err := New(Options{Dir: dir})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ms, err := r.StartCluster(ctx, []string{"orphan"}, MemberOptions{})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	fmt.Printf("PID %d\n", ms[0].PID())
	time.Sleep(time.Minute) // the parent kills us long before
	os.Exit(1)
}

// TestChildrenDieWithParent: when the process that started etcd dies
// without cleanup (SIGKILL, or Ctrl-C's SIGINT with no handler), the kernel
// ends etcd too (Pdeathsig), so nothing outlives a crashed test or demo.
func TestChildrenDieWithParent(t *testing.T) {
	testbin.Need(t)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			g := NewWithT(t)
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldsMember$")
			cmd.Env = append(os.Environ(), helperEnv+"="+t.TempDir())
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(cmd.Start()).To(Succeed())
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

			line, err := bufio.NewReader(out).ReadString('\n')
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(line).To(HavePrefix("PID "))
			pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "PID ")))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(processGone(pid)).To(BeFalse(), "etcd runs while its parent does")

			g.Expect(cmd.Process.Signal(sig)).To(Succeed())
			_ = cmd.Wait()
			g.Eventually(func() bool { return processGone(pid) }).
				WithTimeout(5*time.Second).WithPolling(20*time.Millisecond).
				Should(BeTrue(), "etcd pid %d outlived its parent", pid)
		})
	}
}
