// Package pki issues the certificates that the tests and the demo use for
// etcd peer and client TLS and for the sidecar's mutual TLS: one throw-away
// CA per run, with leaf certificates that serve and authenticate.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a self-signed certificate authority held in memory.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

// Bundle names the PEM files of one issued certificate and its CA.
type Bundle struct {
	CAFile   string
	CertFile string
	KeyFile  string
}

// Pair is one issued certificate and key in PEM.
type Pair struct {
	CertPEM []byte
	KeyPEM  []byte
}

// NewCA creates a CA valid for a day, long enough for any test or demo run.
func NewCA(commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// CertPEM is the CA certificate in PEM.
func (ca *CA) CertPEM() []byte { return ca.certPEM }

// Pool is a certificate pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Issue signs a leaf certificate usable both as server and as client
// certificate, valid for the given DNS names and IP addresses, from an
// hour ago for a day.
func (ca *CA) Issue(commonName string, hosts ...string) (Pair, error) {
	return ca.IssueValid(time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour), commonName, hosts...)
}

// Certificate is p as a tls.Certificate, for a server's or a client's
// tls.Config.
func (p Pair) Certificate() (tls.Certificate, error) {
	return tls.X509KeyPair(p.CertPEM, p.KeyPEM)
}

// IssueValid is Issue valid from notBefore to notAfter (a certificate
// that expired, for tests of what refuses it).
func (ca *CA) IssueValid(notBefore, notAfter time.Time, commonName string, hosts ...string) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// IssueFiles issues a leaf certificate and writes it, its key and the CA
// certificate as name.crt, name.key and ca.crt into dir.
func (ca *CA) IssueFiles(dir, name string, hosts ...string) (Bundle, error) {
	pair, err := ca.Issue(name, hosts...)
	if err != nil {
		return Bundle{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Bundle{}, err
	}
	b := Bundle{
		CAFile:   filepath.Join(dir, "ca.crt"),
		CertFile: filepath.Join(dir, name+".crt"),
		KeyFile:  filepath.Join(dir, name+".key"),
	}
	for path, data := range map[string][]byte{b.CAFile: ca.certPEM, b.CertFile: pair.CertPEM, b.KeyFile: pair.KeyPEM} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return Bundle{}, fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return b, nil
}

// ClientConfig is a TLS client configuration that trusts this CA and
// presents the given pair (nil for none).
func (ca *CA) ClientConfig(p *Pair) (*tls.Config, error) {
	cfg := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	if p != nil {
		c, err := p.Certificate()
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}
