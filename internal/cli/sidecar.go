package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/druid-stretch/druid-stretch/api/v1alpha1"
	"github.com/druid-stretch/druid-stretch/api/v1alpha1/peerurls"
	"github.com/druid-stretch/druid-stretch/internal/clientgate"
	"github.com/druid-stretch/druid-stretch/internal/etcdconfig"
	"github.com/druid-stretch/druid-stretch/internal/tlsfiles"
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
		allowedClients                        v1alpha1.AllowedClients
		minLearnerHealthy                     time.Duration
		etcdConfig, admissionFile             string
		etcdMaxLearners                       int
		member                                memberFlags
		gate                                  gateFlags
	)
	cmd := &cobra.Command{
		Use:   "sidecar",
		Short: "Serve etcd membership operations over HTTPS beside one etcd member",
		Long: `Serve the membership API (GET/POST /v1/members, /v1/members/{name}/promote,
DELETE /v1/members/{name}, /v1/leader, /v1/lock, /healthz, /readyz, /metrics)
beside one etcd member. The first --endpoints entry is the local member.
Every /v1/ call needs a client certificate signed by --client-ca, and a
membership change one whose identity --allowed-client lists. Plain HTTP
(--insecure-http) is for tests on one machine only: every caller may mutate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := ctrlzap.New()
			// The certificate file watchers (tlsfiles) log through klog.
			klog.SetLogger(log.WithName("tls-files"))
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
			switch {
			case insecureTransport:
			case insecureSkipVerify:
				var err error
				if etcdTLS, err = sidecar.EtcdClientTLSConfig(caFile, certFile, keyFile, true); err != nil {
					return err
				}
			default:
				// The files are followed (tlsfiles): a shoot's CA rotation
				// renews etcd's certificates and the sidecar's own, and a
				// sidecar that read them once would lose etcd, and its
				// gate's clients, once the old CA left the bundle.
				var err error
				if etcdTLS, err = tlsfiles.Client(cmd.Context(), caFile, certFile, keyFile); err != nil {
					return fmt.Errorf("etcd client TLS (--cacert, --cert, --key): %w", err)
				}
			}
			var serverTLS *tls.Config
			switch {
			case insecureHTTP && (serverCert != "" || serverKey != "" || clientCA != "" || len(allowedClients) > 0):
				return errors.New("--insecure-http contradicts --server-cert/--server-key/--client-ca/--allowed-client")
			case !insecureHTTP:
				if serverCert == "" || serverKey == "" || clientCA == "" {
					return errors.New("--server-cert, --server-key and --client-ca are required (--insecure-http is for tests on one machine only)")
				}
				if len(allowedClients) == 0 {
					return errors.New("--allowed-client is required: name the client certificate identities (common name or SAN) that may change membership")
				}
				var err error
				if serverTLS, err = sidecar.ServerTLSConfig(cmd.Context(), serverCert, serverKey, clientCA); err != nil {
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
				listen, err := gate.listenURL()
				if err != nil {
					return err
				}
				// With a gate, etcd serves its clients on the gate's
				// backend and the gate on the advertised client port.
				joining = &sidecar.Joining{EtcdConfigFile: etcdConfig, Member: member.member(), AdditionalPeerURLs: extra,
					AdmissionFile: admissionFile, ListenClientURLs: listen, MaxLearners: etcdMaxLearners}
			}
			g, stopGate, err := gate.start(etcdTLS, log.WithName("client-gate"))
			if err != nil {
				return err
			}
			var stopOnce sync.Once
			defer stopOnce.Do(stopGate)
			srv, err := sidecar.New(sidecar.Config{
				ClientGate:                   g,
				Endpoints:                    endpoints,
				EtcdTLS:                      etcdTLS,
				InsecureAllowUnauthenticated: insecureHTTP,
				AllowedClients:               allowedClients,
				MinLearnerHealthy:            minLearnerHealthy,
				Logger:                       log.WithName("sidecar"),
				Joining:                      joining,
			})
			if err != nil {
				return err
			}
			defer func() { _ = srv.Close() }()
			l, err := net.Listen("tcp", listenAddress)
			if err != nil {
				return fmt.Errorf("listening on %s: %w", listenAddress, err)
			}
			log.Info("sidecar serving", "address", l.Addr().String(), "tls", serverTLS != nil, "endpoints", endpoints)
			// The pod ends (SIGTERM; etcd's own SIGTERM comes after its
			// preStop sleep): at once, while the API server shuts down, a
			// leading member hands leadership over with every gate held,
			// and the gate sends its own clients away.
			serving, stopServing := context.WithCancel(cmd.Context())
			defer stopServing()
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				<-serving.Done()
				if cmd.Context().Err() == nil {
					return // Serve failed; no SIGTERM
				}
				var handoff sync.WaitGroup
				handoff.Add(1)
				go func() {
					defer handoff.Done()
					ctx, cancel := context.WithTimeout(context.Background(), clientgate.StopDrainTimeout)
					defer cancel()
					if _, err := srv.HandOffLeadership(ctx); err != nil {
						log.Info("handing leadership over before etcd stops failed; etcd hands it over by itself", "error", err.Error())
					}
				}()
				stopOnce.Do(stopGate)
				handoff.Wait()
			}()
			err = srv.Serve(serving, l, serverTLS)
			stopServing()
			<-ended
			return err
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
	// The webhook admits exactly the identities this flag parses
	// (v1alpha1.ParseAllowedClients).
	f.Var(&allowedClients, "allowed-client", "a client certificate identity (common name, DNS/URI/email SAN) allowed to change membership; repeat or comma-separate")
	f.BoolVar(&insecureHTTP, "insecure-http", false, "INSECURE, for tests on one machine only: serve plain HTTP and accept every call without a client certificate")
	f.DurationVar(&minLearnerHealthy, "min-learner-healthy", 5*time.Second, "how long etcd's strict reconfiguration check needs a member connected to this member's raft transport (or healthy) before it counts it for a removal; a promotion waits for it only when the removal sent with it (thenRemove) needs the new voter counted")
	f.StringVar(&etcdConfig, "etcd-config", "", "druid's etcd.conf.yaml: also serve etcd-wrapper's /initialization and /config for the local member, which starts once druid-stretch admits it")
	f.StringVar(&admissionFile, "admission-file", "", "where the admission is kept (default: beside etcd's data directory)")
	f.IntVar(&etcdMaxLearners, "etcd-max-learners", 0, "with --etcd-config: etcd's max-learners in the configuration served to etcd-wrapper (0 keeps etcd's default, 1)")
	member.add(f)
	gate.add(f)
	return cmd
}

// memberFlags name the pod's own member, for the commands that stand in for
// backup-restore's configuration of it.
type memberFlags struct {
	name                 string
	peerURLs, clientURLs []string
	additional           peerURLEntries
}

func (m *memberFlags) add(f *pflag.FlagSet) {
	f.StringVar(&m.name, "member-name", "", "the local etcd member's name (druid: [<memberNamePrefix>-]<pod>)")
	f.StringSliceVar(&m.peerURLs, "member-peer-urls", nil, "its peer URLs, used when druid's etcd.conf.yaml has no entry for it")
	f.StringSliceVar(&m.clientURLs, "member-client-urls", nil, "its client URLs, likewise")
	f.Var(&m.additional, "additional-peer-urls", "spec.etcd.additionalAdvertisePeerURLs as member=url entries; the local member's are advertised after druid's")
}

func (m *memberFlags) member() etcdconfig.Member {
	return etcdconfig.Member{Name: m.name, PeerURLs: m.peerURLs, ClientURLs: m.clientURLs}
}

// additionalPeerURLs are the local member's entries of --additional-peer-urls.
func (m *memberFlags) additionalPeerURLs() ([]string, error) {
	var out []string
	for _, entry := range m.additional {
		name, url, err := peerurls.ParseFlagEntry(entry)
		if err != nil {
			return nil, fmt.Errorf("--additional-peer-urls: %w", err)
		}
		if name == m.name {
			out = append(out, url)
		}
	}
	return out, nil
}

// peerURLEntries is --additional-peer-urls: the comma-separated member=url
// entries of every occurrence, each read with peerurls.ParseFlagEntry, the
// function the webhooks judge the URLs they render into the flag with.
type peerURLEntries []string

func (p *peerURLEntries) Set(list string) error {
	for _, entry := range strings.Split(list, ",") {
		if _, _, err := peerurls.ParseFlagEntry(entry); err != nil {
			return err
		}
		*p = append(*p, entry)
	}
	return nil
}

func (p *peerURLEntries) String() string { return strings.Join(*p, ",") }

func (p *peerURLEntries) Type() string { return "member=url entries" }

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
			_, _ = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s for member %s\n", output, m.Name)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&etcdConfig, "etcd-config", etcdconfig.DefaultPath, "druid's etcd.conf.yaml")
	f.StringVar(&output, "output", "", "the file to write")
	member.add(f)
	return cmd
}

// gateFlags configure the client gate in front of the local member's
// client port.
type gateFlags struct {
	address, backend, cert, key, clientCA string
}

func (g *gateFlags) add(f *pflag.FlagSet) {
	f.StringVar(&g.address, "client-gate-address", "", "serve etcd's clients here, through a gate the sidecar drains before the member's removal and holds during a leader transfer (etcd then listens on --client-gate-backend)")
	f.StringVar(&g.backend, "client-gate-backend", "", "the local member's own client URL behind the gate, on loopback (for example http://127.0.0.1:12379)")
	f.StringVar(&g.cert, "client-gate-cert", "", "the gate's serving certificate toward etcd's clients (etcd's own server certificate); without it the gate serves plain HTTP")
	f.StringVar(&g.key, "client-gate-key", "", "the key of --client-gate-cert")
	f.StringVar(&g.clientCA, "client-gate-client-ca", "", "with --client-gate-cert: require client certificates of this CA bundle, as etcd's client-cert-auth with its trusted-ca-file does (etcd's CA); the files are watched and renewals apply without a restart")
}

// listenURL is where etcd serves its clients behind the gate: the
// backend's scheme and port on 127.0.0.1. etcd listens on IP addresses
// only, while the backend may name the member by a name its server
// certificate carries (druid's <etcd>-local host alias of 127.0.0.1).
func (g *gateFlags) listenURL() (string, error) {
	if g.backend == "" {
		return "", nil
	}
	u, err := url.Parse(g.backend)
	if err != nil {
		return "", fmt.Errorf("--client-gate-backend %q: %w", g.backend, err)
	}
	if u.Port() == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("--client-gate-backend %q: want http:// or https:// with a port", g.backend)
	}
	return u.Scheme + "://" + net.JoinHostPort("127.0.0.1", u.Port()), nil
}

// start runs the gate when --client-gate-address is set; stop sends its
// clients away and closes it. The gate listens only while its member
// serves (clientgate.Gate.ListenAndServe).
func (g *gateFlags) start(backendTLS *tls.Config, log logr.Logger) (*clientgate.Gate, func(), error) {
	if g.address == "" {
		if g.backend != "" || g.cert != "" || g.key != "" || g.clientCA != "" {
			return nil, nil, errors.New("--client-gate-backend, --client-gate-cert, --client-gate-key and --client-gate-client-ca need --client-gate-address")
		}
		return nil, func() {}, nil
	}
	if g.backend == "" {
		return nil, nil, errors.New("--client-gate-address needs --client-gate-backend, the member's own client URL")
	}
	backend, err := url.Parse(g.backend)
	if err != nil {
		return nil, nil, fmt.Errorf("--client-gate-backend %q: %w", g.backend, err)
	}
	if (backend.Scheme == "https") != (backendTLS != nil) {
		return nil, nil, fmt.Errorf("--client-gate-backend %q: its scheme must be https exactly when the sidecar reaches etcd over TLS (--cacert, --cert, --key)", g.backend)
	}
	// The serving files are watched for as long as the gate runs.
	files, stopFiles := context.WithCancel(context.Background())
	var serverTLS *tls.Config
	switch {
	case g.cert != "" || g.key != "":
		if serverTLS, err = tlsfiles.Server(files, g.cert, g.key, g.clientCA, tls.RequireAndVerifyClientCert, "h2", "http/1.1"); err != nil {
			stopFiles()
			return nil, nil, fmt.Errorf("the client gate's TLS (--client-gate-cert, --client-gate-key, --client-gate-client-ca): %w", err)
		}
	case g.clientCA != "":
		stopFiles()
		return nil, nil, errors.New("--client-gate-client-ca needs --client-gate-cert and --client-gate-key")
	}
	gate, err := clientgate.New(clientgate.Options{Backend: backend, ServerTLS: serverTLS, BackendTLS: backendTLS, Log: log})
	if err != nil {
		stopFiles()
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := gate.ListenAndServe(g.address); err != nil {
			log.Error(err, "client gate")
		}
	}()
	return gate, func() {
		// The pod ends (SIGTERM): its clients go to other members with
		// their calls answered, as at a drain, instead of losing them.
		ctx, cancel := context.WithTimeout(context.Background(), clientgate.StopDrainTimeout)
		defer cancel()
		if err := gate.Drain(ctx); err != nil {
			log.Info("sending the clients away at the end", "error", err.Error())
		}
		_ = gate.Close()
		<-done
		stopFiles()
	}, nil
}

// ParseArgs parses a container's args for the druid-stretch binary (a
// subcommand and its flags) with that command's own flags, as the binary
// does at its start, and runs nothing. The webhook's tests check with it
// that every pod template the webhook admits starts its containers.
func ParseArgs(args []string) error {
	cmd, rest, err := newRootCommand().Find(args)
	if err != nil {
		return err
	}
	return cmd.ParseFlags(rest)
}
