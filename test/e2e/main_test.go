// Package e2e moves etcd clusters live between two real kube-apiservers
// (envtest), each with its membership controller and a pod runner that runs
// real etcd members, 180 ms RTT apart through the link emulator, while a
// client workload writes and reads; it checks what the clients saw and what
// etcd holds afterwards, with and without faults.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/test/framework/demo"
)

// rtt is the distance between the two clusters in every test: two seeds
// in different regions, the distance the benchmarks measure at
// (docs/benchmarks.md).
const rtt = 180 * time.Millisecond

// env is the two clusters every test moves its own Etcd through: starting
// two kube-apiservers takes seconds, a move a minute.
var (
	env     *demo.Env
	logPath string
	// logger writes to logPath; further clusters (the fault matrix's
	// lanes) log there too.
	logger logr.Logger
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if testbin.Short() {
		fmt.Println("every test of this package runs real binaries: none runs under -short")
		return 0
	}
	dir, err := os.MkdirTemp("", "druid-stretch-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	logPath = filepath.Join(dir, "e2e.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	logger = ctrlzap.New(ctrlzap.WriteTo(logFile), ctrlzap.Level(zapcore.InfoLevel))
	ctrl.SetLogger(logger)
	klog.SetLogger(logger.WithName("client-go"))
	env, err = demo.Start(context.Background(), demo.Config{RTT: rtt, Dir: filepath.Join(dir, "run"), Logger: logger})
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the two clusters (logs in %s): %v\n", logPath, err)
		return 1
	}
	code := m.Run()
	if err := env.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the two clusters: %v\n", err)
		code = 1
	}
	_ = logFile.Close()
	if code == 0 {
		_ = os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "logs of the controllers, runners and members: %s\n", logPath)
	}
	return code
}
