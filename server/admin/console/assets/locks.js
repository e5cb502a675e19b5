// Ticketing lock browser: pages of held locks from /v1/locks (by key
// prefix), the waiters of one key in FIFO order from /v1/locks/{key},
// and an operator's expire now, confirmed in a dialog, that sends the
// exact token the page showed. Text is set with textContent only.
"use strict";

(function () {
  const table = document.getElementById("locks-table");
  if (!table) return;
  const tbody = table.tBodies[0];
  const status = document.getElementById("locks-status");
  const off = document.getElementById("locks-off");
  const view = document.getElementById("locks-view");
  const none = document.getElementById("locks-none");
  const auto = document.getElementById("auto");
  const dialog = document.getElementById("expire-dialog");
  const result = document.getElementById("expire-result");
  const queue = document.getElementById("queue");
  let prefix = "", limit = "50";
  let pages = [""]; // after_b64 of each page so far: the last is this one
  let next = "";    // after_b64 of the next page, "" if none
  let queueKey = null; // key_b64 of the queue shown
  let target = null;   // the lock the dialog asks about
  let busy = false;

  function say(el, text) {
    if (el.textContent !== text) el.textContent = text;
  }
  // keyPath is admin.LockPath: every byte but A-Z a-z 0-9 - _ escaped.
  function keyPath(keyB64) {
    const bin = atob(keyB64);
    let p = "/v1/locks/";
    for (let i = 0; i < bin.length; i++) {
      const c = bin.charCodeAt(i);
      const ch = bin[i];
      p += /[A-Za-z0-9_-]/.test(ch) ? ch : "%" + (c < 16 ? "0" : "") + c.toString(16).toUpperCase();
    }
    return p;
  }
  function keyText(l) {
    return l.key !== "" || l.key_b64 === "" ? l.key : "(bytes, base64) " + l.key_b64;
  }
  function secs(ms) {
    if (ms === undefined || ms === null) return "–";
    return ms < 10000 ? (ms / 1000).toFixed(1) + " s" : Math.round(ms / 1000) + " s";
  }
  function holder(s) {
    return s ? (s.name || "(no name)") + " (" + s.addr + ")" : "unknown";
  }
  function td(tr, text, cls) {
    const c = document.createElement("td");
    c.textContent = text;
    if (cls) c.className = cls;
    tr.appendChild(c);
    return c;
  }

  // answer reads a JSON answer; a 404 (off), 401, 403 or 421 shows why
  // in the notice and returns null.
  async function get(path) {
    const resp = await fetch(path, { credentials: "same-origin", cache: "no-store" });
    let body = {};
    try { body = await resp.json(); } catch (e) { /* the mux's text 404 */ }
    if (resp.ok) {
      off.hidden = true;
      return body;
    }
    off.hidden = false;
    if (resp.status === 404 && path.startsWith("/v1/locks?")) {
      say(off, "The lock browser is off on this node: " +
        (body.error ? body.error.replace(/^the lock browser is off: /, "") : "start ticketingd serve with --console-keys and --admin-token."));
    } else if (resp.status === 421) {
      say(off, misdirected(body));
    } else {
      say(off, "HTTP " + resp.status + ": " + (body.error || resp.statusText));
    }
    return null;
  }
  function misdirected(b) {
    if (b.leader) {
      return "This node does not serve: the leader is " + b.leader + (b.leader_advertise ? " (clients: " + b.leader_advertise + ")" : "") +
        (b.leader_address ? ", Raft " + b.leader_address : "") + ". Open the leader's console to expire a lock.";
    }
    if (b.active) return "This node is passive: the active node serves at " + b.active + ". Open its console to expire a lock.";
    return "This node does not serve and knows no leader now: " + (b.error || "") + " Try again in a moment.";
  }

  async function load() {
    if (busy) return;
    busy = true;
    try {
      const q = new URLSearchParams({ limit: limit });
      if (prefix) q.set("prefix", prefix);
      const after = pages[pages.length - 1];
      if (after) q.set("after_b64", after);
      const page = await get("/v1/locks?" + q.toString());
      if (!page) {
        tbody.replaceChildren();
        say(status, "Not available");
        return;
      }
      render(page);
      say(status, "Updated " + new Date().toLocaleTimeString("en-GB"));
      if (queueKey) await loadQueue(queueKey, false);
    } catch (e) {
      say(status, "Disconnected: " + e.message);
    } finally {
      busy = false;
    }
  }

  function render(page) {
    const applied = page.view.endsWith("-applied");
    view.hidden = !applied;
    say(view, applied ? "This node does not serve: it shows the locks as applied from the " +
      (page.view === "follower-applied" ? "leader's log" : "active's replication") +
      ", without leases or waiters. Open the serving node's console for them and to expire a lock." : "");
    // A refresh replaces the rows: the focus stays on the same button of
    // the same key, so that a keyboard user does not lose the place.
    const active = document.activeElement;
    const refocus = active && tbody.contains(active) && active.closest("tr") ?
      { key: active.closest("tr").dataset.key, cls: active.classList[0] } : null;
    tbody.replaceChildren(...page.locks.map(function (l) {
      const tr = document.createElement("tr");
      tr.dataset.key = keyText(l);
      tr.dataset.token = l.token_text;
      const k = document.createElement("td");
      const kb = document.createElement("button");
      kb.type = "button";
      kb.className = "link";
      kb.textContent = keyText(l);
      kb.setAttribute("aria-label", "Waiters of " + keyText(l));
      kb.addEventListener("click", function () { loadQueue(l.key_b64, true); });
      k.appendChild(kb);
      tr.appendChild(k);
      td(tr, l.token_text, "token");
      td(tr, holder(l.holder));
      td(tr, secs(l.lease_left_ms) + (l.lease_s ? " of " + l.lease_s + " s" : ""));
      td(tr, String(l.waiters), "waiters");
      const a = document.createElement("td");
      const x = document.createElement("button");
      x.type = "button";
      x.className = "danger small";
      x.textContent = "Expire now…";
      x.setAttribute("aria-label", "Expire " + keyText(l) + " now");
      x.disabled = applied;
      x.addEventListener("click", function () { confirmExpire(l); });
      a.appendChild(x);
      tr.appendChild(a);
      return tr;
    }));
    if (refocus) {
      const tr = [...tbody.rows].find(function (r) { return r.dataset.key === refocus.key; });
      const b = tr && tr.querySelector("button." + refocus.cls);
      if (b) b.focus();
    }
    none.hidden = page.locks.length > 0;
    if (page.locks.length === 0 && page.more) {
      // The node searched its most keys per page (free or in-flight
      // ones) and found no held lock: the next page goes on.
      say(none, "No held lock among the keys searched for this page: Next page goes on.");
    } else {
      say(none, prefix ? "No lock is held with a key starting " + JSON.stringify(prefix) + (pages.length > 1 ? " on this page." : ".") : "No lock is held" + (pages.length > 1 ? " on this page." : "."));
    }
    next = page.more ? page.next_b64 : "";
    document.getElementById("next-page").disabled = !next;
    document.getElementById("prev-page").disabled = pages.length < 2;
    document.getElementById("first-page").disabled = pages.length < 2;
  }

  async function loadQueue(keyB64, focus) {
    const d = await get(keyPath(keyB64));
    queueKey = d ? keyB64 : null;
    queue.hidden = !d;
    if (!d) {
      if (!focus) off.hidden = true; // the key is no longer held: not an error of the page
      return;
    }
    say(document.getElementById("queue-key"), keyText(d));
    say(document.getElementById("queue-note"), "Held with token " + d.token_text + " by " + holder(d.holder) + ". " +
      (d.queue.length === 0 ? "No waiter." : d.queue.length + " waiting, in the order they will be granted:"));
    document.getElementById("queue-list").replaceChildren(...d.queue.map(function (w) {
      const li = document.createElement("li");
      li.textContent = holder(w.session) + ": waited " + secs(w.waited_ms) + ", gives up in " + secs(w.wait_left_ms) +
        ", asks a lease of " + w.lease_s + " s";
      return li;
    }));
    if (focus) document.getElementById("queue-h").focus();
  }

  function confirmExpire(l) {
    target = l;
    say(document.getElementById("x-key"), keyText(l));
    say(document.getElementById("x-token"), l.token_text);
    say(document.getElementById("x-holder"), holder(l.holder));
    dialog.showModal();
    document.getElementById("x-cancel").focus();
  }

  async function expire() {
    const l = target;
    dialog.close();
    if (!l) return;
    target = null;
    say(result, "Expiring " + keyText(l) + "…");
    const headers = { "Content-Type": "application/json" };
    const op = document.getElementById("operator").value.trim();
    if (op) headers["X-Ticketing-Operator"] = op;
    let resp, body = {};
    try {
      resp = await fetch(keyPath(l.key_b64) + "/expire", {
        method: "POST", credentials: "same-origin", cache: "no-store", headers: headers,
        body: JSON.stringify({ token: l.token_text }),
      });
      try { body = await resp.json(); } catch (e) { /* not JSON */ }
    } catch (e) {
      say(result, "The expire now of " + keyText(l) + " was not answered: " + e.message + ". It may still apply: refresh to see.");
      return;
    }
    switch (resp.status) {
      case 200:
        say(result, "Expired " + keyText(l) + " (token " + l.token_text + "). " +
          (body.now ? "Its next waiter holds it now, with token " + body.now.token_text + "." : "No one was waiting: it is free."));
        break;
      case 409:
        say(result, "Not expired: " + keyText(l) + " is held with another token now than " + l.token_text + " (it changed since the page showed it).");
        break;
      case 404:
        say(result, "Not expired: " + keyText(l) + " is not held any more.");
        break;
      case 421:
        say(result, "Not expired: " + misdirected(body));
        break;
      default:
        say(result, "Not expired: HTTP " + resp.status + ": " + (body.error || resp.statusText));
    }
    await load();
  }

  document.getElementById("x-confirm").addEventListener("click", expire);
  document.getElementById("x-cancel").addEventListener("click", function () { target = null; dialog.close(); });
  dialog.addEventListener("cancel", function () { target = null; });
  document.getElementById("locks-filter").addEventListener("submit", function (ev) {
    ev.preventDefault();
    prefix = document.getElementById("prefix").value;
    limit = document.getElementById("limit").value;
    pages = [""];
    load();
  });
  document.getElementById("next-page").addEventListener("click", function () {
    if (next) { pages.push(next); load(); }
  });
  document.getElementById("prev-page").addEventListener("click", function () {
    if (pages.length > 1) { pages.pop(); load(); }
  });
  document.getElementById("first-page").addEventListener("click", function () {
    pages = [""];
    load();
  });
  setInterval(function () {
    if (auto.checked && !dialog.open) load();
  }, 2000);
  load();
})();
