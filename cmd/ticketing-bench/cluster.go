package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// addrList is the value of --addr: a comma-separated list of addresses;
// the flag may be repeated and the lists add up.
type addrList struct{ dst *[]string }

func (a addrList) String() string {
	if a.dst == nil {
		return ""
	}
	return strings.Join(*a.dst, ",")
}

func (a addrList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			return fmt.Errorf("empty address in %q", v)
		}
		if !slices.Contains(*a.dst, s) {
			*a.dst = append(*a.dst, s)
		}
	}
	return nil
}

// notActiveError is a HELLO answered with NOT_ACTIVE (M): the node does
// not serve; hint is the serving node's client address, if it knows one.
type notActiveError struct{ hint string }

func (e *notActiveError) Error() string {
	return fmt.Sprintf("HELLO refused: node not active (hint %q)", e.hint)
}

// helloRefusedError is a HELLO answered with an error frame (E), such as
// a wrong token: asking again will not help.
type helloRefusedError struct {
	code uint16
	msg  string
	name string
}

func (e *helloRefusedError) Error() string {
	return fmt.Sprintf("HELLO refused: E(%d) %s: %s", e.code, e.name, e.msg)
}

// findRetry is the pause between two passes over the addresses while no
// node serves (a cluster electing its leader).
const findRetry = 100 * time.Millisecond

// findServing looks for the serving node among addrs, the nodes of one
// cluster: it dials them in order, and when a node answers HELLO with
// NOT_ACTIVE and a hint that names one of addrs not yet tried in this
// pass, it dials that one next. The first node to answer HELLO_OK is the
// serving node: its address and that first session are returned. While no
// node serves, passes repeat every findRetry until wait has passed; a
// HELLO refused with E (a wrong token), a server certificate that does not
// verify or a TLS alert refusing this client ends the search at once. Each
// pass dials every address at most once, so two nodes naming each other
// cannot make it spin.
func findServing(ctx context.Context, addrs []string, token string, tlsConf *tls.Config, clk *clock, wait time.Duration) (string, *muxConn, error) {
	deadline := time.Now().Add(wait)
	for {
		var errs []error
		tried := make(map[string]bool, len(addrs))
		next := addrs[0]
		for next != "" {
			addr := next
			tried[addr] = true
			c, err := dialMux(addr, token, tlsConf, clk)
			if err == nil {
				return addr, c, nil
			}
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			if _, ok := errors.AsType[*helloRefusedError](err); ok || tlsRefused(err) {
				return "", nil, fmt.Errorf("connect to %s: %w", addr, err)
			}
			next = ""
			if na, ok := errors.AsType[*notActiveError](err); ok && slices.Contains(addrs, na.hint) && !tried[na.hint] {
				next = na.hint
				continue
			}
			for _, a := range addrs {
				if !tried[a] {
					next = a
					break
				}
			}
		}
		if !time.Now().Add(findRetry).Before(deadline) {
			return "", nil, fmt.Errorf("no serving node among %s after %v: %w", strings.Join(addrs, ","), wait, errors.Join(errs...))
		}
		select {
		case <-ctx.Done():
			return "", nil, fmt.Errorf("looking for the serving node: %w", ctx.Err())
		case <-time.After(findRetry):
		}
	}
}
