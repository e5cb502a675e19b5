package broker_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/broker"
)

func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		in    string
		addrs []string
		token string
		mode  broker.TLSMode
		ca    string
		bad   bool
	}{
		{in: "ticketing://127.0.0.1:5225", addrs: []string{"127.0.0.1:5225"}},
		{in: "ticketing://TOKEN@h1:5225,h2:5226?tls=ca&ca=/p/ca.pem", addrs: []string{"h1:5225", "h2:5226"}, token: "TOKEN", mode: broker.TLSCAFile, ca: "/p/ca.pem"},
		{in: "ticketing://a%40b@h?tls=system", addrs: []string{"h"}, token: "a@b", mode: broker.TLSSystemRoots},
		{in: "ticketing://h?tls=insecure-skip-verify", addrs: []string{"h"}, mode: broker.TLSInsecureSkipVerify},
		{in: "ticketing://h?ca=/x.pem", addrs: []string{"h"}, mode: broker.TLSCAFile, ca: "/x.pem"},
		{in: "http://h", bad: true},
		{in: "ticketing://", bad: true},
		{in: "ticketing://h?tls=ca", bad: true},
		{in: "ticketing://h?tls=maybe", bad: true},
		{in: "ticketing://h?color=red", bad: true},
		{in: "ticketing://h/path", bad: true},
		{in: "ticketing://secret%zz@h", bad: true},
	} {
		t.Run(c.in, func(t *testing.T) {
			cfg, err := broker.ParseURL(c.in)
			if c.bad {
				mustIs(t, err, broker.ErrInvalidConfig)
				if strings.Contains(err.Error(), "secret") {
					t.Fatalf("error shows the token: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.Addrs, c.addrs) || cfg.Token != c.token || cfg.TLS.Mode != c.mode || cfg.TLS.CAFile != c.ca {
				t.Fatalf("got %+v", cfg)
			}
		})
	}
}
