package cli

import (
	"bytes"
	"context"
	"testing"

	. "github.com/onsi/gomega"
)

// The client gate's flags are checked before anything starts, with a
// message that names the flag.
func TestSidecarClientGateFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--client-gate-backend=http://127.0.0.1:12379"}, "need --client-gate-address"},
		{[]string{"--client-gate-address=127.0.0.1:0"}, "needs --client-gate-backend"},
		{[]string{"--client-gate-address=127.0.0.1:0", "--client-gate-backend=http://127.0.0.1:12379", "--client-gate-cert=/nonexistent.crt", "--client-gate-key=/nonexistent.key"}, "the client gate's TLS (--client-gate-cert, --client-gate-key, --client-gate-client-ca): loading the server certificate /nonexistent.crt"},
		{[]string{"--client-gate-address=127.0.0.1:0", "--client-gate-backend=http://127.0.0.1:12379", "--client-gate-client-ca=/etc/ca.crt"}, "--client-gate-client-ca needs --client-gate-cert and --client-gate-key"},
		{[]string{"--client-gate-address=127.0.0.1:0", "--client-gate-backend=https://etcd-main-local:12379"}, "its scheme must be https exactly when the sidecar reaches etcd over TLS"},
		{[]string{"--client-gate-address=127.0.0.1:0", "--client-gate-backend=ftp://127.0.0.1:12379"}, "the scheme must be http or https"},
	} {
		g := NewWithT(t)
		cmd := newRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"sidecar", "--insecure-http"}, tc.args...))
		g.Expect(cmd.ExecuteContext(context.Background())).To(MatchError(ContainSubstring(tc.want)), "%v", tc.args)
	}
}
