package cli

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

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
			srv, err := sidecar.New(sidecar.Config{
				Endpoints:            endpoints,
				EtcdTLS:              etcdTLS,
				AllowUnauthenticated: insecureHTTP,
				MinLearnerHealthy:    minLearnerHealthy,
				Logger:               log.WithName("sidecar"),
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
	return cmd
}
