// Package console is the web console of a Ticketing lock server: one HTML
// page that shows what the node is doing, live, and the JSON it is made
// of. server/admin mounts it at the root of the admin listener (every
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
//   - GET /deploy: the deployment page (Options.Routes may replace it;
//     until then a page that points to `ticketingd init`).
//   - GET /assets/...: the page's style sheet and script.
//   - Options.Routes: further handlers (the lock browser's /v1/locks),
//     served with the same headers and access rule.
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
