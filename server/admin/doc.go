// Package admin is the HTTP admin interface of a Ticketing lock server: the
// handler that ticketingd serves on its admin listener (--admin-listen),
// for any program that embeds a server.Server.
//
//	srv, err := server.New(server.Config{DataDir: dir, Registerer: reg})
//	...
//	h := admin.New(srv, admin.Options{Gatherer: reg, Registerer: reg, Token: token})
//	go (&http.Server{Addr: "127.0.0.1:9225", Handler: h, ReadHeaderTimeout: 5 * time.Second}).ListenAndServe()
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
//   - The web console (package console), unless Options.NoConsole: GET /
//     (the live page), /v1/overview (a console.Overview as JSON),
//     /v1/events (server-sent events, one Overview a second), /deploy and
//     /assets/..., and the handlers of Options.ConsoleRoutes (the lock
//     browser's, the deployment page's). Without Options.Token the
//     console answers only on a loopback address and for a loopback Host
//     (403 otherwise); its answers carry a strict Content-Security-Policy,
//     nosniff and Cache-Control: no-store.
//
// With Options.Token set, every request but GET /healthz must carry
// "Authorization: Bearer TOKEN" (the scheme is case-insensitive; the
// token is compared in constant time) or, as a browser sends it after
// asking, HTTP Basic authentication with the token as the password (any
// user name); anything else gets 401 with an ErrorResponse that says
// whether no token, no Bearer token or a wrong token was sent, and
// WWW-Authenticate headers for Bearer and Basic (RequireToken). Every error answer but
// the mux's own 404 and 405 is JSON: an ErrorResponse, or a
// NotLeaderResponse for 409. The messages name ticketingd's flags
// (--admin-token, --raft-advertise), which are what these settings are
// called there.
//
// The handler sets no timeouts of its own: serve it with an http.Server
// that has them. ticketingd's admin server reads request headers within
// 5 s and a whole request within 10 s, closes connections idle for 2 s,
// allows 30 s for writing an answer (above the default
// ClusterChangeTimeout, so that the answer of a slow change still gets
// out) and limits request headers to 16 KiB.
//
// The answers, status codes, paths and JSON field names are those of
// ticketingd's admin listener, which docs/operations.md ("Admin
// endpoints", "Cluster status") describes; the types of this package
// decode them.
package admin
