package etcdwrapper

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Command is the only command etcd-wrapper knows.
const Command = "start-etcd"

// Config is what the start-etcd flags set.
type Config struct {
	// BackupRestore says how to reach the etcd-backup-restore sidecar.
	BackupRestore BackupRestoreConfig
	// EtcdClientTLS configures the readiness check's etcd client when etcd's
	// client URL uses TLS.
	EtcdClientTLS EtcdClientTLSConfig
	// EtcdClientPort is the port the readiness check dials etcd on.
	EtcdClientPort int
	// WrapperPort is the port of the wrapper's own HTTP(S) server.
	WrapperPort int
	// EtcdReadyTimeout bounds the wait for etcd's ready notification after
	// start. Zero, the default, does not wait at all: the real wrapper hands
	// it to time.After, which fires at once, although its help says "waits
	// forever". Nothing depends on the wait's outcome either way.
	EtcdReadyTimeout time.Duration
}

// BackupRestoreConfig says how to reach etcd-backup-restore.
type BackupRestoreConfig struct {
	// HostPort is host:port without a scheme.
	HostPort string
	// TLSEnabled selects https and verification against CACertBundlePath.
	TLSEnabled bool
	// CACertBundlePath is the PEM bundle that signed backup-restore's
	// server certificate.
	CACertBundlePath string
}

// EtcdClientTLSConfig is the readiness check's etcd client identity.
type EtcdClientTLSConfig struct {
	// ServerName is the host the readiness check dials and, with TLS, the
	// name it verifies; druid passes <etcd>-local, which the Pod's hosts
	// file maps to 127.0.0.1.
	ServerName string
	// CertPath and KeyPath are the client certificate and key.
	CertPath, KeyPath string
}

// AddFlags registers the start-etcd flags with the real wrapper's names and
// defaults.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&c.WrapperPort, "etcd-wrapper-port", 9095, "Port used by etcd-wrapper to expose the server.")
	fs.BoolVar(&c.BackupRestore.TLSEnabled, "backup-restore-tls-enabled", false, "Enables TLS for communicating with the backup-restore container.")
	fs.StringVar(&c.BackupRestore.HostPort, "backup-restore-host-port", ":8080", "Host and port of the backup-restore container, <host>:<port> without a scheme.")
	fs.StringVar(&c.BackupRestore.CACertBundlePath, "backup-restore-ca-cert-bundle-path", "", "CA bundle that verifies backup-restore's server certificate when TLS is enabled.")
	fs.StringVar(&c.EtcdClientTLS.ServerName, "etcd-server-name", "", "Host name of the etcd server for the readiness check's client (and its TLS server name).")
	fs.IntVar(&c.EtcdClientPort, "etcd-client-port", 2379, "Client port when talking to etcd.")
	fs.StringVar(&c.EtcdClientTLS.CertPath, "etcd-client-cert-path", "", "Client certificate for etcd when etcd's client URL uses TLS.")
	fs.StringVar(&c.EtcdClientTLS.KeyPath, "etcd-client-key-path", "", "Client key for etcd when etcd's client URL uses TLS.")
	fs.DurationVar(&c.EtcdReadyTimeout, "etcd-ready-timeout", 0, "Time to wait for etcd to be ready after start.")
}

// ParseFlags parses the flags that follow the start-etcd command.
func ParseFlags(args []string) (Config, *pflag.FlagSet, error) {
	var c Config
	fs := pflag.NewFlagSet(Command, pflag.ContinueOnError)
	c.AddFlags(fs)
	err := fs.Parse(args)
	return c, fs, err
}

// Validate checks the backup-restore settings as the real wrapper does
// before it contacts backup-restore.
func (c BackupRestoreConfig) Validate() error {
	var err error
	if len(strings.Split(c.HostPort, ":")) < 2 {
		err = errors.Join(err, fmt.Errorf("backup-restore-host-port %q: both host and port must be given as <host>:<port>", c.HostPort))
	}
	if strings.HasPrefix(c.HostPort, "http:") || strings.HasPrefix(c.HostPort, "https:") {
		err = errors.Join(err, fmt.Errorf("backup-restore-host-port %q must not contain a scheme", c.HostPort))
	}
	if c.TLSEnabled && strings.TrimSpace(c.CACertBundlePath) == "" {
		err = errors.Join(err, errors.New("backup-restore-ca-cert-bundle-path must be set when backup-restore TLS is enabled"))
	}
	return err
}

// baseURL is backup-restore's address with the scheme TLSEnabled selects.
func (c BackupRestoreConfig) baseURL() string {
	if c.TLSEnabled {
		return "https://" + c.HostPort
	}
	return "http://" + c.HostPort
}

// host is the TLS server name for backup-restore: the part of HostPort
// before the first colon, or localhost when that is empty (":8080").
func (c BackupRestoreConfig) host() string {
	if h, _, _ := strings.Cut(c.HostPort, ":"); strings.TrimSpace(h) != "" {
		return h
	}
	return "localhost"
}
