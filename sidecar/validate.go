package sidecar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/druid-stretch/druid-stretch/internal/peerurl"
)

// maxBodyBytes bounds request bodies: the largest valid body is a few hundred
// bytes, so anything near this is garbage.
const maxBodyBytes = 64 << 10

// maxNameLength follows Kubernetes' DNS subdomain limit: member names are
// built from pod names.
const maxNameLength = 253

// validateName accepts names that etcd-druid can produce (pod names with a
// prefix) and that are safe in a URL path and in logs.
func validateName(field, name string) *Error {
	if name == "" {
		return badRequest(ReasonInvalidName, "%s is empty", field)
	}
	if len(name) > maxNameLength {
		return badRequest(ReasonInvalidName, "%s is %d characters long, the limit is %d", field, len(name), maxNameLength)
	}
	for i, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_'
		if !ok {
			return badRequest(ReasonInvalidName, "%s %q has the character %q at position %d; allowed are letters, digits, '-', '.' and '_'", field, name, c, i)
		}
	}
	return nil
}

// validatePeerURLs accepts what etcd accepts as advertised peer URLs
// (http or https, a host and a port, nothing else), spelled canonically
// (peerurl.Canonical), at most peerurl.Max of them, and no two naming the
// same peer: etcd compares peer URLs as strings, so another spelling of a
// URL would pass its own duplicate checks.
func validatePeerURLs(urls []string) *Error {
	if len(urls) == 0 {
		return badRequest(ReasonInvalidURL, "peerURLs is empty; give at least one http(s)://host:port")
	}
	if len(urls) > peerurl.Max {
		return badRequest(ReasonInvalidURL, "peerURLs has %d URLs; a member has at most %d (one per network it is reached on)", len(urls), peerurl.Max)
	}
	for i, raw := range urls {
		field := fmt.Sprintf("peerURLs[%d]", i)
		canonical, err := peerurl.Canonical(raw)
		if err != nil {
			return badRequest(ReasonInvalidURL, "%s %q %v", field, raw, err)
		}
		if canonical != raw {
			return badRequest(ReasonInvalidURL, "%s %q is not spelled canonically; send %q (lower-case scheme and host, no trailing dot, the port without leading zeros, the shortest IP form, no path), the one spelling every peer URL is compared in", field, raw, canonical)
		}
		for j, earlier := range urls[:i] {
			if peerurl.Same(raw, earlier) {
				return badRequest(ReasonInvalidURL, "%s %q names the same peer as peerURLs[%d] %q (loopback names and addresses count as one host); list each peer once", field, raw, j, earlier)
			}
		}
	}
	return nil
}

// decodeJSON reads exactly one JSON object into v, refusing unknown fields
// so that a typo in a field name is an error and not a silent default.
func decodeJSON(r *http.Request, v any) *Error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return badRequest(ReasonMalformedRequest, "the request body is empty; want a JSON object")
		}
		return bodyError(err)
	}
	if err := dec.Decode(&struct{}{}); !errors.Is(err, io.EOF) {
		return badRequest(ReasonMalformedRequest, "the request body has data after the JSON object")
	}
	return nil
}

// decodeOptionalJSON is decodeJSON for a body that may be left out: an
// empty body leaves v as it is.
func decodeOptionalJSON(r *http.Request, v any) *Error {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	if err != nil {
		return bodyError(err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return decodeJSON(r, v)
}

// noBody refuses a request that carries a body where the endpoint takes
// none, rather than ignoring what the caller meant to say.
func noBody(r *http.Request) *Error {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	if err != nil {
		return bodyError(err)
	}
	if len(bytes.TrimSpace(body)) != 0 {
		return badRequest(ReasonMalformedRequest, "%s %s takes no request body; got %d bytes", r.Method, r.URL.Path, len(body))
	}
	return nil
}

func badRequest(reason, format string, args ...any) *Error {
	return &Error{StatusCode: http.StatusBadRequest, Reason: reason, Message: fmt.Sprintf(format, args...)}
}
