package console

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ticketing-dev/ticketing/internal/deploy"
	"github.com/ticketing-dev/ticketing/internal/httpjson"
)

// The deployment page's planner: POST /v1/deploy (DeployPath).

// DeployPath is the path the deployment page posts its form to.
const DeployPath = "/v1/deploy"

// MaxDeployBody is the largest request body POST /v1/deploy reads (413
// beyond).
const MaxDeployBody = 64 << 10

// DeployErrorResponse is the answer of POST /v1/deploy to a request it
// refuses: Error says why, Fields (400 for a form with problems) has the
// messages by form field, named as deploy.FieldError names them
// ("nodes[1].host").
type DeployErrorResponse struct {
	Error  string              `json:"error"`
	Fields map[string][]string `json:"fields,omitempty"`
}

// DeployFile is a file of a planned bundle in the deployment page's
// preview.
type DeployFile struct {
	Path   string `json:"path"`   // slash-separated, in the bundle's directory
	Mode   string `json:"mode"`   // octal: "0600"
	Size   int    `json:"size"`   // bytes
	Secret bool   `json:"secret"` // a private key, a token or a config holding one
	Text   string `json:"text"`   // the content
	Masked string `json:"masked"` // the content with its secrets hidden (deploy.Bundle.Preview)
}

// DeployResponse is the answer (200) of POST /v1/deploy: a bundle
// planned from the form, its preview and both archives, in one answer,
// so that the server keeps nothing of it: what the page previews is what
// it downloads, and a new request plans new keys and tokens.
type DeployResponse struct {
	Dir         string       `json:"dir"` // the Spec's Dir
	URL         string       `json:"url"` // TICKETING_URL, with the first client token
	URLMasked   string       `json:"url_masked"`
	Guide       string       `json:"guide"` // what 'ticketingd init' prints
	GuideMasked string       `json:"guide_masked"`
	Warnings    []string     `json:"warnings"`
	Files       []DeployFile `json:"files"`
	// TarGz and Zip are the archives, base64, named TarGzName and
	// ZipName (the bundle directory's base name).
	TarGz     string `json:"tar_gz"`
	TarGzName string `json:"tar_gz_name"`
	Zip       string `json:"zip"`
	ZipName   string `json:"zip_name"`
}

// sameOrigin refuses (403, and returns false) a request that a browser
// says comes from another site: Sec-Fetch-Site other than same-origin or
// none (typed by the user), or an Origin whose host:port is not the
// request's Host. Together with the JSON content type required of the
// body, which no cross-origin page can send without a CORS preflight that
// the console never grants, a page on another site cannot make the
// operator's browser post.
func sameOrigin(w http.ResponseWriter, r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		writeJSONError(w, http.StatusForbidden, DeployErrorResponse{Error: "cross-site request refused (Sec-Fetch-Site: " + s + ")"})
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			writeJSONError(w, http.StatusForbidden, DeployErrorResponse{Error: "cross-origin request refused (Origin " + o + ")"})
			return false
		}
	}
	if !httpjson.IsJSON(r) {
		writeJSONError(w, http.StatusUnsupportedMediaType, DeployErrorResponse{Error: "want Content-Type: application/json"})
		return false
	}
	return true
}

// DeployFrontend is the "written by" of the bundles the deployment page
// plans (deploy.Spec.Frontend).
const DeployFrontend = "the web console's deployment page (/deploy)"

// deployHandler plans a bundle: POST /v1/deploy with a deploy.Spec as
// JSON. It logs one line per request, without a secret: the topology and
// the outcome.
func deployHandler(log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !sameOrigin(w, r) {
			log.Warn("console: deploy request refused", "remote", r.RemoteAddr, "origin", r.Header.Get("Origin"), "sec_fetch_site", r.Header.Get("Sec-Fetch-Site"))
			return
		}
		var spec deploy.Spec
		if code, err := httpjson.Decode(w, r, MaxDeployBody, &spec); err != nil {
			writeJSONError(w, code, DeployErrorResponse{Error: err.Error()})
			return
		}
		spec.Frontend = DeployFrontend
		var fes deploy.FieldErrors
		errors.As(deploy.Validate(spec), &fes)
		if spec.Dir != "" && !path.IsAbs(spec.Dir) && !filepath.IsAbs(spec.Dir) {
			// A relative directory would be taken from the console's own
			// working directory, which is not where the operator unpacks.
			fes = append(fes, &deploy.FieldError{Field: "dir", Msg: "want an absolute path: where the bundle will be unpacked on the server machines"})
		}
		var b *deploy.Bundle
		var err error
		if len(fes) == 0 {
			b, err = deploy.Plan(spec)
			errors.As(err, &fes)
		}
		if len(fes) > 0 {
			fields := fes.ByField()
			names := slices.Sorted(maps.Keys(fields))
			log.Info("console: deploy form has problems", "topology", string(spec.Topology), "fields", strings.Join(names, ","), "remote", r.RemoteAddr)
			writeJSONError(w, http.StatusBadRequest, DeployErrorResponse{Error: problems(len(fes)), Fields: fields})
			return
		}
		if err != nil {
			log.Error("console: deploy plan failed", "topology", string(spec.Topology), "err", err, "remote", r.RemoteAddr)
			writeJSONError(w, http.StatusInternalServerError, DeployErrorResponse{Error: "planning the bundle failed: " + err.Error()})
			return
		}
		resp, err := deployResponse(b)
		if err != nil {
			log.Error("console: deploy archive failed", "err", err, "remote", r.RemoteAddr)
			writeJSONError(w, http.StatusInternalServerError, DeployErrorResponse{Error: err.Error()})
			return
		}
		log.Info("console: deploy bundle planned", "topology", string(spec.Topology), "nodes", len(spec.Nodes), "tls", string(spec.TLS),
			"peer_tls", spec.PeerTLS, "files", len(resp.Files), "remote", r.RemoteAddr)
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	}
}

// problems says how many problems the form has.
func problems(n int) string {
	if n == 1 {
		return "1 problem in the form"
	}
	return fmt.Sprintf("%d problems in the form", n)
}

// deployResponse is the preview and the archives of b.
func deployResponse(b *deploy.Bundle) (*DeployResponse, error) {
	resp := &DeployResponse{Dir: b.Dir, URL: b.URL, URLMasked: b.Mask(b.URL), Guide: b.Guide, GuideMasked: b.Mask(b.Guide),
		Warnings: b.Warnings, Files: []DeployFile{}}
	if resp.Warnings == nil {
		resp.Warnings = []string{}
	}
	for _, f := range b.Files {
		if f.Mode.IsDir() {
			continue
		}
		resp.Files = append(resp.Files, DeployFile{Path: f.Path, Mode: fmt.Sprintf("%04o", f.Mode.Perm()), Size: len(f.Data),
			Secret: f.Secret, Text: string(f.Data), Masked: b.Preview(f)})
	}
	root := b.Root()
	var tgz, zip bytes.Buffer
	if err := b.WriteTarGz(&tgz); err != nil {
		return nil, err
	}
	if err := b.WriteZip(&zip); err != nil {
		return nil, err
	}
	resp.TarGz, resp.TarGzName = base64.StdEncoding.EncodeToString(tgz.Bytes()), root+".tar.gz"
	resp.Zip, resp.ZipName = base64.StdEncoding.EncodeToString(zip.Bytes()), root+".zip"
	return resp, nil
}

// writeJSONError answers code with v as JSON.
func writeJSONError(w http.ResponseWriter, code int, v DeployErrorResponse) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
