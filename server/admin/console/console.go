package console

import (
	"embed"
	"encoding/json"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ticketing-dev/ticketing/server"
)

//go:embed assets
var assets embed.FS

// pages are the HTML templates of the embedded assets; their "page"
// function gives a page its title and navigation entry.
var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"page": func(d pageData, title, page string) pageView { return pageView{d, title, page} },
}).ParseFS(assets, "assets/*.html"))

// DefaultInterval is Options.Interval's default: the console's update
// period.
const DefaultInterval = time.Second

// CSP is the Content-Security-Policy of every answer: scripts, styles,
// images and connections (the event stream, fetch) from the page's own
// origin only; no inline script or style, no plugin, no frame; forms post
// to the same origin.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Node is what the console reads of a server: *server.Server has both
// methods (ClusterStatus returns server.ErrNotCluster on a node that is
// not a cluster node).
type Node interface {
	Stats() server.Stats
	ClusterStatus() (server.ClusterStatus, error)
}

// Options configures New. The zero value is the planning console: no
// server, loopback or not is the caller's concern.
type Options struct {
	// Node is the server the console shows; nil: none (ticketingd
	// console), and the page says "no server: planning only".
	Node Node

	// Version and Revision identify the binary (server/admin's
	// BuildInfo).
	Version, Revision string

	// Started is when the server started, for the uptime; zero: when New
	// was called.
	Started time.Time

	// Interval is the period of /v1/events; zero or negative:
	// DefaultInterval.
	Interval time.Duration

	// ShuttingDown, if non-nil, is asked before each event: once it
	// returns true, the event streams end (the browser reconnects to
	// whatever answers next), so that a graceful shutdown of the admin
	// listener need not wait for them.
	ShuttingDown func() bool

	// LoopbackOnly serves a request only if it arrived on a loopback
	// address and names a loopback Host (localhost, 127.0.0.0/8, ::1),
	// 403 otherwise: for a console that no admin token guards.
	LoopbackOnly bool

	// Routes are further handlers by http.ServeMux pattern ("GET
	// /v1/example"), served with the console's headers and access rule.
	// A pattern for "/deploy" (or "GET /deploy") replaces the built-in
	// deployment page and its planner (POST /v1/deploy).
	//
	// A route that changes anything (expire a lock) must refuse
	// cross-site requests: a browser sends its Basic login with every
	// request to the console's origin, a form that another site posts
	// included. Require a JSON body (Content-Type: application/json,
	// which a cross-origin page can send only after a CORS preflight that
	// nothing here grants), as server/admin's cluster changes do, or a
	// custom header the page's own script sets.
	Routes map[string]http.Handler

	// LockBrowser shows the lock browser's entry in the page's navigation
	// (its JSON, /v1/locks, comes through Routes or the mux the handler is
	// mounted on).
	LockBrowser bool

	// Logger gets a line per deployment plan (POST /v1/deploy): its
	// topology and outcome, never a key or a token. Nil: discard.
	Logger *slog.Logger
}

// Handler is the console (see the package documentation). It is safe for
// concurrent use.
type Handler struct {
	opts     Options
	interval time.Duration
	sampler  *sampler
	mux      *http.ServeMux
}

// New returns the console handler.
func New(opts Options) *Handler {
	if opts.Started.IsZero() {
		opts.Started = time.Now()
	}
	c := &Handler{opts: opts, interval: opts.Interval}
	if c.interval <= 0 {
		c.interval = DefaultInterval
	}
	if opts.Node != nil {
		c.sampler = newSampler(opts.Node)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", c.page("index.html"))
	mux.HandleFunc("GET /locks", c.page("locks.html"))
	if _, ok := opts.Routes["/deploy"]; !ok {
		if _, ok := opts.Routes["GET /deploy"]; !ok {
			mux.HandleFunc("GET /deploy", c.page("deploy.html"))
			mux.HandleFunc("POST "+DeployPath, deployHandler(log))
		}
	}
	static, _ := fs.Sub(assets, "assets")
	files := http.StripPrefix("/assets/", http.FileServerFS(static))
	mux.HandleFunc("GET /assets/{file}", func(w http.ResponseWriter, r *http.Request) {
		// The templates are pages, not files; and the file server's own
		// 404 would drop Cache-Control.
		name := r.PathValue("file")
		if st, err := fs.Stat(static, name); err != nil || st.IsDir() || strings.HasSuffix(name, ".html") {
			http.NotFound(w, r)
			return
		}
		files.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /v1/overview", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(c.Overview(time.Now()))
	})
	mux.HandleFunc("GET /v1/events", c.events)
	for pattern, h := range opts.Routes {
		mux.Handle(pattern, h)
	}
	c.mux = mux
	return c
}

// Patterns are the http.ServeMux patterns to mount the handler on in a
// mux of other paths (server/admin's): the console's own paths and the
// patterns of Options.Routes.
func (c *Handler) Patterns() []string {
	ps := []string{"/{$}", "/deploy", "/locks", "/assets/", "/v1/"}
	for p := range c.opts.Routes {
		if !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	return ps
}

// ServeHTTP serves the console: it sets the security headers, applies
// LoopbackOnly and routes.
func (c *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	// A path or method the console does not serve gets its 404 or 405
	// whatever the access: nothing is there to protect.
	if _, pattern := c.mux.Handler(r); pattern != "" && c.opts.LoopbackOnly && !loopbackRequest(r) {
		http.Error(w, "forbidden: without an admin token the console answers only on a loopback address (127.0.0.1, ::1, localhost); set --admin-token", http.StatusForbidden)
		return
	}
	c.mux.ServeHTTP(w, r)
}

// pageData is what the templates show.
type pageData struct {
	Planning    bool
	LockBrowser bool
	Version     string
}

// pageView is pageData with the page's title and its navigation entry.
type pageView struct {
	pageData
	Title, Page string
}

func (c *Handler) page(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = pages.ExecuteTemplate(w, name, pageData{Planning: c.opts.Node == nil, LockBrowser: c.opts.LockBrowser, Version: c.opts.Version})
	}
}

// loopbackRequest reports whether r arrived on a loopback address and
// names a loopback host.
func loopbackRequest(r *http.Request) bool {
	la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	host, _, err := net.SplitHostPort(la.String())
	if err != nil {
		return false
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return false
	}
	return IsLoopbackHost(r.Host)
}

// IsLoopbackHost reports whether a Host header (host or host:port) names
// this machine's loopback interface: localhost (with or without the final
// dot) or a loopback IP.
func IsLoopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
