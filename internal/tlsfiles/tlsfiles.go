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
	"context"
	"crypto/tls"
	"fmt"

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
