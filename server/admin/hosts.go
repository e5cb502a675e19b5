package admin

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// hostCheck answers 403 to a request whose Host header names a host the
// admin listener does not know as its own, for a handler without a token:
// a web page that rebinds its own DNS name to this server's address (DNS
// rebinding) makes the operator's browser send its requests here with
// that name as Host, and would otherwise read /status, /metrics and the
// rest from its own origin. Allowed are an empty Host (HTTP/1.0), IP
// addresses (a page can only be of an IP origin if it is served from that
// very address, so no rebinding can lead there: Prometheus and probes
// that address the node by IP keep working), localhost, and the names of
// allowed ("*" for any name, "*.example.com" for the names below
// example.com), case-insensitively and without a final dot; the port is
// not compared.
type hostCheck struct {
	any      bool
	names    map[string]struct{}
	suffixes []string // ".example.com" of "*.example.com"
	next     http.Handler
}

func newHostCheck(allowed []string, next http.Handler) *hostCheck {
	h := &hostCheck{names: map[string]struct{}{"localhost": {}}, next: next}
	for _, a := range allowed {
		a = normalHost(a)
		switch {
		case a == "*":
			h.any = true
		case strings.HasPrefix(a, "*."):
			h.suffixes = append(h.suffixes, a[1:])
		case a != "":
			h.names[a] = struct{}{}
		}
	}
	return h
}

// normalHost is the host of a Host header or host setting, lower-case,
// without brackets, port or final dot.
func normalHost(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	return strings.ToLower(strings.TrimSuffix(host, "."))
}

// allowed reports whether the Host header host names this server.
func (h *hostCheck) allowed(host string) bool {
	if host == "" || h.any {
		return true
	}
	name := normalHost(host)
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	if _, ok := h.names[name]; ok {
		return true
	}
	for _, s := range h.suffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

func (h *hostCheck) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.allowed(r.Host) {
		writeJSON(w, http.StatusForbidden, ErrorResponse{Error: fmt.Sprintf(
			"Host %q is not a name of this server: without --admin-token the admin listener answers only for an IP address, localhost, the hosts of its listen and advertise addresses, and the names of --admin-allowed-host", r.Host)})
		return
	}
	h.next.ServeHTTP(w, r)
}
