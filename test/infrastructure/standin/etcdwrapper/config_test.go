package etcdwrapper

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.uber.org/zap/zaptest"
)

func TestParseFlagsDefaults(t *testing.T) {
	g := NewWithT(t)
	c, _, err := ParseFlags(nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c).To(Equal(Config{
		BackupRestore:  BackupRestoreConfig{HostPort: ":8080"},
		EtcdClientPort: 2379,
		WrapperPort:    9095,
	}))
}

// The argument lists are the ones etcd-druid v0.38.1 writes into the etcd
// container of its StatefulSet.
func TestParseFlagsDruidArguments(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want Config
	}{
		{
			name: "plain",
			args: []string{"--backup-restore-host-port=etcd-main-local:8080", "--etcd-server-name=etcd-main-local", "--backup-restore-tls-enabled=false", "--etcd-client-port=2379", "--etcd-wrapper-port=9095"},
			want: Config{
				BackupRestore:  BackupRestoreConfig{HostPort: "etcd-main-local:8080"},
				EtcdClientTLS:  EtcdClientTLSConfig{ServerName: "etcd-main-local"},
				EtcdClientPort: 2379,
				WrapperPort:    9095,
			},
		},
		{
			name: "TLS everywhere, other ports",
			args: []string{
				"--backup-restore-host-port=etcd-main-local:8081", "--etcd-server-name=etcd-main-local",
				"--backup-restore-tls-enabled=true", "--backup-restore-ca-cert-bundle-path=/var/etcdbr/ssl/ca/bundle.crt",
				"--etcd-client-cert-path=/var/etcd/ssl/client/tls.crt", "--etcd-client-key-path=/var/etcd/ssl/client/tls.key",
				"--etcd-client-port=2479", "--etcd-wrapper-port=9096",
			},
			want: Config{
				BackupRestore:  BackupRestoreConfig{HostPort: "etcd-main-local:8081", TLSEnabled: true, CACertBundlePath: "/var/etcdbr/ssl/ca/bundle.crt"},
				EtcdClientTLS:  EtcdClientTLSConfig{ServerName: "etcd-main-local", CertPath: "/var/etcd/ssl/client/tls.crt", KeyPath: "/var/etcd/ssl/client/tls.key"},
				EtcdClientPort: 2479,
				WrapperPort:    9096,
			},
		},
		{
			name: "ready timeout",
			args: []string{"--etcd-ready-timeout=90s"},
			want: Config{BackupRestore: BackupRestoreConfig{HostPort: ":8080"}, EtcdClientPort: 2379, WrapperPort: 9095, EtcdReadyTimeout: 90 * time.Second},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			c, _, err := ParseFlags(tt.args)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c).To(Equal(tt.want))
		})
	}
}

func TestParseFlagsRejects(t *testing.T) {
	for _, args := range [][]string{
		{"--no-such-flag=1"},
		{"--etcd-wrapper-port=http"},
		{"--backup-restore-tls-enabled=maybe"},
	} {
		_, _, err := ParseFlags(args)
		NewWithT(t).Expect(err).To(HaveOccurred(), "args %q", args)
	}
}

func TestMainExitCodesBeforeRun(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"no command", nil, 1},
		{"unknown command", []string{"start"}, 1},
		{"bad flag", []string{Command, "--no-such-flag"}, 2},
		{"help", []string{Command, "--help"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(Main(tt.args)).To(Equal(tt.want))
		})
	}
}

func TestBackupRestoreConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		c       BackupRestoreConfig
		wantErr string
	}{
		{name: "druid's", c: BackupRestoreConfig{HostPort: "etcd-main-local:8080"}},
		{name: "default", c: BackupRestoreConfig{HostPort: ":8080"}},
		{name: "TLS with bundle", c: BackupRestoreConfig{HostPort: "h:1", TLSEnabled: true, CACertBundlePath: "/ca"}},
		{name: "no port", c: BackupRestoreConfig{HostPort: "etcd-main-local"}, wantErr: "<host>:<port>"},
		{name: "scheme", c: BackupRestoreConfig{HostPort: "http://h:8080"}, wantErr: "scheme"},
		{name: "TLS without bundle", c: BackupRestoreConfig{HostPort: "h:1", TLSEnabled: true}, wantErr: "ca-cert-bundle-path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			err := tt.c.Validate()
			if tt.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(MatchError(ContainSubstring(tt.wantErr)))
		})
	}
}

func TestBackupRestoreAddress(t *testing.T) {
	g := NewWithT(t)
	g.Expect(BackupRestoreConfig{HostPort: "etcd-main-local:8080"}.baseURL()).To(Equal("http://etcd-main-local:8080"))
	g.Expect(BackupRestoreConfig{HostPort: "etcd-main-local:8080", TLSEnabled: true}.baseURL()).To(Equal("https://etcd-main-local:8080"))
	g.Expect(BackupRestoreConfig{HostPort: "etcd-main-local:8080"}.host()).To(Equal("etcd-main-local"))
	g.Expect(BackupRestoreConfig{HostPort: ":8080"}.host()).To(Equal("localhost"))
}

func TestOnSignals(t *testing.T) {
	g := NewWithT(t)
	exitCodeFile := filepath.Join(t.TempDir(), "exit_code")
	sigs := make(chan os.Signal, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		onSignals(sigs, exitCodeFile, cancel, func() { close(exited) }, zaptest.NewLogger(t))
	}()

	sigs <- syscall.SIGTERM
	g.Eventually(ctx.Done()).Should(BeClosed())
	g.Expect(os.ReadFile(exitCodeFile)).To(BeEquivalentTo("terminated"))
	g.Expect(exited).NotTo(BeClosed())

	sigs <- os.Interrupt
	g.Eventually(exited).Should(BeClosed())
	g.Eventually(done).Should(BeClosed())
}

func TestOnSignalsEndsWhenChannelCloses(t *testing.T) {
	sigs := make(chan os.Signal)
	exitCodeFile := filepath.Join(t.TempDir(), "exit_code")
	done := make(chan struct{})
	go func() {
		defer close(done)
		onSignals(sigs, exitCodeFile, func() {}, func() {}, zaptest.NewLogger(t))
	}()
	close(sigs)
	NewWithT(t).Eventually(done).Should(BeClosed())
}
