package childproc

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// niceOf reads a process's nice value from /proc (field 19 of stat).
func niceOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// The command name (field 2) may hold spaces: count from its ")".
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	n, err := strconv.Atoi(fields[16])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStartNiceSetsTheChildsNiceValueOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a negative nice value needs root (CAP_SYS_NICE)")
	}
	own := niceOf(t, os.Getpid())
	cmd := exec.Command("sleep", "30")
	if err := StartNice(cmd, -7); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if got := niceOf(t, cmd.Process.Pid); got != -7 {
		t.Errorf("child's nice value: got %d, want -7", got)
	}
	// The spawning thread is back at the process's nice value: the next
	// child, started without one, gets the parent's.
	plain := exec.Command("sleep", "30")
	if err := Start(plain); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Process.Kill(); _ = plain.Wait() })
	if got := niceOf(t, plain.Process.Pid); got != own {
		t.Errorf("next child's nice value: got %d, want the parent's %d", got, own)
	}
}

func TestStartNiceWithoutThePrivilegeStartsAtTheParents(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root may raise any priority")
	}
	cmd := exec.Command("sleep", "30")
	if err := StartNice(cmd, -7); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if got, want := niceOf(t, cmd.Process.Pid), niceOf(t, os.Getpid()); got != want {
		t.Errorf("child's nice value: got %d, want the parent's %d", got, want)
	}
}
