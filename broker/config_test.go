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
		clu   string
		bad   bool
	}{
		{in: "ticketing://127.0.0.1:5225", addrs: []string{"127.0.0.1:5225"}},
		{in: "ticketing://TOKEN@h1:5225,h2:5226?tls=ca&ca=/p/ca.pem", addrs: []string{"h1:5225", "h2:5226"}, token: "TOKEN", mode: broker.TLSCAFile, ca: "/p/ca.pem"},
		{in: "ticketing://a%40b@h?tls=system", addrs: []string{"h"}, token: "a@b", mode: broker.TLSSystemRoots},
		{in: "ticketing://h?tls=insecure-skip-verify", addrs: []string{"h"}, mode: broker.TLSInsecureSkipVerify},
		{in: "ticketing://h?ca=/x.pem", addrs: []string{"h"}, mode: broker.TLSCAFile, ca: "/x.pem"},
		{in: "ticketing://T@h1,h2?ca=/x.pem&cluster=0123456789abcdef0123456789abcdef", addrs: []string{"h1", "h2"}, token: "T", mode: broker.TLSCAFile, ca: "/x.pem", clu: "0123456789abcdef0123456789abcdef"},
		{in: "ticketing://h?cluster=" + strings.Repeat("x", 65), bad: true},
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
			if !slices.Equal(cfg.Addrs, c.addrs) || cfg.Token != c.token || cfg.TLS.Mode != c.mode || cfg.TLS.CAFile != c.ca || cfg.Cluster != c.clu {
				t.Fatalf("got %+v", cfg)
			}
		})
	}
}

// TestConfig_CAFileAndBackoff: one CAFile rule for New and ParseURL (a
// CAFile implies CA-file TLS; with a mode that would ignore it, an error),
// and BackoffMin above BackoffMax is an error.
func TestConfig_CAFileAndBackoff(t *testing.T) {
	pki := newPKI(t)
	t.Run("CAFile with the mode unset is CA-file TLS", func(t *testing.T) {
		f := newFakeOn(t, "127.0.0.1:0", pki.ServerTLS)
		cfg := testConfig(f.Addr)
		cfg.TLS = broker.TLSConfig{CAFile: pki.CAFile, ServerName: testServerName}
		b := newBroker(t, cfg) // plaintext would never get a HELLO_OK here
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("CAFile with a mode that ignores it", func(t *testing.T) {
		for _, m := range []broker.TLSMode{broker.TLSSystemRoots, broker.TLSInsecureSkipVerify} {
			cfg := testConfig("127.0.0.1:1")
			cfg.TLS = broker.TLSConfig{Mode: m, CAFile: pki.CAFile}
			_, err := broker.New(cfg)
			mustIs(t, err, broker.ErrInvalidConfig)
		}
	})
	t.Run("Cluster longer than 64 bytes", func(t *testing.T) {
		cfg := testConfig("127.0.0.1:1")
		cfg.Cluster = strings.Repeat("x", 65)
		_, err := broker.New(cfg)
		mustIs(t, err, broker.ErrInvalidConfig)
	})
	t.Run("BackoffMin above BackoffMax", func(t *testing.T) {
		cfg := testConfig("127.0.0.1:1")
		cfg.BackoffMin, cfg.BackoffMax = 2*s, s
		_, err := broker.New(cfg)
		mustIs(t, err, broker.ErrInvalidConfig)
		cfg.BackoffMin, cfg.BackoffMax = 10*s, 0 // above the default maximum
		_, err = broker.New(cfg)
		mustIs(t, err, broker.ErrInvalidConfig)
		cfg.BackoffMin, cfg.BackoffMax = s, s
		b, err := broker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		b.Close()
	})
	t.Run("ParseURL follows the same CAFile rule", func(t *testing.T) {
		for _, u := range []string{"ticketing://h?tls=system&ca=/x.pem", "ticketing://h?tls=off&ca=/x.pem", "ticketing://h?tls=insecure-skip-verify&ca=/x.pem"} {
			_, err := broker.ParseURL(u)
			mustIs(t, err, broker.ErrInvalidConfig)
		}
		cfg, err := broker.ParseURL("ticketing://h?ca=/x.pem")
		if err != nil || cfg.TLS.Mode != broker.TLSCAFile {
			t.Fatalf("ca= alone: %+v, %v", cfg.TLS, err)
		}
	})
}
