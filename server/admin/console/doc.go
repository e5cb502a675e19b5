// Package console is the web console of a Ticketing lock server: a page
// that shows what the node is doing, live, the lock browser, the
// deployment page, and the JSON they are made of. server/admin mounts it at the root of the admin listener (every
// path the admin handler does not serve itself); `ticketingd console`
// serves it alone, without a server (planning only), for the deployment
// page.
//
// # Paths
//
//   - GET /: the console page. With a server: role, uptime, version,
//     sessions, held locks, waiters, grants per second, grant-wait
//     percentiles, the token and its ceiling, protocol errors by code; on
//     a cluster node every member with its role, last contact, log index,
//     lag and whether the leader reaches it; on a pair node both roles and
//     the replication state. It updates itself once a second from
//     /v1/events (a "Pause updates" button stops that). Without a server:
//     "no server: planning only" and the link to the deployment page.
//   - GET /v1/overview: one Overview as JSON.
//   - GET /v1/events: server-sent events, one "overview" event (an
//     Overview as JSON) per Options.Interval, until the client goes away
//     or Options.ShuttingDown says so.
//   - GET /locks: the lock browser's page: held locks by key prefix,
//     paginated, with holder, token, lease left and waiters; a key's
//     waiters in FIFO order; "Expire now…" per lock, confirmed in a
//     dialog, which posts the exact token shown and the operator's name
//     (X-Ticketing-Operator). Its JSON (/v1/locks, /v1/locks/{key},
//     /v1/locks/{key}/expire) is server/admin's, on only with
//     --console-keys; the page says so on a 404, names the leader on a
//     421, and says what a 409 or 404 of an expire means. The navigation
//     shows it with Options.LockBrowser.
//   - GET /deploy: the deployment page: a form (topology, hosts and
//     ports per node, client TLS off, a generated private CA or the
//     operator's own files, peer mutual TLS, client tokens, admin token,
//     the lock browser) that posts to POST /v1/deploy (DeployPath).
//   - POST /v1/deploy: a deploy.Spec as JSON (internal/deploy) in, a
//     DeployResponse out: every file of the bundle (with a masked copy for
//     the preview), the client URL and guide, and both archives (.tar.gz
//     and .zip, base64), all in one answer, so that the server keeps
//     nothing: keys and tokens are generated for the request, sent once
//     (Cache-Control: no-store) and dropped. A form with problems gets
//     400 with a DeployErrorResponse whose Fields has a message per form
//     field ("nodes[1].host"), which the page shows beside its input; a
//     body that is not a Spec 400 (413 beyond MaxDeployBody). It refuses
//     cross-site posts: the body must be declared application/json (415
//     otherwise; a cross-origin page cannot send that without a CORS
//     preflight, which nothing here grants), and a request whose
//     Sec-Fetch-Site is not same-origin or none, or whose Origin is not
//     the request's Host, gets 403. It logs one line per request
//     (Options.Logger) with the topology and the outcome, never a key or
//     a token. Options.Routes["/deploy"] replaces the page and its
//     planner.
//   - GET /assets/...: the pages' style sheet and scripts.
//   - Options.Routes: further handlers, served with the same headers and
//     access rule.
//
// Anything else is 404 (a wrong method 405), never 500.
//
// # Headers and access
//
// Every answer has a Content-Security-Policy that allows scripts, styles,
// images and connections from the page's own origin only (no inline
// script or style, no frames, forms post to the same origin),
// X-Content-Type-Options: nosniff, Referrer-Policy: no-referrer and
// Cache-Control: no-store (the deployment page carries tokens and keys,
// the lock browser key names). Everything is in the binary (embed.FS): no
// CDN, no web font, no framework.
//
// The handler does not check the admin token itself: server/admin wraps
// it in its token check, as `ticketingd console` does. Without a token,
// set Options.LoopbackOnly: then a request is served only if it arrived
// on a loopback address and names a loopback Host (a web page that
// rebinds its DNS name to 127.0.0.1 does not), and gets 403 otherwise.
package console
