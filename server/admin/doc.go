// Package admin is the HTTP admin interface of a Ticketing lock server: the
// handler that ticketingd serves on its admin listener (--admin-listen),
// for any program that embeds a server.Server.
//
//	srv, err := server.New(server.Config{DataDir: dir, Registerer: reg})
//	...
//	h := admin.New(srv, admin.Options{Gatherer: reg, Registerer: reg, Token: token})
//	ln, err := net.Listen("tcp", "127.0.0.1:9225")
//	...
//	go (&http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}).Serve(admin.LimitListener(ln, admin.ConnLimits{}))
//
// # Endpoints
//
//   - GET /healthz: 200 "ok\n" (text/plain) while the server is healthy
//     (on a cluster, a follower too: use /status's role to find the leader);
//     503 "shutting down\n" once Options.ShuttingDown says so; 503
//     "token store: ...\n" while server.Server.TokenStoreErr reports an
//     error (a standalone token store that cannot reserve tokens, a cluster
//     node whose raft has shut down, that was removed, or that cannot write
//     its log). For load-balancer and orchestrator probes: it never needs
//     the token.
//   - GET /status: a Status as indented JSON: the server's Stats, the
//     binary's BuildInfo and, on a cluster node, its server.ClusterStatus.
//   - GET /metrics: the Prometheus text format of Options.Gatherer (404
//     without one).
//   - POST /cluster/add and POST /cluster/remove, on a cluster node only
//     (404 elsewhere): add a voter (a ClusterAddRequest) or remove a node
//     (a ClusterRemoveRequest) through server.Server.AddVoter and
//     RemoveServer. 200 with a ClusterChangeResponse once the change is
//     committed; 409 with a NotLeaderResponse on a node that is not the
//     leader; 400 for a bad body or node (413 beyond MaxRequestBody); 404
//     on the leader for the removal of a node that is not in the
//     configuration; 504 when
//     the change did not commit within Options.ClusterChangeTimeout; 500
//     otherwise. The body must be declared Content-Type: application/json
//     (415 otherwise), and without Options.Token the request's Host must be
//     a loopback address (403 otherwise): a web page in the operator's
//     browser cannot make it post a change.
//   - The lock browser, with Options.ConsoleKeys (ticketingd's
//     --console-keys) and Options.Token only: key names can be sensitive.
//     Off, its routes answer 404 with an ErrorResponse saying how to turn
//     it on; on without a token, 403 (the token is required even on
//     loopback).
//   - GET /v1/locks?prefix=&after=&limit=: a LocksResponse, a page of
//     held locks sorted by key (bytewise) from server.Server.Locks: limit
//     1 to server.MaxLockPage (default server.DefaultLockPage); the next
//     page is after=next, or after_b64=next_b64 (prefix_b64 likewise),
//     for keys that are not UTF-8. 400 for a bad query.
//   - GET /v1/locks/{key}: a LockResponse, the holding and its waiters
//     in FIFO order (server.Server.Lock). The key is one path segment,
//     URL-escaped: '/' as %2F, '%' as %25, a key "." or ".." as %2E.
//     404 if it is not held.
//   - POST /v1/locks/{key}/expire with an ExpireRequest {"token": N}
//     (Content-Type: application/json, 415 otherwise): the operator's
//     expire now (server.Server.ExpireLock), logged by the server at Warn
//     with the remote address and the X-Ticketing-Operator header
//     (OperatorHeader). 200 with an ExpireResponse once it applied (the
//     next waiter holds the key with a higher token); 409 if the key is
//     held with another token; 404 if it is not held; 421 with a
//     MisdirectedResponse on a cluster follower (naming the leader) or a
//     pair's passive (naming the active); 504 if no answer came within
//     10 s (it may still apply).
//   - The web console (package console), unless Options.NoConsole: GET /
//     (the live page), /v1/overview (a console.Overview as JSON),
//     /v1/events (server-sent events, one Overview a second), /locks (the
//     lock browser's page), /deploy and POST /v1/deploy (the deployment
//     page and its planner, whose answers carry keys and tokens), and
//     /assets/..., and the handlers of Options.ConsoleRoutes (further
//     pages, such as the deployment page's). Without Options.Token the
//     console answers only on a loopback address and for a loopback Host
//     (403 otherwise); its answers carry a strict Content-Security-Policy,
//     nosniff and Cache-Control: no-store.
//
// Keys in the lock browser's JSON are bytes: key_b64 always (standard
// base64), key as text when they are valid UTF-8 (else ""). Tokens are
// JSON numbers, with token_text as decimal text for JavaScript, whose
// numbers do not hold every token exactly; an ExpireRequest takes either.
// Its answers carry Cache-Control: no-store.
//
// With Options.Token set, every request but GET /healthz must carry
// "Authorization: Bearer TOKEN" (the scheme is case-insensitive; the
// token is compared in constant time) or, as a browser sends it after
// asking, HTTP Basic authentication with the token as the password (any
// user name); anything else gets 401 with an ErrorResponse that says
// whether no token, no Bearer token or a wrong token was sent, and
// WWW-Authenticate headers for Bearer and Basic (RequireToken). Every error answer but
// the mux's own 404 and 405 is JSON: an ErrorResponse, a
// NotLeaderResponse for a membership change's 409, or a
// MisdirectedResponse for 421. The messages name ticketingd's flags
// (--admin-token, --raft-advertise), which are what these settings are
// called there.
//
// Without Options.Token, every request must name this server in its Host
// header (403 with an ErrorResponse otherwise, on every path): an IP
// address, localhost, or a name of Options.AllowedHosts. A web page that
// rebinds its own DNS name to the server's address (DNS rebinding)
// therefore cannot read the answers through a browser; a scrape or probe
// by IP address is served.
//
// The handler sets no timeouts of its own: serve it with an http.Server
// that has them, on a listener wrapped by LimitListener, which caps the
// connections held open (ConnLimits: in all, per source address, and
// loopback's own). ticketingd's admin server reads request headers within
// 5 s (--admin-header-timeout) and a whole request within 10 s, closes
// connections idle for 2 s, allows 30 s for writing an answer (above the
// default ClusterChangeTimeout, so that the answer of a slow change still
// gets out), limits request headers to 16 KiB, and applies LimitListener
// with --admin-max-conns and --admin-max-conns-per-source.
//
// The answers, status codes, paths and JSON field names are those of
// ticketingd's admin listener, which docs/operations.md ("Admin
// endpoints", "Cluster status") describes; the types of this package
// decode them.
package admin
