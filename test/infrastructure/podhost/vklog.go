package podhost

import (
	"fmt"

	"github.com/go-logr/logr"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
)

// vkLogger sends virtual-kubelet's log (its node and pod controllers report
// failed status updates there) to the stand-in's logr logger. Debug lines
// are verbosity 1; Fatal is logged as an error and does not exit.
type vkLogger struct{ l logr.Logger }

var _ vklog.Logger = vkLogger{}

func (v vkLogger) Debug(args ...any)                        { v.l.V(1).Info(fmt.Sprint(args...)) }
func (v vkLogger) Debugf(f string, args ...any)             { v.l.V(1).Info(fmt.Sprintf(f, args...)) }
func (v vkLogger) Info(args ...any)                         { v.l.Info(fmt.Sprint(args...)) }
func (v vkLogger) Infof(f string, args ...any)              { v.l.Info(fmt.Sprintf(f, args...)) }
func (v vkLogger) Warn(args ...any)                         { v.l.Info(fmt.Sprint(args...), "level", "warning") }
func (v vkLogger) Warnf(f string, args ...any)              { v.l.Info(fmt.Sprintf(f, args...), "level", "warning") }
func (v vkLogger) Error(args ...any)                        { v.l.Error(nil, fmt.Sprint(args...)) }
func (v vkLogger) Errorf(f string, args ...any)             { v.l.Error(nil, fmt.Sprintf(f, args...)) }
func (v vkLogger) Fatal(args ...any)                        { v.Error(args...) }
func (v vkLogger) Fatalf(f string, args ...any)             { v.Errorf(f, args...) }
func (v vkLogger) WithField(k string, val any) vklog.Logger { return vkLogger{v.l.WithValues(k, val)} }
func (v vkLogger) WithError(err error) vklog.Logger         { return vkLogger{v.l.WithValues("error", err)} }

func (v vkLogger) WithFields(fs vklog.Fields) vklog.Logger {
	kv := make([]any, 0, 2*len(fs))
	for k, val := range fs {
		kv = append(kv, k, val)
	}
	return vkLogger{v.l.WithValues(kv...)}
}
