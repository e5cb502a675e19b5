package deploy

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"gopkg.in/yaml.v3"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/deploy/deploytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cluster3 is the Spec of 'init --cluster' for n1..n3 on 127.0.0.1.
func cluster3(dir string) Spec {
	s := DefaultSpec(Cluster)
	s.Dir = dir
	s.Nodes = []Node{{ID: "n1", Host: "127.0.0.1"}, {ID: "n2", Host: "127.0.0.1"}, {ID: "n3", Host: "127.0.0.1"}}
	return s
}

func pair2(dir string) Spec {
	s := DefaultSpec(Pair)
	s.Dir = dir
	s.Nodes = []Node{{ID: "backup", Host: "10.0.0.2"}, {ID: "primary", Host: "10.0.0.1"}}
	return s
}

func single(dir string) Spec {
	s := DefaultSpec(Single)
	s.Dir = dir
	return s
}

// TestValidate: every field error, addressed to its field, and specs
// without one.
func TestValidate(t *testing.T) {
	with := func(s Spec, f func(*Spec)) Spec { f(&s); return s }
	tests := []struct {
		name  string
		spec  Spec
		field string // "" for a valid spec
		msg   string // in the message
	}{
		{"single", single("d"), "", ""},
		{"cluster", cluster3("d"), "", ""},
		{"pair", pair2("d"), "", ""},
		{"cluster of 4 (a warning, not an error)", with(cluster3("d"), func(s *Spec) { s.Nodes = append(s.Nodes, Node{ID: "n4", Host: "127.0.0.1"}) }), "", ""},
		{"zero ports are the defaults", with(cluster3("d"), func(s *Spec) { s.Port, s.PeerPort, s.AdminPort = 0, 0, 0 }), "", ""},
		{"topology", with(single("d"), func(s *Spec) { s.Topology = "ring" }), "topology", "single, pair or cluster"},
		{"dir", single(""), "dir", "required"},
		{"dir with backslashes", single(`..\..\Windows\evil`), "dir", "without a backslash"},
		{"absolute dir ending in backslashes", single(`/srv/..\..\Windows\evil`), "dir", "without a backslash"},
		{"dir with a newline", single("/srv/locks\nrm -rf /"), "dir", "control characters (U+000A)"},
		{"dir with a NUL", single("/srv/locks\x00.pem"), "dir", "NUL"},
		{"dir with a right-to-left override", single("/srv/locks\u202egp"), "dir", "control characters (U+202E)"},
		{"dir not UTF-8", single("/srv/locks\xff"), "dir", "UTF-8"},
		{"dir with a drive letter", single("C:/locks"), "dir", "colon"},
		{"dir with a .. element", single("/srv/../etc"), "dir", ".. elements"},
		{"dir ..", single(".."), "dir", ".. elements"},
		{"dir with an empty element", single("/srv//locks"), "dir", "empty elements"},
		{"absolute dir with a trailing slash", single("/srv/locks/"), "", ""},
		{"relative dir with .", single("./locks"), "", ""},
		{"own cert with a newline", with(single("d"), func(s *Spec) { s.TLS, s.OwnTLS = TLSOwn, OwnTLS{"/c.pem\nx", "/k.pem", ""} }), "own_tls.cert_file", "control characters"},
		{"own key with a .. element", with(single("d"), func(s *Spec) { s.TLS, s.OwnTLS = TLSOwn, OwnTLS{"/c.pem", "/etc/../k.pem", ""} }), "own_tls.key_file", ".. elements"},
		{"own CA with a backslash", with(single("d"), func(s *Spec) { s.TLS, s.OwnTLS = TLSOwn, OwnTLS{"/c.pem", "/k.pem", `/etc\ca.pem`} }), "own_tls.ca_file", "backslash"},
		{"tls", with(single("d"), func(s *Spec) { s.TLS = "maybe" }), "tls", "off, private-ca or own"},
		{"own cert", with(single("d"), func(s *Spec) { s.TLS, s.OwnTLS.KeyFile = TLSOwn, "/k.pem" }), "own_tls.cert_file", "required"},
		{"own key", with(single("d"), func(s *Spec) { s.TLS, s.OwnTLS.CertFile = TLSOwn, "/c.pem" }), "own_tls.key_file", "required"},
		{"own relative", with(single("d"), func(s *Spec) { s.TLS, s.OwnTLS = TLSOwn, OwnTLS{"/c.pem", "/k.pem", "ca.pem"} }), "own_tls.ca_file", "absolute"},
		{"no client tokens", with(single("d"), func(s *Spec) { s.ClientTokens = 0 }), "client_tokens", "1 to 100"},
		{"too many client tokens", with(single("d"), func(s *Spec) { s.ClientTokens = 101 }), "client_tokens", "1 to 100"},
		{"token start", with(single("d"), func(s *Spec) { s.TokenStart = "two" }), "token_start", "one or clock"},
		{"port", with(single("d"), func(s *Spec) { s.Port = 65536 }), "port", "1..65535"},
		{"peer port", with(cluster3("d"), func(s *Spec) { s.PeerPort = -1 }), "peer_port", "1..65535"},
		{"admin port", with(cluster3("d"), func(s *Spec) { s.AdminPort = 70000 }), "admin_port", "1..65535"},
		{"single with nodes", with(single("d"), func(s *Spec) { s.Nodes = []Node{{ID: "n1", Host: "h"}} }), "nodes", "no nodes"},
		{"single with peer TLS", with(single("d"), func(s *Spec) { s.PeerTLS = true }), "peer_tls", "pair or a cluster"},
		{"single host", with(single("d"), func(s *Spec) { s.Hosts = []string{"ok.example.test", "locks:5225"} }), "hosts[1]", "without a port"},
		{"single listen", with(single("d"), func(s *Spec) { s.Listen = "127.0.0.1" }), "listen", "missing port"},
		{"single listen port", with(single("d"), func(s *Spec) { s.Listen = "127.0.0.1:0" }), "listen", "1..65535"},
		{"cluster with hosts", with(cluster3("d"), func(s *Spec) { s.Hosts = []string{"h"} }), "hosts", "nodes name"},
		{"cluster with listen", with(cluster3("d"), func(s *Spec) { s.Listen = "h:1" }), "listen", "nodes' hosts"},
		{"base ports equal", with(cluster3("d"), func(s *Spec) { s.PeerPort = s.Port }), "port", "must differ"},
		{"cluster without nodes", with(cluster3("d"), func(s *Spec) { s.Nodes = nil }), "nodes", "3 or 5"},
		{"node ID", with(cluster3("d"), func(s *Spec) { s.Nodes[1].ID = "n/2" }), "nodes[1].id", "letters, digits"},
		{"node ID ..", with(cluster3("d"), func(s *Spec) { s.Nodes[1].ID = ".." }), "nodes[1].id", "names the node's directory"},
		{"node ID .", with(cluster3("d"), func(s *Spec) { s.Nodes[2].ID = "." }), "nodes[2].id", "names the node's directory"},
		{"node ID with dots", with(cluster3("d"), func(s *Spec) { s.Nodes[2].ID = "n.3" }), "", ""},
		{"node ID twice", with(cluster3("d"), func(s *Spec) { s.Nodes[2].ID = "n1" }), "nodes[2].id", "n1 is given twice"},
		{"node host", with(cluster3("d"), func(s *Spec) { s.Nodes[0].Host = "127.0.0.1:5225" }), "nodes[0].host", "without a port"},
		{"node port", with(cluster3("d"), func(s *Spec) { s.Nodes[0].AdminPort = 65536 }), "nodes[0].admin_port", "1..65535"},
		{"hosts mix loopback", with(cluster3("d"), func(s *Spec) { s.Nodes[2].Host = "10.0.0.3" }), "nodes", "mix loopback"},
		{"port clash", with(cluster3("d"), func(s *Spec) { s.Port, s.PeerPort = 7000, 7001 }), "nodes[1].client_port", "n2's client port 7001 on 127.0.0.1 is also n1's Raft port"},
		{"own port clash", with(cluster3("d"), func(s *Spec) { s.Nodes[2].PeerPort = 5225 }), "nodes[2].peer_port", "also n1's client port"},
		{"own ports equal", with(cluster3("d"), func(s *Spec) { s.Nodes[0].ClientPort, s.Nodes[0].PeerPort = 6000, 6000 }), "nodes[0].client_port", "must differ"},
		{"too many on a host", with(cluster3("d"), func(s *Spec) { s.Port = 65534 }), "nodes[2].client_port", "too many nodes on 127.0.0.1"},
		{"pair of three", with(pair2("d"), func(s *Spec) { s.Nodes = append(s.Nodes, Node{ID: "x", Host: "h"}) }), "nodes", "two nodes"},
		{"pair role", with(pair2("d"), func(s *Spec) { s.Nodes[1].ID = "secondary" }), "nodes[1].id", "primary and backup"},
		{"console keys without the admin token", with(single("d"), func(s *Spec) { s.ConsoleKeys = true }), "console_keys", "needs the admin token"},
		{"console keys with it", with(cluster3("d"), func(s *Spec) { s.ConsoleKeys = true }), "", ""},
		{"pair role twice", with(pair2("d"), func(s *Spec) { s.Nodes[1].ID = "backup" }), "nodes[1].id", "backup is given twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.spec)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var fes FieldErrors
			if !errors.As(err, &fes) {
				t.Fatalf("Validate: %v, want FieldErrors", err)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Errorf("errors.As to *FieldError fails on %v", err)
			}
			msgs := fes.ByField()[tc.field]
			if !slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(m, tc.msg) }) {
				t.Errorf("Validate: %v; want on %s a message with %q", err, tc.field, tc.msg)
			}
			if _, err := Plan(tc.spec); !errors.As(err, &fes) {
				t.Errorf("Plan: %v, want the FieldErrors", err)
			}
		})
	}
}

// TestSingleAddresses: the address rules of a single server, which a test
// of 'init' cannot reach on every machine: IPv6 loopback, an explicit
// listen address, a loopback address the listen address does not serve.
func TestSingleAddresses(t *testing.T) {
	tests := []struct {
		hosts        []string
		listen       string
		wantListen   string
		wantClient   string
		wantHosts    []string
		wantUnserved []string
		wantWildcard bool
		wantUnnamed  bool
	}{
		{nil, "", "127.0.0.1:5225", "127.0.0.1:5225", []string{"127.0.0.1", "localhost"}, nil, false, false},
		{[]string{"localhost"}, "", "127.0.0.1:5225", "localhost:5225", []string{"localhost"}, nil, false, false},
		{[]string{"::1"}, "", "[::1]:5225", "[::1]:5225", []string{"::1"}, nil, false, false},
		{[]string{"[::1]", "localhost"}, "", "[::1]:5225", "[::1]:5225", []string{"::1", "localhost"}, nil, false, false},
		{[]string{"localhost", "::1"}, "", "127.0.0.1:5225", "localhost:5225", []string{"localhost", "::1"}, []string{"::1"}, false, false},
		{[]string{"127.0.0.1", "locks.example.test", "::1"}, "", ":5225", "locks.example.test:5225", []string{"127.0.0.1", "locks.example.test", "::1"}, nil, true, false},
		{[]string{"2001:db8::5"}, "", ":5225", "[2001:db8::5]:5225", []string{"2001:db8::5"}, nil, true, false},
		{nil, "10.0.0.7:6000", "10.0.0.7:6000", "10.0.0.7:6000", []string{"10.0.0.7"}, nil, false, false},
		{nil, "[::1]:6000", "[::1]:6000", "[::1]:6000", []string{"::1", "localhost"}, nil, false, false},
		{nil, "0.0.0.0:6000", "0.0.0.0:6000", "127.0.0.1:6000", []string{"127.0.0.1", "localhost"}, nil, true, false},
		{[]string{"a.example.test", "10.0.0.7"}, "10.0.0.7:6000", "10.0.0.7:6000", "10.0.0.7:6000", []string{"a.example.test", "10.0.0.7"}, nil, false, false},
		{[]string{"a.example.test"}, "127.0.0.1:6000", "127.0.0.1:6000", "a.example.test:6000", []string{"a.example.test"}, nil, false, true},
	}
	for _, tc := range tests {
		s := single("d")
		s.Hosts, s.Listen = tc.hosts, tc.listen
		l, errs := place(s)
		if len(errs) > 0 {
			t.Fatalf("hosts %q listen %q: %v", tc.hosts, tc.listen, errs)
		}
		p := l.single
		if p.listen != tc.wantListen || p.client != tc.wantClient || !slices.Equal(p.hosts, tc.wantHosts) ||
			!slices.Equal(p.unserved, tc.wantUnserved) || p.wildcard != tc.wantWildcard || p.unnamed != tc.wantUnnamed {
			t.Errorf("hosts %q listen %q: got listen %q client %q hosts %q unserved %q wildcard %v unnamed %v",
				tc.hosts, tc.listen, p.listen, p.client, p.hosts, p.unserved, p.wildcard, p.unnamed)
		}
	}
}

// planned is a Bundle with its files by path.
type planned struct {
	*Bundle
	files map[string]File
}

func mustPlan(t *testing.T, s Spec) planned {
	t.Helper()
	b, err := Plan(s)
	if err != nil {
		t.Fatalf("Plan: %v", err)
	}
	p := planned{b, map[string]File{}}
	for _, f := range b.Files {
		if _, dup := p.files[f.Path]; dup {
			t.Errorf("%s planned twice", f.Path)
		}
		p.files[f.Path] = f
	}
	return p
}

// config decodes a planned ticketingd.yaml, refusing keys Config does not
// have, and checks that it renders back to the same bytes.
func (p planned) config(t *testing.T, name string) Config {
	t.Helper()
	f, ok := p.files[name]
	if !ok {
		t.Fatalf("no %s in the bundle", name)
	}
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(f.Data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, f.Data)
	}
	var again Config
	if err := yaml.Unmarshal(must(t)(configDoc{cfg: c}.render()), &again); err != nil || !equalConfig(c, again) {
		t.Errorf("%s does not round-trip: %+v, then %+v (%v)", name, redact(c), redact(again), err)
	}
	return c
}

// redact is c without its admin token, for test messages.
func redact(c Config) Config {
	if c.AdminToken != "" {
		c.AdminToken = "(redacted)"
	}
	return c
}

func equalConfig(a, b Config) bool { return reflect.DeepEqual(a, b) }

func must(t *testing.T) func([]byte, error) []byte {
	return func(b []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

// tokens are the client tokens of a tokens file.
func tokens(data []byte) []string {
	var ts []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			ts = append(ts, l)
		}
	}
	return ts
}

// checkFiles: the bundle's files are exactly want (with the node
// directories and data directories), each secret exactly when mode 0600;
// keys, tokens and configs holding a token are secret, certificates and
// the files for service managers not.
func (p planned) checkFiles(t *testing.T, want []string) {
	t.Helper()
	got := slices.Sorted(maps.Keys(p.files))
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("files\n%q\nwant\n%q", got, want)
	}
	for _, f := range p.Files {
		base := path.Base(f.Path)
		switch {
		case f.Mode.IsDir():
			if f.Mode.Perm() != 0o700 || f.Secret || len(f.Data) > 0 {
				t.Errorf("%s: directory mode %v secret %v", f.Path, f.Mode, f.Secret)
			}
		case f.Secret != (f.Mode.Perm() == 0o600):
			t.Errorf("%s: secret %v with mode %v", f.Path, f.Secret, f.Mode)
		case strings.HasSuffix(base, "key.pem") || base == TokensFile || base == AdminTokenFile:
			if !f.Secret || !bytes.Contains(f.Data, []byte("PRIVATE KEY")) && strings.HasSuffix(base, ".pem") {
				t.Errorf("%s is not a secret (mode %v)", f.Path, f.Mode)
			}
		case strings.HasSuffix(base, ".pem"):
			if f.Secret || f.Mode.Perm() != 0o644 || bytes.Contains(f.Data, []byte("PRIVATE")) {
				t.Errorf("%s: certificate with mode %v secret %v", f.Path, f.Mode, f.Secret)
			}
		case base == ConfigFile:
			if f.Secret != bytes.Contains(f.Data, []byte("admin-token:")) {
				t.Errorf("%s: secret %v, holds the admin token %v", f.Path, f.Secret, !f.Secret)
			}
		default:
			if f.Secret || f.Mode.Perm() != 0o644 {
				t.Errorf("%s: mode %v secret %v", f.Path, f.Mode, f.Secret)
			}
		}
	}
}

// checkSecrets: the guide shows the first client token once, in the URL,
// and the admin token at most once (a pair's or cluster's, in its export
// line); it shows no other secret, and the files that are not secrets
// hold none.
func (p planned) checkSecrets(t *testing.T, tokensFile string, adminShown bool) {
	t.Helper()
	ts := tokens(p.files[tokensFile].Data)
	if len(ts) == 0 {
		t.Fatal("no client tokens")
	}
	if n := strings.Count(p.Guide, ts[0]); n != 1 || !strings.Contains(p.URL, ts[0]) || !strings.Contains(p.Guide, "export TICKETING_URL='"+p.URL+"'") {
		t.Errorf("the guide shows the client token %d times, want once, in the URL %s:\n%s", n, p.URL, p.Guide)
	}
	hidden := slices.Clone(ts[1:]) // in no file but the secret ones, nor in the guide
	all := slices.Clone(ts)        // in no file but the secret ones
	if adm, ok := p.files[AdminTokenFile]; ok {
		a := strings.TrimSpace(string(adm.Data))
		n := strings.Count(p.Guide, a)
		if adminShown && (n != 1 || !strings.Contains(p.Guide, "export TICKETING_ADMIN_TOKEN='"+a+"'")) || !adminShown && n != 0 {
			t.Errorf("the guide shows the admin token %d times (want it shown: %v):\n%s", n, adminShown, p.Guide)
		}
		all = append(all, a)
	}
	for _, f := range p.Files {
		if !f.Secret {
			for _, s := range all {
				if bytes.Contains(f.Data, []byte(s)) {
					t.Errorf("%s (not a secret) holds a token", f.Path)
				}
			}
			continue
		}
		if strings.Contains(p.Guide, strings.TrimSpace(string(f.Data))) && path.Base(f.Path) != AdminTokenFile {
			t.Errorf("the guide holds %s", f.Path)
		}
	}
	for _, s := range hidden {
		if strings.Contains(p.Guide, s) {
			t.Errorf("the guide shows a client token beyond the URL's")
		}
	}
	if strings.Contains(p.Guide, "PRIVATE KEY") {
		t.Error("the guide holds a private key")
	}
}

// checkURL: the URL parses for the broker, with the bundle's first
// client token and group ID.
func (p planned) checkURL(t *testing.T, tokensFile string, addrs []string) broker.Config {
	t.Helper()
	cfg, err := broker.ParseURL(p.URL)
	if err != nil {
		t.Fatalf("ParseURL(%q): %v", p.URL, err)
	}
	if cfg.Token != tokens(p.files[tokensFile].Data)[0] || !slices.Equal(cfg.Addrs, addrs) || cfg.Cluster != p.GroupID {
		t.Errorf("URL %s: addresses %v (want %v), token of the tokens file %v, cluster %q (want %q)",
			p.URL, cfg.Addrs, addrs, cfg.Token == tokens(p.files[tokensFile].Data)[0], cfg.Cluster, p.GroupID)
	}
	return cfg
}

// verify checks that certificate file cert is issued by CA file ca for
// host.
func (p planned) verify(t *testing.T, cert, ca, host string, usage x509.ExtKeyUsage) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(p.files[ca].Data) {
		t.Fatalf("%s: no certificate", ca)
	}
	blk, _ := pem.Decode(p.files[cert].Data)
	if blk == nil {
		t.Fatalf("%s: no PEM", cert)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Verify(x509.VerifyOptions{DNSName: host, Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		t.Errorf("%s for %s by %s: %v", cert, host, ca, err)
	}
}

// extras are the files beside a bundle's configs, certificates and
// tokens.
var extras = []string{ReadmeFile, DockerfileFile, DockerIgnore, ComposeFile}

func TestPlanSingle(t *testing.T) {
	dir := t.TempDir()
	p := mustPlan(t, single(dir))
	p.checkFiles(t, append([]string{DataDir, ConfigFile, TokensFile, SingleUnitFile}, extras...))
	p.checkSecrets(t, TokensFile, false)
	cfg := p.checkURL(t, TokensFile, []string{"127.0.0.1:5225"})
	if cfg.TLS.Mode != broker.TLSOff || p.GroupID != "" || len(p.Warnings) != 0 {
		t.Errorf("plain single: TLS %+v, group %q, warnings %q", cfg.TLS, p.GroupID, p.Warnings)
	}
	c := p.config(t, ConfigFile)
	if c.Listen != "127.0.0.1:5225" || c.DataDir != DataDir || c.TLSCert != "" || c.AdminListen != "" || c.TokenStart != "clock" || c.Cluster || c.Pair != "" {
		t.Errorf("config %+v", redact(c))
	}

	// TLS, an admin listener, three client tokens, token-start one, and
	// a host for remote clients.
	s := single(dir)
	s.TLS, s.AdminToken, s.ClientTokens, s.TokenStart, s.Hosts = TLSPrivateCA, true, 3, "one", []string{"localhost", "locks.example.test"}
	p = mustPlan(t, s)
	p.checkFiles(t, append([]string{DataDir, ConfigFile, TokensFile, SingleUnitFile, CACert, CAKey, ServerCert, ServerKey, AdminTokenFile}, extras...))
	p.checkSecrets(t, TokensFile, false)
	cfg = p.checkURL(t, TokensFile, []string{"locks.example.test:5225"})
	if cfg.TLS.Mode != broker.TLSCAFile || cfg.TLS.CAFile != filepath.Join(dir, CACert) {
		t.Errorf("URL TLS %+v", cfg.TLS)
	}
	if n := len(tokens(p.files[TokensFile].Data)); n != 3 {
		t.Errorf("%d client tokens, want 3", n)
	}
	c = p.config(t, ConfigFile)
	adm := strings.TrimSpace(string(p.files[AdminTokenFile].Data))
	if c.Listen != ":5225" || c.TLSCert != ServerCert || c.TLSKey != ServerKey || c.AdminListen != "127.0.0.1:9225" || c.AdminToken != adm || c.TokenStart != "one" {
		t.Errorf("config %+v", redact(c))
	}
	for _, h := range []string{"localhost", "locks.example.test"} {
		p.verify(t, ServerCert, CACert, h, x509.ExtKeyUsageServerAuth)
	}

	// Own TLS files: named as they are, nothing generated, the URL with
	// the system's roots; on all interfaces without TLS, a warning.
	s = single(dir)
	s.TLS, s.OwnTLS = TLSOwn, OwnTLS{CertFile: "/etc/ssl/locks.pem", KeyFile: "/etc/ssl/private/locks-key.pem"}
	p = mustPlan(t, s)
	p.checkFiles(t, append([]string{DataDir, ConfigFile, TokensFile, SingleUnitFile}, extras...))
	if c := p.config(t, ConfigFile); c.TLSCert != s.OwnTLS.CertFile || c.TLSKey != s.OwnTLS.KeyFile {
		t.Errorf("own TLS config %+v", redact(c))
	}
	if cfg := p.checkURL(t, TokensFile, []string{"127.0.0.1:5225"}); cfg.TLS.Mode != broker.TLSSystemRoots {
		t.Errorf("own TLS without a CA file: URL TLS %+v, want the system's roots", cfg.TLS)
	}
	if compose := string(p.files[ComposeFile].Data); !strings.Contains(compose, "/etc/ssl/private/locks-key.pem:/etc/ssl/private/locks-key.pem:ro") {
		t.Errorf("compose.yaml does not mount the own key:\n%s", compose)
	}
	s = single(dir)
	s.Hosts = []string{"10.1.2.3"}
	if p = mustPlan(t, s); len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "without TLS") {
		t.Errorf("warnings %q, want one of no TLS", p.Warnings)
	}
}

// nodeFiles are the files of node directory id with names.
func nodeFiles(id string, names ...string) []string {
	fs := []string{id, path.Join(id, DataDir), path.Join(id, ConfigFile), path.Join(id, TokensFile), path.Join(id, NodeUnitFile(id))}
	for _, n := range names {
		fs = append(fs, path.Join(id, n))
	}
	return fs
}

func TestPlanCluster(t *testing.T) {
	dir := t.TempDir()
	p := mustPlan(t, cluster3(dir))
	want := append([]string{CACert, CAKey, ClusterCACert, ClusterCAKey, AdminTokenFile, TokensFile}, extras...)
	for _, id := range []string{"n1", "n2", "n3"} {
		want = append(want, nodeFiles(id, ServerCert, ServerKey, NodeCert, NodeKey, ClusterCACert)...)
	}
	p.checkFiles(t, want)
	p.checkSecrets(t, TokensFile, true)
	addrs := []string{"127.0.0.1:5225", "127.0.0.1:5226", "127.0.0.1:5227"}
	cfg := p.checkURL(t, TokensFile, addrs)
	if cfg.TLS.Mode != broker.TLSCAFile || cfg.TLS.CAFile != filepath.Join(dir, CACert) || !regexp.MustCompile(`^[0-9a-f]{32}\.p[0-9a-f]{12}$`).MatchString(p.GroupID) || len(p.Warnings) != 0 {
		t.Errorf("URL TLS %+v, group %q, warnings %q", cfg.TLS, p.GroupID, p.Warnings)
	}
	adm := strings.TrimSpace(string(p.files[AdminTokenFile].Data))
	peers := []string{"n1=127.0.0.1:7225", "n2=127.0.0.1:7226", "n3=127.0.0.1:7227"}
	for i, id := range []string{"n1", "n2", "n3"} {
		c := p.config(t, path.Join(id, ConfigFile))
		if !c.Cluster || c.NodeID != id || c.NodeName != id || c.ClusterID != p.GroupID || c.InitialState != "new" || !slices.Equal(c.Peers, peers) ||
			c.Listen != addrs[i] || c.Advertise != addrs[i] || c.RaftListen != strings.TrimPrefix(peers[i], id+"=") ||
			c.AdminListen != "127.0.0.1:"+[]string{"9225", "9226", "9227"}[i] || c.AdminToken != adm ||
			c.TLSCert != ServerCert || c.PeerTLSCert != NodeCert || c.PeerTLSKey != NodeKey || c.PeerTLSCA != ClusterCACert {
			t.Errorf("%s: config %+v", id, redact(c))
		}
		if !slices.Equal(tokens(p.files[path.Join(id, TokensFile)].Data), tokens(p.files[TokensFile].Data)) {
			t.Errorf("%s: client tokens differ from the bundle's", id)
		}
		p.verify(t, path.Join(id, ServerCert), CACert, "127.0.0.1", x509.ExtKeyUsageServerAuth)
		p.verify(t, path.Join(id, NodeCert), ClusterCACert, "127.0.0.1", x509.ExtKeyUsageClientAuth)
		p.verify(t, path.Join(id, NodeCert), path.Join(id, ClusterCACert), "127.0.0.1", x509.ExtKeyUsageServerAuth)
	}

	// The lock browser on: console-keys in every node's config, a single
	// server's too; off, no such key.
	if c := p.config(t, path.Join("n1", ConfigFile)); c.ConsoleKeys {
		t.Errorf("console-keys without ConsoleKeys")
	}
	// Off, each config says how to turn it on, in a commented line.
	for _, id := range []string{"n1", "n2", "n3"} {
		if data := string(p.files[path.Join(id, ConfigFile)].Data); !strings.Contains(data, "\n# console-keys: true   # show lock keys in the console") {
			t.Errorf("%s: no commented console-keys line:\n%s", id, data)
		}
	}
	s0 := single(dir)
	s0.AdminToken = true
	if data := string(mustPlan(t, s0).files[ConfigFile].Data); !strings.Contains(data, "\n# console-keys: true   # show lock keys in the console") {
		t.Errorf("single with the admin token: no commented console-keys line:\n%s", data)
	}
	s := cluster3(dir)
	s.ConsoleKeys = true
	p = mustPlan(t, s)
	for _, id := range []string{"n1", "n2", "n3"} {
		if c := p.config(t, path.Join(id, ConfigFile)); !c.ConsoleKeys {
			t.Errorf("%s: no console-keys", id)
		}
		if data := string(p.files[path.Join(id, ConfigFile)].Data); !strings.Contains(data, "console-keys: true # the lock browser") {
			t.Errorf("%s: config\n%s", id, data)
		}
	}
	s1 := single(dir)
	s1.AdminToken, s1.ConsoleKeys = true, true
	if c := mustPlan(t, s1).config(t, ConfigFile); !c.ConsoleKeys || c.AdminListen == "" {
		t.Errorf("single: config %+v", redact(c))
	}

	// Five nodes on their own hosts, plain client listeners, peer TLS: no
	// client CA, the base ports everywhere, each certificate for its host.
	s = DefaultSpec(Cluster)
	s.Dir, s.TLS = dir, TLSOff
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		s.Nodes = append(s.Nodes, Node{ID: id, Host: id + ".example.test"})
	}
	p = mustPlan(t, s)
	want = append([]string{ClusterCACert, ClusterCAKey, AdminTokenFile, TokensFile}, extras...)
	for _, n := range s.Nodes {
		want = append(want, nodeFiles(n.ID, NodeCert, NodeKey, ClusterCACert)...)
		c := p.config(t, path.Join(n.ID, ConfigFile))
		if c.TLSCert != "" || c.Listen != n.Host+":5225" || c.RaftListen != n.Host+":7225" || len(c.Peers) != 5 || c.PeerTLSCA != ClusterCACert {
			t.Errorf("%s: config %+v", n.ID, redact(c))
		}
		p.verify(t, path.Join(n.ID, NodeCert), ClusterCACert, n.Host, x509.ExtKeyUsageClientAuth)
	}
	p.checkFiles(t, want)
	p.checkSecrets(t, TokensFile, true)
	if cfg := p.checkURL(t, TokensFile, []string{"a.example.test:5225", "b.example.test:5225", "c.example.test:5225", "d.example.test:5225", "e.example.test:5225"}); cfg.TLS.Mode != broker.TLSOff {
		t.Errorf("URL TLS %+v", cfg.TLS)
	}
	if !strings.Contains(p.Guide, "scp -rp "+filepath.Join(dir, "a")+" a.example.test:ticketing-a") {
		t.Errorf("guide of remote nodes without scp lines:\n%s", p.Guide)
	}

	// Four nodes: planned, with a warning.
	s = cluster3(dir)
	s.Nodes = append(s.Nodes, Node{ID: "n4", Host: "127.0.0.1"})
	if p = mustPlan(t, s); len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "a cluster of 4 nodes survives the loss of 1") {
		t.Errorf("warnings %q", p.Warnings)
	}
}

func TestPlanPair(t *testing.T) {
	dir := t.TempDir()
	p := mustPlan(t, pair2(dir))
	want := append([]string{CACert, CAKey, AdminTokenFile, TokensFile}, extras...)
	for _, id := range []string{"primary", "backup"} {
		want = append(want, nodeFiles(id, NodeCert, NodeKey, CACert)...)
	}
	p.checkFiles(t, want)
	p.checkSecrets(t, TokensFile, true)
	// The primary first, whichever order the Spec has.
	p.checkURL(t, TokensFile, []string{"10.0.0.1:5225", "10.0.0.2:5225"})
	prim, back := p.config(t, "primary/"+ConfigFile), p.config(t, "backup/"+ConfigFile)
	if prim.Pair != "primary" || back.Pair != "backup" || prim.PairID != p.GroupID || back.PairID != p.GroupID ||
		prim.Peer != back.PeerListen || back.Peer != prim.PeerListen || prim.PeerListen != "10.0.0.1:7225" ||
		prim.TLSCert != NodeCert || prim.PeerTLSCert != NodeCert || prim.PeerTLSCA != CACert || prim.Cluster {
		t.Errorf("configs: primary %+v, backup %+v", redact(prim), redact(back))
	}
	p.verify(t, "primary/"+NodeCert, CACert, "10.0.0.1", x509.ExtKeyUsageClientAuth)

	// No TLS, no peer TLS, no admin token: no CA, no admin token file.
	s := pair2(dir)
	s.TLS, s.PeerTLS, s.AdminToken = TLSOff, false, false
	p = mustPlan(t, s)
	want = append([]string{TokensFile}, extras...)
	for _, id := range []string{"primary", "backup"} {
		want = append(want, nodeFiles(id)...)
	}
	p.checkFiles(t, want)
	p.checkSecrets(t, TokensFile, false)
	if c := p.config(t, "primary/"+ConfigFile); c.TLSCert != "" || c.PeerTLSCert != "" || !c.PeerPlaintext || c.AdminToken != "" || c.AdminListen != "127.0.0.1:9225" {
		t.Errorf("plain pair off loopback: config %+v, want peer-plaintext", redact(c))
	}
	// With peer TLS, or on loopback, no peer-plaintext.
	if c := mustPlan(t, pair2(dir)).config(t, "backup/"+ConfigFile); c.PeerPlaintext {
		t.Errorf("pair with peer TLS: config %+v, want no peer-plaintext", redact(c))
	}
}

// TestPlanFresh: every Plan draws new keys and tokens.
func TestPlanFresh(t *testing.T) {
	a, b := mustPlan(t, cluster3("d")), mustPlan(t, cluster3("d"))
	for _, f := range a.Files {
		if f.Secret && bytes.Equal(f.Data, b.files[f.Path].Data) {
			t.Errorf("%s: the same in two plans", f.Path)
		}
	}
	if a.GroupID == b.GroupID {
		t.Error("two plans of one cluster ID")
	}
}

func TestSystemdUnit(t *testing.T) {
	p := mustPlan(t, cluster3(t.TempDir()))
	unit := string(p.files["n2/"+NodeUnitFile("n2")].Data)
	for _, line := range []string{
		"User=ticketingd", "Group=ticketingd", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
		"StateDirectory=ticketingd/n2", "StateDirectoryMode=0700", "Restart=on-failure", "CapabilityBoundingSet=",
		"ExecStart=/usr/local/bin/ticketingd serve --config /etc/ticketingd/n2/ticketingd.yaml --data-dir /var/lib/ticketingd/n2",
		"WantedBy=multi-user.target",
	} {
		if !slices.Contains(strings.Split(unit, "\n"), line) {
			t.Errorf("the unit lacks the line %q:\n%s", line, unit)
		}
	}
	if strings.Contains(unit, "AmbientCapabilities") {
		t.Errorf("a unit on port 5226 gets capabilities:\n%s", unit)
	}
	// A port below 1024: the one capability to bind it.
	s := single("d")
	s.Port = 443
	unit = string(mustPlan(t, s).files[SingleUnitFile].Data)
	for _, line := range []string{"CapabilityBoundingSet=CAP_NET_BIND_SERVICE", "AmbientCapabilities=CAP_NET_BIND_SERVICE",
		"ExecStart=/usr/local/bin/ticketingd serve --config /etc/ticketingd/ticketingd.yaml --data-dir /var/lib/ticketingd", "StateDirectory=ticketingd"} {
		if !slices.Contains(strings.Split(unit, "\n"), line) {
			t.Errorf("the unit of port 443 lacks the line %q:\n%s", line, unit)
		}
	}
}

func TestCompose(t *testing.T) {
	p := mustPlan(t, cluster3(t.TempDir()))
	var proj ComposeProject
	dec := yaml.NewDecoder(bytes.NewReader(p.files[ComposeFile].Data))
	dec.KnownFields(true)
	if err := dec.Decode(&proj); err != nil {
		t.Fatalf("compose.yaml: %v\n%s", err, p.files[ComposeFile].Data)
	}
	if got := slices.Sorted(maps.Keys(proj.Services)); !slices.Equal(got, []string{"n1", "n2", "n3"}) {
		t.Fatalf("services %q", got)
	}
	for id, svc := range proj.Services {
		if svc.NetworkMode != "host" || svc.Build != "." || !slices.Equal(svc.Command, []string{"serve", "--config", "/etc/ticketingd/ticketingd.yaml", "--data-dir", "/var/lib/ticketingd"}) {
			t.Errorf("%s: %+v", id, svc)
		}
		// Every file the node's config names is mounted, from the bundle;
		// its data directory read-write.
		mounted := map[string]string{}
		for _, v := range svc.Volumes {
			parts := strings.Split(v, ":")
			src := strings.TrimPrefix(parts[0], "./")
			if _, ok := p.files[src]; !ok {
				t.Errorf("%s: mounts %s, not in the bundle", id, src)
			}
			mounted[parts[1]] = src
			if (parts[1] == "/var/lib/ticketingd") == (len(parts) == 3 && parts[2] == "ro") {
				t.Errorf("%s: volume %s", id, v)
			}
		}
		c := p.config(t, id+"/"+ConfigFile)
		for _, f := range []string{ConfigFile, c.ClientTokensFile, c.TLSCert, c.TLSKey, c.PeerTLSCert, c.PeerTLSKey, c.PeerTLSCA} {
			if mounted["/etc/ticketingd/"+f] != id+"/"+f {
				t.Errorf("%s: %s is not mounted from %s/%s: %v", id, f, id, f, mounted)
			}
		}
		if mounted["/var/lib/ticketingd"] != id+"/"+DataDir {
			t.Errorf("%s: data volume %v", id, mounted)
		}
	}
	df := string(p.files[DockerfileFile].Data)
	if !strings.Contains(df, "\nFROM scratch\n") || !strings.Contains(df, "\nCOPY ticketingd /usr/local/bin/ticketingd\n") || strings.Contains(df, "RUN") {
		t.Errorf("Dockerfile:\n%s", df)
	}
	if di := string(p.files[DockerIgnore].Data); !strings.Contains(di, "\n*\n!ticketingd\n") {
		t.Errorf(".dockerignore lets more than the binary in:\n%s", di)
	}
	readme := string(p.files[ReadmeFile].Data)
	for _, w := range []string{"systemctl enable --now ticketingd-n1.service", "docker compose up -d", "ticketingd serve --config n3/ticketingd.yaml",
		"broker.ParseURL(os.Getenv(\"TICKETING_URL\"))", "export TICKETING_URL=\"ticketing://$(grep -m 1 -v -e '^#' -e '^[[:space:]]*$' n1/client-tokens)@\"'127.0.0.1:5225,127.0.0.1:5226,127.0.0.1:5227?ca=",
		"It was written by `ticketingd init`."} {
		if !strings.Contains(readme, w) {
			t.Errorf("README.md lacks %q:\n%s", w, readme)
		}
	}
}

// TestReadmeURL: the README's line that sets TICKETING_URL, run by sh in
// the written bundle, gives the bundle's URL with its client token as it
// is (the tokens file starts with comment lines); the README itself holds
// no token. A front end's name is the "written by" of the bundle's files.
func TestReadmeURL(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	for _, s := range []Spec{single(""), cluster3("")} {
		dir := filepath.Join(t.TempDir(), "bundle dir")
		s.Dir = dir
		p := mustPlan(t, s)
		if err := p.WriteDir(dir, false); err != nil {
			t.Fatal(err)
		}
		readme := string(p.files[ReadmeFile].Data)
		var line string
		for l := range strings.Lines(readme) {
			if strings.HasPrefix(l, "export TICKETING_URL=") {
				line = l
			}
		}
		cmd := exec.Command("sh", "-c", line+`printf %s "$TICKETING_URL"`)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil || string(out) != p.URL || !strings.Contains(p.URL, "://"+p.tok0(t)+"@") {
			t.Errorf("%s: the README's line %q gives %q (%v), want %q", s.Topology, line, out, err, p.URL)
		}
		if strings.Contains(readme, p.tok0(t)) {
			t.Errorf("%s: the README holds the client token", s.Topology)
		}
	}
	s := cluster3(t.TempDir())
	s.Frontend = "the web console (/deploy)"
	p := mustPlan(t, s)
	for _, f := range []string{ReadmeFile, DockerfileFile, ComposeFile, "n1/" + ConfigFile, unitFile(nodeRun{id: "n1", dir: "n1"})} {
		if d := string(p.files[f].Data); !strings.Contains(d, "written by the web console (/deploy)") || strings.Contains(d, "ticketingd init") {
			t.Errorf("%s written by the console:\n%s", f, d)
		}
	}
}

// tok0 is the bundle's first client token.
func (p planned) tok0(t *testing.T) string {
	t.Helper()
	f, ok := p.files[TokensFile]
	if !ok {
		f = p.files["n1/"+TokensFile]
	}
	for l := range strings.Lines(string(f.Data)) {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return l
		}
	}
	t.Fatal("no client token")
	return ""
}

// TestWriteDir: the files with their exact modes under any umask; a
// second write refuses (ExistsError) unless forced.
func TestWriteDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bundle")
	p := mustPlan(t, cluster3(dir))
	if err := p.WriteDir(dir, false); err != nil {
		t.Fatal(err)
	}
	for _, f := range p.Files {
		st, err := os.Stat(filepath.Join(dir, f.Path))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != f.Mode {
			t.Errorf("%s: mode %v, want %v", f.Path, st.Mode(), f.Mode)
		}
		if !f.Mode.IsDir() {
			if b, _ := os.ReadFile(filepath.Join(dir, f.Path)); !bytes.Equal(b, f.Data) {
				t.Errorf("%s: other content", f.Path)
			}
		}
	}
	again := mustPlan(t, cluster3(dir))
	var ee *ExistsError
	if err := again.WriteDir(dir, false); !errors.As(err, &ee) || ee.Dir != dir {
		t.Fatalf("second WriteDir: %v, want an ExistsError", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, TokensFile)); !bytes.Equal(b, p.files[TokensFile].Data) {
		t.Error("the refused WriteDir changed the tokens")
	}
	if err := again.WriteDir(dir, true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, TokensFile)); !bytes.Equal(b, again.files[TokensFile].Data) {
		t.Error("the forced WriteDir kept the old tokens")
	}
}

// TestArchives reads the tar.gz and the zip back: every file and
// directory under the bundle's directory name, with its mode and content.
func TestArchives(t *testing.T) {
	p := mustPlan(t, pair2("/srv/locks"))
	want := map[string]File{"locks": {Mode: fs.ModeDir | 0o755}}
	for _, f := range p.Files {
		want["locks/"+f.Path] = f
	}
	check := func(kind, name string, mode fs.FileMode, data []byte) {
		t.Helper()
		name = strings.TrimSuffix(name, "/")
		f, ok := want[name]
		if !ok {
			t.Errorf("%s: unexpected %s", kind, name)
			return
		}
		delete(want, name)
		if mode != f.Mode || !bytes.Equal(data, f.Data) {
			t.Errorf("%s: %s mode %v (want %v), same content %v", kind, name, mode, f.Mode, bytes.Equal(data, f.Data))
		}
	}

	var buf bytes.Buffer
	if err := p.WriteTarGz(&buf); err != nil {
		t.Fatal(err)
	}
	entries, err := deploytest.ReadTarGz(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		check("tar.gz", e.Name, e.Mode, e.Data)
	}
	if len(want) != 0 {
		t.Errorf("tar.gz lacks %v", slices.Sorted(maps.Keys(want)))
	}

	want = map[string]File{"locks": {Mode: fs.ModeDir | 0o755}}
	for _, f := range p.Files {
		want["locks/"+f.Path] = f
	}
	buf.Reset()
	if err := p.WriteZip(&buf); err != nil {
		t.Fatal(err)
	}
	if entries, err = deploytest.ReadZip(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		check("zip", e.Name, e.Mode, e.Data)
	}
	if len(want) != 0 {
		t.Errorf("zip lacks %v", slices.Sorted(maps.Keys(want)))
	}
}

// TestAdd: nodes added to a written cluster bundle get its CAs and
// tokens, the next free ports on a shared host, state existing and no
// peers; only their directories are planned.
func TestAdd(t *testing.T) {
	dir := t.TempDir()
	s := cluster3(dir)
	s.Port, s.PeerPort, s.AdminPort = 16000, 17000, 19000
	p := mustPlan(t, s)
	if err := p.WriteDir(dir, false); err != nil {
		t.Fatal(err)
	}
	ex, err := LoadCluster(dir)
	if err != nil {
		t.Fatal(err)
	}
	if port, raft, admin := ex.BasePorts(); port != 16000 || raft != 17000 || admin != 19000 || ex.ClusterID != p.GroupID {
		t.Errorf("base ports %d %d %d, cluster %q", port, raft, admin, ex.ClusterID)
	}
	add := DefaultSpec(Cluster)
	add.Dir, add.Existing = dir, ex
	add.Port, add.PeerPort, add.AdminPort = ex.BasePorts()
	add.Nodes = []Node{{ID: "n2", Host: "127.0.0.1"}}
	if err := Validate(add); err == nil || !strings.Contains(err.Error(), "has a node n2 already") {
		t.Errorf("adding n2 again: %v", err)
	}
	add.Nodes = []Node{{ID: "n4", Host: "127.0.0.1"}}
	a := mustPlan(t, add)
	a.checkFiles(t, nodeFiles("n4", ServerCert, ServerKey, NodeCert, NodeKey, ClusterCACert))
	c := a.config(t, "n4/"+ConfigFile)
	if c.InitialState != "existing" || len(c.Peers) != 0 || c.ClusterID != p.GroupID || c.Listen != "127.0.0.1:16003" || c.RaftListen != "127.0.0.1:17003" ||
		c.AdminListen != "127.0.0.1:19003" || c.AdminToken != strings.TrimSpace(string(p.files[AdminTokenFile].Data)) {
		t.Errorf("n4: config %+v", redact(c))
	}
	a.verify(t, "n4/"+NodeCert, "n4/"+ClusterCACert, "127.0.0.1", x509.ExtKeyUsageClientAuth)
	if !bytes.Equal(a.files["n4/"+ClusterCACert].Data, p.files[ClusterCACert].Data) {
		t.Error("n4 has another cluster CA")
	}
	tok := tokens(p.files[TokensFile].Data)[0]
	if strings.Contains(a.Guide, tok) || !strings.Contains(a.Guide, "ticketingd cluster add n4=127.0.0.1:17003 --admin 127.0.0.1:19000,127.0.0.1:19001,127.0.0.1:19002") {
		t.Errorf("add guide:\n%s", a.Guide)
	}
	// A bundle without CAs or admin token, its tokens from 1: the added
	// node is as its nodes.
	dir = t.TempDir()
	s = cluster3(dir)
	s.TLS, s.PeerTLS, s.AdminToken, s.TokenStart = TLSOff, false, false, "one"
	if err := mustPlan(t, s).WriteDir(dir, false); err != nil {
		t.Fatal(err)
	}
	if ex, err = LoadCluster(dir); err != nil {
		t.Fatal(err)
	}
	add = DefaultSpec(Cluster)
	add.Dir, add.Existing, add.Nodes = dir, ex, []Node{{ID: "n4", Host: "127.0.0.1"}}
	a = mustPlan(t, add)
	a.checkFiles(t, nodeFiles("n4"))
	if c := a.config(t, "n4/"+ConfigFile); c.TLSCert != "" || c.PeerTLSCA != "" || c.AdminToken != "" || c.TokenStart != "one" || c.InitialState != "existing" || c.Listen != "127.0.0.1:5228" {
		t.Errorf("n4 of a plain bundle: config %+v", redact(c))
	}
	if _, err := LoadCluster(t.TempDir()); !errors.Is(err, ErrNotBundle) {
		t.Errorf("LoadCluster of an empty directory: %v, want ErrNotBundle", err)
	}
}

// TestSystemdAnalyze has systemd check a node's unit, where
// systemd-analyze is installed: 'verify' (with ExecStart on an executable
// that exists here, this test's) and the offline 'security' exposure at
// most 2.0 of 10.
func TestSystemdAnalyze(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze")
	}
	p := mustPlan(t, cluster3(t.TempDir()))
	unit := strings.ReplaceAll(string(p.files["n1/"+NodeUnitFile("n1")].Data), InstallBinary, os.Args[0])
	path := filepath.Join(t.TempDir(), NodeUnitFile("n1"))
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(sa, "verify", path).CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	if out, err := exec.Command(sa, "security", "--offline=true", "--threshold=20", path).CombinedOutput(); err != nil {
		t.Errorf("systemd-analyze security: exposure above 2.0 (%v):\n%s", err, out)
	}
}

// TestArchivesUnpacked unpacks the archives with the tar and unzip an
// operator has, where installed: the files come out with their modes
// (secrets 0600) and contents, under the bundle's directory name.
func TestArchivesUnpacked(t *testing.T) {
	p := mustPlan(t, cluster3("/srv/locks"))
	for _, tool := range []struct {
		name  string
		write func(io.Writer) error
		args  func(archive, dir string) []string
	}{
		{"tar", p.WriteTarGz, func(a, d string) []string { return []string{"-xzf", a, "-C", d} }},
		{"unzip", p.WriteZip, func(a, d string) []string { return []string{"-q", a, "-d", d} }},
	} {
		t.Run(tool.name, func(t *testing.T) {
			bin, err := exec.LookPath(tool.name)
			if err != nil {
				t.Skipf("no %s", tool.name)
			}
			dir := t.TempDir()
			archive := filepath.Join(dir, "bundle")
			var buf bytes.Buffer
			if err := tool.write(&buf); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(archive, buf.Bytes(), 0o600); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(bin, tool.args(archive, dir)...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", tool.name, err, out)
			}
			for _, f := range p.Files {
				name := filepath.Join(dir, "locks", f.Path)
				st, err := os.Stat(name)
				if err != nil {
					t.Error(err)
					continue
				}
				// The umask may narrow a directory or a public file, never
				// widen a secret.
				if f.Secret && st.Mode() != f.Mode || st.Mode()&^f.Mode != 0 {
					t.Errorf("%s: mode %v, want %v", f.Path, st.Mode(), f.Mode)
				}
				if !f.Mode.IsDir() {
					if b, _ := os.ReadFile(name); !bytes.Equal(b, f.Data) {
						t.Errorf("%s: other content", f.Path)
					}
				}
			}
		})
	}
}

// TestDockerBuild builds the image of a bundle's Dockerfile, where a
// Docker daemon answers, from a static binary and without network, and
// runs 'ticketingd version' in it. It skips without a daemon (also under
// CI: the image must build offline wherever one is, and a machine without
// one has nothing to say about it).
func TestDockerBuild(t *testing.T) {
	docker, err := exec.LookPath("docker")
	if err != nil {
		t.Skip("no docker")
	}
	if out, err := exec.Command(docker, "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("no Docker daemon: %v: %s", err, bytes.TrimSpace(out))
	}
	dir := t.TempDir()
	if err := mustPlan(t, single(dir)).WriteDir(dir, false); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, BinaryName), "github.com/ticketing-dev/ticketing/cmd/ticketingd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	tag := "ticketingd-deploy-test:" + strings.ToLower(strings.ReplaceAll(filepath.Base(dir), "_", "-"))
	if out, err := exec.Command(docker, "build", "--network", "none", "-t", tag, dir).CombinedOutput(); err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	defer exec.Command(docker, "rmi", "-f", tag).Run()
	out, err := exec.Command(docker, "run", "--rm", "--network", "none", tag, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "ticketingd ") {
		t.Errorf("docker run %s version: %v\n%s", tag, err, out)
	}
}

// TestPreviewMasks: a preview of every file of a bundle, its guide and URL
// shows no token and no private key, and every secret file is masked.
func TestPreviewMasks(t *testing.T) {
	s1 := single(t.TempDir())
	s1.AdminToken, s1.ClientTokens, s1.TLS = true, 3, TLSPrivateCA
	for _, s := range []Spec{cluster3(t.TempDir()), pair2(t.TempDir()), s1} {
		p := mustPlan(t, s)
		secrets := tokens(p.files[TokensFile].Data)
		if f, ok := p.files[AdminTokenFile]; ok {
			secrets = append(secrets, strings.TrimSpace(string(f.Data)))
		}
		if len(secrets) < 2 {
			t.Fatalf("%s: secrets %d", s.Topology, len(secrets))
		}
		texts := map[string]string{"guide": p.Mask(p.Guide), "url": p.Mask(p.URL)}
		for _, f := range p.Files {
			if f.Mode.IsDir() {
				continue
			}
			texts[f.Path] = p.Preview(f)
			if f.Secret && texts[f.Path] == string(f.Data) {
				t.Errorf("%s: %s is secret and shown as it is", s.Topology, f.Path)
			}
		}
		for name, text := range texts {
			for _, sec := range secrets {
				if strings.Contains(text, sec) {
					t.Errorf("%s: the preview of %s shows a token", s.Topology, name)
				}
			}
			if strings.Contains(text, "PRIVATE KEY-----") {
				t.Errorf("%s: the preview of %s shows a private key", s.Topology, name)
			}
		}
		if !strings.Contains(texts["url"], Hidden+"@") {
			t.Errorf("%s: masked URL %q", s.Topology, texts["url"])
		}
	}
}

// TestRootIsOneSafeName: the archives' top directory is one element that
// every archive reader accepts, even for a Bundle whose Dir was never
// validated: ".." or a name with backslashes gives the default.
func TestRootIsOneSafeName(t *testing.T) {
	for dir, want := range map[string]string{
		"/srv/locks": "locks", "/srv/locks/": "locks", "locks": "locks", ".": "ticketing", "/": "ticketing",
		"..": "ticketing", "/srv/..": "ticketing", "/srv/x/..": "srv", `..\..\Windows\evil`: "ticketing", "/srv/a\nb": "ticketing", "C:": "ticketing",
	} {
		if got := (&Bundle{Dir: dir}).Root(); got != want {
			t.Errorf("Root of %q = %q, want %q", dir, got, want)
		}
	}
}

// TestKubernetesSpec: the manifests are in k8s/ only when asked for, and
// what Kubernetes cannot run is refused naming its field (the manifests
// themselves are decoded with the Kubernetes API types in k8stest).
func TestKubernetesSpec(t *testing.T) {
	cluster := DefaultSpec(Cluster)
	cluster.Dir = t.TempDir()
	cluster.Nodes = []Node{{ID: "a", Host: "10.0.0.1"}, {ID: "b", Host: "10.0.0.2"}, {ID: "c", Host: "10.0.0.3"}}
	b, err := Plan(cluster)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range b.Files {
		if strings.HasPrefix(f.Path, KubeDir+"/") {
			t.Errorf("%s without Spec.Kubernetes", f.Path)
		}
	}
	k := &Kubernetes{}
	cluster.Kubernetes = k
	if b, err = Plan(cluster); err != nil {
		t.Fatal(err)
	}
	if *k != (Kubernetes{}) {
		t.Errorf("Plan changed the caller's Kubernetes: %+v", *k)
	}
	if !strings.Contains(b.Guide, "kubectl apply -k "+cluster.Dir+"/k8s/") || !slices.ContainsFunc(b.Warnings, func(w string) bool { return strings.Contains(w, DefaultKubeImage) }) {
		t.Errorf("guide or warnings do not say how to apply the manifests, or that the image is a placeholder:\n%s\n%q", b.Guide, b.Warnings)
	}
	var names []string
	for _, f := range b.Files {
		if strings.HasPrefix(f.Path, KubeDir+"/") {
			names = append(names, f.Path)
			if strings.Contains(f.Path, "secret") != f.Secret {
				t.Errorf("%s: Secret %v", f.Path, f.Secret)
			}
		}
	}
	if len(names) != 6 {
		t.Errorf("k8s files %v, want the Secret, ConfigMap, Services, StatefulSet, PodDisruptionBudget and kustomization", names)
	}
	if p := b.Preview(File{Path: "k8s/secret.yaml", Data: []byte("x: " + b.tokens[0]), Secret: true}); strings.Contains(p, b.tokens[0]) {
		t.Errorf("preview shows a token: %s", p)
	}

	pair := DefaultSpec(Pair)
	pair.Dir = t.TempDir()
	pair.Nodes = []Node{{ID: RolePrimary, Host: "10.0.0.1"}, {ID: RoleBackup, Host: "10.0.0.2"}}
	pair.Kubernetes = &Kubernetes{}
	single := DefaultSpec(Single)
	single.Dir = t.TempDir()
	single.Kubernetes = &Kubernetes{}
	own := DefaultSpec(Single)
	own.Dir, own.AdminToken, own.TLS = t.TempDir(), true, TLSOwn
	own.OwnTLS = OwnTLS{CertFile: "/etc/c.pem", KeyFile: "/etc/k.pem"}
	own.Kubernetes = &Kubernetes{}
	badNS := cluster
	badNS.Kubernetes = &Kubernetes{Namespace: "Prod_1"}
	badImage := cluster
	badImage.Kubernetes = &Kubernetes{Image: "ticketingd:1\nrm"}
	for _, c := range []struct {
		name  string
		s     Spec
		field string
	}{
		{"pair", pair, "kubernetes"},
		{"single without admin token", single, "admin_token"},
		{"own TLS files", own, "kubernetes"},
		{"namespace", badNS, "kubernetes.namespace"},
		{"image", badImage, "kubernetes.image"},
	} {
		err := Validate(c.s)
		var fes FieldErrors
		if !errors.As(err, &fes) || !slices.ContainsFunc(fes, func(fe *FieldError) bool { return fe.Field == c.field }) {
			t.Errorf("%s: %v, want an error of %s", c.name, err, c.field)
		}
	}
}
