package site

import (
	"io"
	"os"
	"testing"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// TestMain quiets the global loggers: each site logs to its own file
// (Options.Logger), which a failing test names.
func TestMain(m *testing.M) {
	quiet := ctrlzap.New(ctrlzap.WriteTo(io.Discard))
	ctrl.SetLogger(quiet)
	klog.SetLogger(quiet)
	os.Exit(m.Run())
}
