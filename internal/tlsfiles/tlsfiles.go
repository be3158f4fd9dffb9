// Package tlsfiles serves TLS from certificate files that a Kubernetes
// Secret volume renews in place: the pod's certificate, key and CA bundle
// are watched, and each new handshake uses what the files hold then. A
// shoot's etcd certificates and CA are renewed by gardenlet (the CA
// rotation of a shoot goes through a bundle of the old and the new CA), and
// the processes beside etcd must follow without a restart, which would cost
// the clients of the member their connections.
//
// The watching is kube-apiserver's own (k8s.io/apiserver's
// dynamiccertificates): fsnotify on the files, re-added after the
// kubelet's atomic swap of the volume's directory, a recheck every minute,
// and a certificate and key that do not match (one file renewed before the
// other) kept from serving until both are.
package tlsfiles

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// Server is a TLS server configuration that serves the certificate in
// certFile and keyFile and, when clientCAFile is set, verifies client
// certificates against the CA bundle in it with clientAuth (a
// tls.ClientAuthType that verifies: tls.VerifyClientCertIfGiven or
// tls.RequireAndVerifyClientCert). nextProtos are offered in ALPN.
//
// The files are read now, and an error names the file that is missing or
// does not hold what it should. Afterwards they are watched until ctx ends:
// a renewed certificate or CA bundle applies from the next handshake on;
// connections already open keep theirs. A renewal that cannot be read
// (a half-written file, a certificate that does not match its key) keeps
// the last good configuration.
func Server(ctx context.Context, certFile, keyFile, clientCAFile string, clientAuth tls.ClientAuthType, nextProtos ...string) (*tls.Config, error) {
	serving, err := dynamiccertificates.NewDynamicServingContentFromFiles("serving-certificate", certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the server certificate %s and key %s: %w", certFile, keyFile, err)
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: nextProtos}
	var (
		clientCA   dynamiccertificates.CAContentProvider
		caContents *dynamiccertificates.DynamicFileCAContent
	)
	if clientCAFile != "" {
		if clientAuth != tls.VerifyClientCertIfGiven && clientAuth != tls.RequireAndVerifyClientCert {
			return nil, fmt.Errorf("client CA %s given without a client authentication that verifies (%v)", clientCAFile, clientAuth)
		}
		if caContents, err = dynamiccertificates.NewDynamicCAContentFromFile("client-ca", clientCAFile); err != nil {
			return nil, fmt.Errorf("loading the client CA bundle %s: %w", clientCAFile, err)
		}
		clientCA = caContents
		base.ClientAuth = clientAuth
	}
	ctrl := dynamiccertificates.NewDynamicServingCertificateController(base, clientCA, serving, nil, nil)
	if err := ctrl.RunOnce(); err != nil {
		return nil, fmt.Errorf("the TLS configuration from %s, %s and %q: %w", certFile, keyFile, clientCAFile, err)
	}
	serving.AddListener(ctrl)
	go serving.Run(ctx, 1)
	if caContents != nil {
		caContents.AddListener(ctrl)
		go caContents.Run(ctx, 1)
	}
	go ctrl.Run(1, ctx.Done())
	// GetConfigForClient decides every handshake; the fields beside it
	// are what a caller that inspects the configuration (http.Server's
	// HTTP/2 set-up) reads.
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: nextProtos, ClientAuth: base.ClientAuth, GetConfigForClient: ctrl.GetConfigForClient}, nil
}

// Client is a TLS client configuration that presents the certificate in
// certFile and keyFile (none when both are empty) and verifies the server
// against the CA bundle in caFile (the system's roots when empty), as
// Server serves: the files are read now, an error names the one that is
// missing or wrong, and afterwards they are watched until ctx ends, so that
// each new connection uses what the files hold then. A shoot's CA rotation
// renews etcd's server certificate and the clients' certificates under a
// bundle of the old and the new CA; a client that read its files once
// would fail its next connection once the old CA leaves the bundle.
func Client(ctx context.Context, caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("the client certificate %q and key %q must be given together", certFile, keyFile)
	}
	if certFile != "" {
		pair, err := dynamiccertificates.NewDynamicServingContentFromFiles("client-certificate", certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("loading the client certificate %s and key %s: %w", certFile, keyFile, err)
		}
		go pair.Run(ctx, 1)
		var (
			mu     sync.Mutex
			cached []byte
			cert   *tls.Certificate
		)
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			certPEM, keyPEM := pair.CurrentCertKeyContent()
			mu.Lock()
			defer mu.Unlock()
			if cert == nil || !bytes.Equal(cached, certPEM) {
				c, err := tls.X509KeyPair(certPEM, keyPEM)
				if err != nil {
					return nil, fmt.Errorf("the client certificate %s: %w", certFile, err)
				}
				cached, cert = certPEM, &c
			}
			return cert, nil
		}
	}
	if caFile != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("server-ca", caFile)
		if err != nil {
			return nil, fmt.Errorf("loading the CA bundle %s: %w", caFile, err)
		}
		go ca.Run(ctx, 1)
		// Go verifies a server against a fixed pool; the pool of the
		// moment is checked here instead, with what Go would check.
		cfg.InsecureSkipVerify = true //nolint:gosec // VerifyConnection verifies the server
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			opts, ok := ca.VerifyOptions()
			if !ok {
				return fmt.Errorf("no CA in %s to verify the server with", caFile)
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the server sent no certificate")
			}
			opts.DNSName = cs.ServerName
			opts.Intermediates = x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			opts.KeyUsages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		}
	}
	return cfg, nil
}
