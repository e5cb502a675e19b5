// Ticketing console: fills the page from the server-sent events of
// /v1/events (one overview a second). No framework; text is set with
// textContent only, never parsed as HTML.
"use strict";

(function () {
  const main = document.getElementById("main");
  if (!main || main.dataset.planning === "true" || !document.getElementById("conn")) {
    return; // planning only, or another page
  }
  const conn = document.getElementById("conn");
  const pause = document.getElementById("pause");
  let paused = false;
  let last = null;

  function status(text) {
    if (conn.textContent !== text) conn.textContent = text; // a live region: announce changes only
  }

  function set(key, text) {
    for (const el of document.querySelectorAll('[data-k="' + key + '"]')) {
      el.textContent = text;
    }
  }
  function num(n) {
    return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US");
  }
  function ms(v) {
    if (v === null || v === undefined) return "–";
    if (v < 1) return v.toFixed(2) + " ms";
    if (v < 100) return v.toFixed(1) + " ms";
    if (v < 10000) return Math.round(v) + " ms";
    return (v / 1000).toFixed(1) + " s";
  }
  function duration(s) {
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    if (d > 0) return d + "d " + h + "h " + m + "m";
    if (h > 0) return h + "h " + m + "m " + (s % 60) + "s";
    if (m > 0) return m + "m " + (s % 60) + "s";
    return s + "s";
  }
  function cell(row, text, cls) {
    const td = document.createElement("td");
    if (cls) {
      const b = document.createElement("span");
      b.className = "badge " + cls;
      b.textContent = text;
      td.appendChild(b);
    } else {
      td.textContent = text;
    }
    row.appendChild(td);
    return td;
  }
  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function render(o) {
    set("role", o.role || "–");
    set("uptime", duration(o.uptime_s));
    set("sessions", num(o.sessions));
    set("held_locks", num(o.held_locks));
    set("waiters", num(o.waiters));
    set("grants", num(o.grants));
    set("grants_per_s", o.grants_per_s === null ? "–" : o.grants_per_s.toFixed(1));
    const w = o.grant_wait;
    set("window", w.window_s >= 55 && w.window_s <= 65 ? "last minute" : "last " + duration(w.window_s));
    set("grant_wait", w.count === 0 ? "no grants" :
      ms(w.p50_ms) + " / " + ms(w.p90_ms) + " / " + ms(w.p99_ms));
    set("last_token", num(o.last_token));
    set("token_ceiling", num(o.token_ceiling));
    const ts = document.getElementById("token-store");
    ts.hidden = !o.token_store_error;
    ts.textContent = o.token_store_error ? "Token store: " + o.token_store_error : "";

    const errs = document.getElementById("errors");
    errs.hidden = o.errors.length === 0;
    document.getElementById("errors-none").hidden = o.errors.length > 0;
    fill(errs.tBodies[0], o.errors.map(function (e) {
      const tr = document.createElement("tr");
      cell(tr, String(e.code));
      cell(tr, e.name);
      cell(tr, num(e.recent));
      cell(tr, num(e.total));
      return tr;
    }));

    const cl = document.getElementById("cluster");
    cl.hidden = !o.cluster && !o.cluster_error;
    if (o.cluster) {
      const c = o.cluster;
      set("cl_node", c.node_id + " (" + c.state + ")");
      set("cl_leader", c.leader || "none known");
      set("cl_term", num(c.term));
      set("cl_index", num(c.commit_index) + " / " + num(c.applied_index));
      set("cl_changes", num(c.leader_changes));
      document.getElementById("cluster-note").textContent = c.members_view === "leader" ?
        "This node leads: health, last contact, log index and lag are its view of each member." :
        "This node does not lead: only the leader sees its members' contact and lag. Open the leader's console for them.";
      fill(document.querySelector("#members tbody"), c.members.map(function (m) {
        const tr = document.createElement("tr");
        tr.dataset.member = m.id;
        tr.dataset.health = m.health;
        cell(tr, m.id + (m.self ? " (this node)" : ""));
        cell(tr, m.leader ? "leader" : (m.suffrage === "Voter" ? "follower" : m.suffrage.toLowerCase()), m.leader ? "leader" : "");
        cell(tr, m.health === "unreachable" ? "dead / unreachable" : m.health, m.health);
        cell(tr, m.since_contact_ms === undefined ? "–" : ms(m.since_contact_ms) + " ago");
        cell(tr, m.log_index === undefined ? "–" : num(m.log_index));
        cell(tr, m.lag === undefined ? "–" : num(m.lag));
        const a = cell(tr, m.address);
        if (m.last_error) a.title = m.last_error;
        return tr;
      }));
    } else if (o.cluster_error) {
      document.getElementById("cluster-note").textContent = "Cluster status unavailable: " + o.cluster_error;
    }

    const pr = document.getElementById("pair");
    pr.hidden = !o.pair;
    if (o.pair) {
      const p = o.pair;
      set("pr_self", p.role + ": " + p.state + (p.serving ? " (serving)" : ""));
      set("pr_peer", (p.peer_state || "unknown") + (p.peer_alive ? " (alive)" : " (dead / silent)"));
      set("pr_repl", p.replicating ? "replicating" : (p.serving ? "not replicating (" + num(p.unreplicated) + " commands unreplicated)" : "passive"));
      set("pr_epoch", p.epoch < 0 ? "not serving" : String(p.epoch));
      set("pr_dual", num(p.dual_actives));
    }
  }

  function connect() {
    const es = new EventSource("/v1/events");
    es.addEventListener("overview", function (ev) {
      last = JSON.parse(ev.data);
      status(paused ? "Paused" : "Live");
      if (!paused) render(last);
    });
    es.onerror = function () {
      status("Disconnected: retrying…");
    };
  }

  pause.addEventListener("click", function () {
    paused = !paused;
    pause.setAttribute("aria-pressed", String(paused));
    pause.textContent = paused ? "Resume updates" : "Pause updates";
    status(paused ? "Paused" : "Live");
    if (!paused && last) render(last);
  });
  connect();
})();
