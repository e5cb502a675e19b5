package console_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/deploy"
	"github.com/ticketing-dev/ticketing/internal/deploy/deploytest"
	"github.com/ticketing-dev/ticketing/server/admin/console"
)

// post sends POST /v1/deploy with body to h, with the headers of the
// page's own fetch (JSON, same origin) changed by hdr ("" deletes one).
func post(h http.Handler, body string, hdr map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", console.DeployPath, strings.NewReader(body))
	req.Host = "127.0.0.1:9300"
	req.RemoteAddr = "127.0.0.1:40000"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", "http://127.0.0.1:9300")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// clusterSpec is the JSON of the page's form for three nodes on
// 127.0.0.1 with TLS, peer TLS, an admin token and the lock browser.
const clusterSpec = `{"topology":"cluster","dir":"/srv/locks","port":15225,"peer_port":17225,"admin_port":19225,
	"tls":"private-ca","peer_tls":true,"client_tokens":2,"admin_token":true,"console_keys":true,"token_start":"clock",
	"nodes":[{"id":"n1","host":"127.0.0.1"},{"id":"n2","host":"127.0.0.1"},{"id":"n3","host":"127.0.0.1"}]}`

func planned(t *testing.T, h http.Handler, spec string) console.DeployResponse {
	t.Helper()
	rec := post(h, spec, nil)
	if rec.Code != 200 {
		t.Fatalf("POST %s: %d %s", spec, rec.Code, rec.Body)
	}
	var resp console.DeployResponse
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestDeployBadInput: a form with problems gets 400 with a message per
// field, named as the form names its inputs; a body that is not a spec
// gets 400 (413 if too large) with a message; never a 500.
func TestDeployBadInput(t *testing.T) {
	h := console.New(console.Options{})
	for _, c := range []struct {
		name, body string
		code       int
		fields     []string // the fields with a message, exactly
		msg        string   // in the error
	}{
		{"empty spec", `{}`, 400, []string{"dir", "client_tokens", "topology"}, "in the form"},
		{"bad topology and tls", `{"topology":"ring","tls":"maybe","dir":"/d","client_tokens":1}`, 400, []string{"topology", "tls"}, "in the form"},
		{"relative dir", `{"topology":"single","dir":"bundle","client_tokens":1}`, 400, []string{"dir"}, "in the form"},
		{"dir with backslashes", `{"topology":"single","dir":"/..\\..\\Windows\\evil","client_tokens":1}`, 400, []string{"dir"}, "in the form"},
		{"relative dir with backslashes", `{"topology":"single","dir":"..\\..\\Windows\\evil","client_tokens":1}`, 400, []string{"dir"}, "in the form"},
		{"dir with a newline", `{"topology":"single","dir":"/srv/locks\nrm -rf /","client_tokens":1}`, 400, []string{"dir"}, "in the form"},
		{"dir with a NUL", `{"topology":"single","dir":"/srv/locks\u0000","client_tokens":1}`, 400, []string{"dir"}, "in the form"},
		{"dir with a drive letter", `{"topology":"single","dir":"C:/locks","client_tokens":1}`, 400, []string{"dir"}, "in the form"},
		{"dir with ..", `{"topology":"single","dir":"/srv/locks/..","client_tokens":1}`, 400, []string{"dir"}, "in the form"},
		{"dir with an empty element", `{"topology":"cluster","dir":"/srv//locks","client_tokens":1,"tls":"private-ca",
			"nodes":[{"id":"n1","host":"127.0.0.1"},{"id":"n2","host":"127.0.0.1"},{"id":"n3","host":"127.0.0.1"}]}`, 400, []string{"dir"}, "in the form"},
		{"node ID ..", `{"topology":"cluster","dir":"/srv/locks","client_tokens":1,"tls":"private-ca",
			"nodes":[{"id":"n1","host":"127.0.0.1"},{"id":"..","host":"127.0.0.1"},{"id":"n3","host":"127.0.0.1"}]}`, 400, []string{"nodes[1].id"}, "in the form"},
		{"own TLS file with a newline", `{"topology":"single","dir":"/d","client_tokens":1,"tls":"own","own_tls":{"cert_file":"/c.pem\nx","key_file":"/etc/../k.pem"}}`, 400,
			[]string{"own_tls.cert_file", "own_tls.key_file"}, "in the form"},
		{"node fields", `{"topology":"cluster","dir":"/d","client_tokens":1,"tls":"private-ca",
			"nodes":[{"id":"n/1","host":"127.0.0.1"},{"id":"n2","host":"127.0.0.1:5"},{"id":"n3","host":"127.0.0.1","admin_port":70000}]}`,
			400, []string{"nodes[0].id", "nodes[1].host", "nodes[2].admin_port"}, "in the form"},
		{"own TLS files", `{"topology":"single","dir":"/d","client_tokens":1,"tls":"own","own_tls":{"key_file":"k.pem"}}`, 400,
			[]string{"own_tls.cert_file", "own_tls.key_file"}, "in the form"},
		{"lock browser without admin token", `{"topology":"single","dir":"/d","client_tokens":1,"console_keys":true}`, 400, []string{"console_keys"}, "in the form"},
		{"ports", `{"topology":"single","dir":"/d","client_tokens":500,"port":70000,"admin_port":-1}`, 400, []string{"client_tokens", "port", "admin_port"}, "in the form"},
		{"not JSON", `topology=single`, 400, nil, "invalid request body"},
		{"a wrong type", `{"topology":"single","dir":"/d","port":"5225"}`, 400, nil, "invalid request body"},
		{"an unknown field", `{"topology":"single","dir":"/d","admin":true}`, 400, nil, `unknown field "admin"`},
		{"two values", `{} {}`, 400, nil, "more than one"},
		{"too large", `{"dir":"` + strings.Repeat("x", console.MaxDeployBody) + `"}`, 413, nil, "too large"},
	} {
		rec := post(h, c.body, nil)
		var e console.DeployErrorResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != c.code || !strings.Contains(e.Error, c.msg) {
			t.Errorf("%s: %d %s (%v); want %d with %q", c.name, rec.Code, rec.Body, err, c.code, c.msg)
			continue
		}
		for f, msgs := range e.Fields {
			if len(msgs) == 0 || msgs[0] == "" {
				t.Errorf("%s: %s has no message", c.name, f)
			}
		}
		got := slices.Sorted(maps.Keys(e.Fields))
		if want := slices.Sorted(slices.Values(c.fields)); !slices.Equal(got, want) {
			t.Errorf("%s: fields %q, want %q (%s)", c.name, got, want, rec.Body)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", c.name, ct)
		}
	}
}

// TestDeployCrossSite: a post that a browser marks as cross-site, from
// another origin, or that is not declared JSON (what a cross-site form or
// a no-cors fetch can send without a preflight) is refused, 403 or 415,
// before anything is planned.
func TestDeployCrossSite(t *testing.T) {
	var logs bytes.Buffer
	h := console.New(console.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for _, c := range []struct {
		name string
		hdr  map[string]string
		code int
	}{
		{"the page's own", nil, 200},
		{"no Origin, no Sec-Fetch-Site (curl)", map[string]string{"Origin": "", "Sec-Fetch-Site": ""}, 200},
		{"typed by the user", map[string]string{"Sec-Fetch-Site": "none", "Origin": ""}, 200},
		{"cross-site", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": ""}, 403},
		{"same-site, another port", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:8080"}, 403},
		{"another origin, old browser", map[string]string{"Sec-Fetch-Site": "", "Origin": "http://evil.example"}, 403},
		{"null origin", map[string]string{"Sec-Fetch-Site": "", "Origin": "null"}, 403},
		{"a form's content type", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
		{"text/plain", map[string]string{"Content-Type": "text/plain"}, 415},
		{"multipart", map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, 415},
		{"no content type", map[string]string{"Content-Type": ""}, 415},
	} {
		rec := post(h, clusterSpec, c.hdr)
		if rec.Code != c.code {
			t.Errorf("%s: %d, want %d: %.200s", c.name, rec.Code, c.code, rec.Body)
		}
		if c.code != 200 && strings.Contains(rec.Body.String(), "BEGIN") {
			t.Errorf("%s: refused, and yet planned", c.name)
		}
	}
	if !strings.Contains(logs.String(), "console: deploy request refused") {
		t.Errorf("no log of the refusals:\n%s", logs.String())
	}
	// GET of the planner: the mux's 405.
	if rec := get(h, "GET", console.DeployPath, "127.0.0.1:9300", "127.0.0.1:9300"); rec.Code != 405 {
		t.Errorf("GET %s: %d, want 405", console.DeployPath, rec.Code)
	}
}

// TestDeployPlan: a good form gets the preview of every file, with its
// secrets masked in Masked (and only there), the URL and the guide, both
// archives, which unpack to exactly those files with their modes (the
// secrets 0600), with Cache-Control: no-store. Two posts of the same form
// get different secrets: nothing is kept or cached.
func TestDeployPlan(t *testing.T) {
	h := console.New(console.Options{})
	rec := post(h, clusterSpec, nil)
	if rec.Code != 200 || rec.Header().Get("Cache-Control") != "no-store" || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
	resp := planned(t, h, clusterSpec)
	files := map[string]console.DeployFile{}
	for _, f := range resp.Files {
		files[f.Path] = f
	}
	tokens := strings.Fields(strings.Join(slices.DeleteFunc(strings.Split(files[deploy.TokensFile].Text, "\n"),
		func(l string) bool { return strings.HasPrefix(l, "#") }), " "))
	admin := strings.TrimSpace(files[deploy.AdminTokenFile].Text)
	if len(tokens) != 2 || admin == "" || !strings.Contains(resp.URL, tokens[0]+"@127.0.0.1:15225,127.0.0.1:15226,127.0.0.1:15227?ca=/srv/locks/ca.pem") {
		t.Fatalf("tokens %d, admin %q, URL %q", len(tokens), admin, resp.URL)
	}
	secrets := append(tokens, admin)
	for _, want := range []string{"ca.pem", "ca-key.pem", "n1/ticketingd.yaml", "n2/node-key.pem", "n3/server.pem", "compose.yaml", "README.md", "Dockerfile", "n1/ticketingd-n1.service"} {
		if _, ok := files[want]; !ok {
			t.Errorf("no %s in the preview", want)
		}
	}
	// Written by the console, and its files say so.
	for _, f := range []string{"README.md", "n1/ticketingd.yaml", "compose.yaml", "n1/ticketingd-n1.service"} {
		if d := files[f].Text; !strings.Contains(d, "written by "+console.DeployFrontend) || strings.Contains(d, "ticketingd init") {
			t.Errorf("%s does not say the console wrote it:\n%s", f, d)
		}
	}
	if !strings.Contains(files["n2/ticketingd.yaml"].Text, "console-keys: true") {
		t.Errorf("n2's config without console-keys:\n%s", files["n2/ticketingd.yaml"].Text)
	}
	for _, f := range resp.Files {
		shown := f.Masked
		for _, s := range secrets {
			if strings.Contains(shown, s) {
				t.Errorf("%s: the masked preview shows a token", f.Path)
			}
		}
		if strings.Contains(shown, "PRIVATE KEY-----") {
			t.Errorf("%s: the masked preview shows a private key", f.Path)
		}
		if f.Secret != (f.Mode == "0600") || f.Size != len(f.Text) {
			t.Errorf("%s: secret %v, mode %s, size %d of %d", f.Path, f.Secret, f.Mode, f.Size, len(f.Text))
		}
		if f.Secret && f.Masked == f.Text {
			t.Errorf("%s: secret, not masked", f.Path)
		}
	}
	for _, s := range secrets {
		if strings.Contains(resp.URLMasked+resp.GuideMasked, s) {
			t.Error("the masked URL or guide shows a token")
		}
	}
	if !strings.Contains(resp.Guide, admin) || !strings.Contains(resp.URLMasked, deploy.Hidden+"@127.0.0.1:15225") {
		t.Errorf("guide without the admin token, or masked URL %q", resp.URLMasked)
	}

	// Both archives: the files of the preview, modes included.
	if resp.TarGzName != "locks.tar.gz" || resp.ZipName != "locks.zip" {
		t.Errorf("names %q %q", resp.TarGzName, resp.ZipName)
	}
	for name, got := range map[string]map[string]archived{"tar.gz": untar(t, resp.TarGz), "zip": unzip(t, resp.Zip)} {
		if len(got) != len(resp.Files) {
			t.Errorf("%s: %d files, want %d", name, len(got), len(resp.Files))
		}
		for _, f := range resp.Files {
			a, ok := got[path.Join("locks", f.Path)]
			if !ok || a.data != f.Text || a.mode != f.Mode {
				t.Errorf("%s: %s: %v, mode %s (want %s), same content %v", name, f.Path, ok, a.mode, f.Mode, a.data == f.Text)
			}
		}
	}

	again := planned(t, h, clusterSpec)
	if again.URL == resp.URL || again.TarGz == resp.TarGz {
		t.Error("a second plan of the same form has the same tokens: kept or cached")
	}
}

// archived is a regular file of an archive.
type archived struct {
	data, mode string
}

func untar(t *testing.T, b64 string) map[string]archived {
	t.Helper()
	return unpacked(t, b64, func(raw []byte) ([]deploytest.Entry, error) { return deploytest.ReadTarGz(bytes.NewReader(raw)) })
}

func unzip(t *testing.T, b64 string) map[string]archived {
	t.Helper()
	return unpacked(t, b64, deploytest.ReadZip)
}

// unpacked is the regular files of the base64 archive b64, read by read.
func unpacked(t *testing.T, b64 string, read func([]byte) ([]deploytest.Entry, error)) map[string]archived {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := read(raw)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]archived{}
	for _, e := range entries {
		if e.Mode.IsRegular() {
			out[e.Name] = archived{string(e.Data), modeText(e.Mode)}
		}
	}
	return out
}

func modeText(m fs.FileMode) string { return fmt.Sprintf("%04o", m.Perm()) }

// TestDeployLogsNoSecret: the planner logs a line per request, planned,
// refused or with problems, and no line has a token or a line of a
// private key (whatever the level).
func TestDeployLogsNoSecret(t *testing.T) {
	var logs bytes.Buffer
	h := console.New(console.Options{Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	var secrets []string
	for range 2 {
		resp := planned(t, h, clusterSpec)
		for _, f := range resp.Files {
			if !f.Secret {
				continue
			}
			for _, line := range strings.Split(f.Text, "\n") {
				if len(line) >= 20 && !strings.HasPrefix(line, "#") && !strings.Contains(line, ":") && !strings.HasPrefix(line, "-----") {
					secrets = append(secrets, line) // a token, a line of a key
				}
			}
		}
		secrets = append(secrets, strings.TrimSpace(strings.Split(resp.URL, "@")[0][len("ticketing://"):]))
	}
	post(h, `{"topology":"single","dir":"/d","client_tokens":1,"console_keys":true}`, nil)
	post(h, clusterSpec, map[string]string{"Sec-Fetch-Site": "cross-site"})
	out := logs.String()
	for _, want := range []string{`"msg":"console: deploy bundle planned"`, `"topology":"cluster"`, `"msg":"console: deploy form has problems"`,
		`"fields":"console_keys"`, `"msg":"console: deploy request refused"`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s in the log:\n%s", want, out)
		}
	}
	if len(secrets) < 10 {
		t.Fatalf("only %d secrets found", len(secrets))
	}
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("the log has a secret (%.8s...):\n%s", s, out)
		}
	}
}
