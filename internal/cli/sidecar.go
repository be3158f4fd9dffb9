package cli

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/druid-stretch/druid-stretch/internal/etcdconfig"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// newSidecarCommand runs the membership sidecar beside one etcd member. Its
// etcd flags are etcd-backup-restore's, so operators feel at home.
func newSidecarCommand() *cobra.Command {
	var (
		endpoints                             []string
		caFile, certFile, keyFile             string
		insecureTransport, insecureSkipVerify bool
		serverCert, serverKey, clientCA       string
		listenAddress                         string
		insecureHTTP                          bool
		minLearnerHealthy                     time.Duration
		etcdConfig, admissionFile             string
		member                                memberFlags
	)
	cmd := &cobra.Command{
		Use:   "sidecar",
		Short: "Serve etcd membership operations over HTTPS beside one etcd member",
		Long: `Serve the membership API (GET/POST /v1/members, /v1/members/{name}/promote,
DELETE /v1/members/{name}, /v1/leader, /v1/lock, /healthz, /readyz, /metrics)
beside one etcd member. The first --endpoints entry is the local member.
Mutating calls need a client certificate signed by --client-ca; plain HTTP
(--insecure-http) is for a local machine only and lets every caller mutate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := ctrlzap.New()
			// backup-restore's default is insecure transport; given TLS
			// files mean TLS unless the operator insists otherwise.
			tlsFiles := caFile != "" || certFile != "" || keyFile != ""
			if tlsFiles && !cmd.Flags().Changed("insecure-transport") {
				insecureTransport = false
			}
			if tlsFiles && insecureTransport {
				return errors.New("--insecure-transport=true contradicts --cacert/--cert/--key")
			}
			var etcdTLS *tls.Config
			if !insecureTransport {
				var err error
				if etcdTLS, err = sidecar.EtcdClientTLSConfig(caFile, certFile, keyFile, insecureSkipVerify); err != nil {
					return err
				}
			}
			var serverTLS *tls.Config
			switch {
			case insecureHTTP && (serverCert != "" || serverKey != "" || clientCA != ""):
				return errors.New("--insecure-http contradicts --server-cert/--server-key/--client-ca")
			case !insecureHTTP:
				if serverCert == "" || serverKey == "" || clientCA == "" {
					return errors.New("--server-cert, --server-key and --client-ca are required (or --insecure-http for local use)")
				}
				var err error
				if serverTLS, err = sidecar.ServerTLSConfig(serverCert, serverKey, clientCA); err != nil {
					return err
				}
			}
			var joining *sidecar.Joining
			if etcdConfig != "" {
				if member.name == "" {
					return errors.New("--etcd-config needs --member-name")
				}
				extra, err := member.additionalPeerURLs()
				if err != nil {
					return err
				}
				joining = &sidecar.Joining{EtcdConfigFile: etcdConfig, Member: member.member(), AdditionalPeerURLs: extra, AdmissionFile: admissionFile}
			}
			srv, err := sidecar.New(sidecar.Config{
				Endpoints:            endpoints,
				EtcdTLS:              etcdTLS,
				AllowUnauthenticated: insecureHTTP,
				MinLearnerHealthy:    minLearnerHealthy,
				Logger:               log.WithName("sidecar"),
				Joining:              joining,
			})
			if err != nil {
				return err
			}
			defer srv.Close()
			l, err := net.Listen("tcp", listenAddress)
			if err != nil {
				return fmt.Errorf("listening on %s: %w", listenAddress, err)
			}
			log.Info("sidecar serving", "address", l.Addr().String(), "tls", serverTLS != nil, "endpoints", endpoints)
			return srv.Serve(cmd.Context(), l, serverTLS)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&endpoints, "endpoints", []string{"http://127.0.0.1:2379"}, "etcd client URLs; the first is the local member, later ones are used while it is a learner")
	f.StringVar(&caFile, "cacert", "", "CA bundle verifying etcd's server certificate")
	f.StringVar(&certFile, "cert", "", "client certificate for etcd")
	f.StringVar(&keyFile, "key", "", "client key for etcd")
	f.BoolVar(&insecureTransport, "insecure-transport", true, "talk to etcd without TLS (turned off by --cacert/--cert/--key)")
	f.BoolVar(&insecureSkipVerify, "insecure-skip-tls-verify", false, "do not verify etcd's server certificate")
	f.StringVar(&serverCert, "server-cert", "", "the sidecar's HTTPS certificate")
	f.StringVar(&serverKey, "server-key", "", "the sidecar's HTTPS key")
	f.StringVar(&clientCA, "client-ca", "", "CA that signs the client certificates allowed to change membership")
	f.StringVar(&listenAddress, "listen-address", ":8080", "address the sidecar serves on")
	f.BoolVar(&insecureHTTP, "insecure-http", false, "serve plain HTTP and accept mutating calls without a client certificate (local use only)")
	f.DurationVar(&minLearnerHealthy, "min-learner-healthy", 5*time.Second, "how long a learner must be healthy without interruption before it is promoted")
	f.StringVar(&etcdConfig, "etcd-config", "", "druid's etcd.conf.yaml: also serve etcd-wrapper's /initialization and /config for the local member, which starts once druid-stretch admits it")
	f.StringVar(&admissionFile, "admission-file", "", "where the admission is kept (default: beside etcd's data directory)")
	member.add(f)
	return cmd
}

// memberFlags name the pod's own member, for the commands that stand in for
// backup-restore's configuration of it.
type memberFlags struct {
	name                 string
	peerURLs, clientURLs []string
	additional           []string
}

func (m *memberFlags) add(f *pflag.FlagSet) {
	f.StringVar(&m.name, "member-name", "", "the local etcd member's name (druid: [<memberNamePrefix>-]<pod>)")
	f.StringSliceVar(&m.peerURLs, "member-peer-urls", nil, "its peer URLs, used when druid's etcd.conf.yaml has no entry for it")
	f.StringSliceVar(&m.clientURLs, "member-client-urls", nil, "its client URLs, likewise")
	f.StringSliceVar(&m.additional, "additional-peer-urls", nil, "spec.etcd.additionalAdvertisePeerURLs as member=url entries; the local member's are advertised after druid's")
}

func (m *memberFlags) member() etcdconfig.Member {
	return etcdconfig.Member{Name: m.name, PeerURLs: m.peerURLs, ClientURLs: m.clientURLs}
}

// additionalPeerURLs are the local member's entries of --additional-peer-urls.
func (m *memberFlags) additionalPeerURLs() ([]string, error) {
	var out []string
	for _, entry := range m.additional {
		name, url, ok := strings.Cut(entry, "=")
		if !ok || name == "" || url == "" {
			return nil, fmt.Errorf("--additional-peer-urls entry %q is not member=url", entry)
		}
		if name == m.name {
			out = append(out, url)
		}
	}
	return out, nil
}

// newBackupRestoreConfigCommand writes the etcd configuration file that
// backup-restore reads in a pod of an Etcd druid-stretch manages (the
// webhook runs it as an init container and points backup-restore's
// ETCD_CONF at the result): druid's, with the member's own entries and an
// initial cluster of that member alone, so that backup-restore takes no
// membership action of its own.
func newBackupRestoreConfigCommand() *cobra.Command {
	var (
		etcdConfig, output string
		member             memberFlags
	)
	cmd := &cobra.Command{
		Use:   "backup-restore-config",
		Short: "Write backup-restore's etcd configuration for a member that druid-stretch manages",
		Long: `Read druid's etcd.conf.yaml and write the one etcd-backup-restore reads
(ETCD_CONF) in a pod of an Etcd that druid-stretch manages: the member's own
advertise entries (druid's file has none for a pod outside ordinals
0..replicas-1) and an initial cluster of the member alone. backup-restore
then takes no membership action (no learner add, no promotion, no
remove-and-re-add): druid-stretch's controller is the only one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if member.name == "" || output == "" {
				return errors.New("--member-name and --output are required")
			}
			f, err := etcdconfig.Load(etcdConfig)
			if err != nil {
				return err
			}
			extra, err := member.additionalPeerURLs()
			if err != nil {
				return err
			}
			m, err := f.Resolve(member.member(), extra...)
			if err != nil {
				return err
			}
			b, err := f.ForBackupRestore(m)
			if err != nil {
				return err
			}
			if err := etcdconfig.WriteFile(output, b); err != nil {
				return fmt.Errorf("writing %s: %w", output, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s for member %s\n", output, m.Name)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&etcdConfig, "etcd-config", etcdconfig.DefaultPath, "druid's etcd.conf.yaml")
	f.StringVar(&output, "output", "", "the file to write")
	member.add(f)
	return cmd
}
