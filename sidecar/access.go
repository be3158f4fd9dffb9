package sidecar

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// ReasonForbidden: the client certificate verified, but its identity is not
// one that Config.AllowedClients lets change membership.
const ReasonForbidden = "Forbidden"

// ReasonRequestTooLarge: the request body exceeds Limits.MaxBodyBytes.
const ReasonRequestTooLarge = "RequestTooLarge"

// ReasonTooManyRequests: Limits.MaxInFlight calls are being answered already.
const ReasonTooManyRequests = "TooManyRequests"

// Limits bound what one caller can make a sidecar hold. Zero fields take
// the defaults.
type Limits struct {
	// MaxBodyBytes bounds a request body (default 64 KiB: the largest valid
	// body is a few hundred bytes). A larger one gets 413 before it is read.
	MaxBodyBytes int64
	// MaxInFlight bounds the /v1/ calls answered at once (default 32): more
	// get 429 at once instead of queueing on etcd.
	MaxInFlight int
	// ReadHeaderTimeout bounds the TLS handshake and the request headers
	// (default 5 s), so a slow-loris client holds a connection that long.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request (default 15 s).
	ReadTimeout time.Duration
	// WriteTimeout bounds a call from its headers to its answer (default
	// three etcd requests' time plus 30 s: a removal waits for its grace,
	// checks health and removes).
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection without a request
	// (default 90 s).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the request headers (default 16 KiB).
	MaxHeaderBytes int
}

func (l *Limits) setDefaults(requestTimeout time.Duration) {
	if l.MaxBodyBytes == 0 {
		l.MaxBodyBytes = maxBodyBytes
	}
	if l.MaxInFlight == 0 {
		l.MaxInFlight = 32
	}
	if l.ReadHeaderTimeout == 0 {
		l.ReadHeaderTimeout = 5 * time.Second
	}
	if l.ReadTimeout == 0 {
		l.ReadTimeout = 15 * time.Second
	}
	if l.WriteTimeout == 0 {
		l.WriteTimeout = 3*requestTimeout + 30*time.Second
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = 90 * time.Second
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = 16 << 10
	}
}

// HTTPServer is an http.Server for h with these limits' timeouts; Serve
// uses it, and so should a caller that serves the Handler itself.
func (l Limits) HTTPServer(h http.Handler) *http.Server {
	l.setDefaults(10 * time.Second)
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}

// authorize names the caller by its TLS client certificate, the only
// identity the sidecar believes (a header can be forged), and says whether
// it may make this call: any certificate of the client CA may read, only an
// allowed identity may change membership.
func (s *Server) authorize(r *http.Request, mutating bool) (string, *Error) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		if s.cfg.InsecureAllowUnauthenticated {
			return "anonymous", nil
		}
		return "", &Error{StatusCode: http.StatusUnauthorized, Reason: ReasonUnauthorized,
			Message: "every /v1/ call needs a client certificate signed by the sidecar's client CA (mutual TLS)"}
	}
	leaf := r.TLS.PeerCertificates[0]
	caller := leaf.Subject.CommonName
	if s.cfg.ClientCAs != nil {
		inter := x509.NewCertPool()
		for _, c := range r.TLS.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := leaf.Verify(x509.VerifyOptions{Roots: s.cfg.ClientCAs, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		if err != nil {
			return caller, &Error{StatusCode: http.StatusUnauthorized, Reason: ReasonUnauthorized,
				Message: fmt.Sprintf("the client certificate %q is not signed by the sidecar's client CA: %v", caller, err)}
		}
	} else if len(r.TLS.VerifiedChains) == 0 {
		return caller, &Error{StatusCode: http.StatusUnauthorized, Reason: ReasonUnauthorized,
			Message: fmt.Sprintf("the client certificate %q was not verified; serve the sidecar with a client CA (tls.VerifyClientCertIfGiven)", caller)}
	}
	if !mutating || len(s.cfg.AllowedClients) == 0 {
		return caller, nil
	}
	ids := Identities(leaf)
	for _, id := range ids {
		if slices.Contains(s.cfg.AllowedClients, id) {
			return id, nil
		}
	}
	return caller, &Error{StatusCode: http.StatusForbidden, Reason: ReasonForbidden,
		Message: fmt.Sprintf("the client certificate's identities [%s] are not among the clients allowed to change membership [%s] (--allowed-client, annotation %s)",
			strings.Join(ids, ", "), strings.Join(s.cfg.AllowedClients, ", "), "druid-stretch.druid.gardener.cloud/sidecar-allowed-clients")}
}

// Identities are the names a client certificate proves: its common name,
// then its DNS, URI and email SANs, as the allow-list matches them.
func Identities(c *x509.Certificate) []string {
	var ids []string
	if c.Subject.CommonName != "" {
		ids = append(ids, c.Subject.CommonName)
	}
	ids = append(ids, c.DNSNames...)
	for _, u := range c.URIs {
		ids = append(ids, u.String())
	}
	return append(ids, c.EmailAddresses...)
}

// withinLimits answers a /v1/ call with h within the request limits: a
// body announced larger than the limit is refused unread, a body that turns
// out larger is cut (decodeJSON answers 413), and a call beyond the
// in-flight bound is refused at once. The call's slot is freed before its
// answer is written, so a caller that has its answer may call again.
func (s *Server) withinLimits(w http.ResponseWriter, r *http.Request, h handlerFunc) (int, any, *Error) {
	max := s.cfg.Limits.MaxBodyBytes
	if r.ContentLength > max {
		return 0, nil, tooLarge(max)
	}
	r.Body = http.MaxBytesReader(w, r.Body, max)
	select {
	case s.inFlight <- struct{}{}:
		defer func() { <-s.inFlight }()
		return h(r)
	default:
		return 0, nil, &Error{StatusCode: http.StatusTooManyRequests, Reason: ReasonTooManyRequests, RetryAfter: time.Second,
			Message: fmt.Sprintf("%d calls are being answered already (the sidecar's bound); try again", s.cfg.Limits.MaxInFlight)}
	}
}

func tooLarge(max int64) *Error {
	return &Error{StatusCode: http.StatusRequestEntityTooLarge, Reason: ReasonRequestTooLarge,
		Message: fmt.Sprintf("the request body exceeds %d bytes, the sidecar's limit; a valid body is a small JSON object", max)}
}

// bodyError maps a body read error: a cut body is 413, anything else 400.
func bodyError(err error) *Error {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return tooLarge(tooBig.Limit)
	}
	return badRequest(ReasonMalformedRequest, "the request body is not valid: %v", err)
}
