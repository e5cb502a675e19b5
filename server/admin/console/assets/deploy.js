// Ticketing deployment page: builds a deploy.Spec from the form, posts it
// to /v1/deploy (JSON: a cross-site page cannot post it), shows each
// problem beside its field, previews every file and downloads the
// archives of that same answer. Text is set with textContent only.
"use strict";

(function () {
  const form = document.getElementById("deploy");
  if (!form) return;
  const nodesBox = document.getElementById("nodes");
  const tpl = document.getElementById("node-template");
  const preview = document.getElementById("preview");
  const stale = document.getElementById("stale");
  const showSecrets = document.getElementById("show-secrets");
  const planStatus = document.getElementById("plan-status");
  let last = null; // the last plan: the server keeps nothing, the page keeps it

  function topology() {
    return form.querySelector('input[name="topology"]:checked').value;
  }
  function tlsMode() {
    return form.querySelector('input[name="tls"]:checked').value;
  }
  function nodeIDs() {
    switch (topology()) {
      case "pair": return ["primary", "backup"];
      case "cluster": {
        const ids = [];
        for (let i = 1; i <= Number(document.getElementById("size").value); i++) ids.push("n" + i);
        return ids;
      }
    }
    return [];
  }

  // The node fieldsets: kept (with what was typed) when the topology
  // changes, added or removed to match.
  function syncNodes() {
    const ids = nodeIDs();
    const pair = topology() === "pair";
    while (nodesBox.children.length > ids.length) nodesBox.lastElementChild.remove();
    for (let i = 0; i < ids.length; i++) {
      let fs = nodesBox.children[i];
      if (!fs) {
        fs = tpl.content.firstElementChild.cloneNode(true);
        for (const el of fs.querySelectorAll("[data-f]")) {
          const name = "nodes[" + i + "]." + el.dataset.f;
          const id = "nodes-" + i + "-" + el.dataset.f;
          if (el.tagName === "LABEL") el.htmlFor = id;
          else if (el.tagName === "P") el.dataset.errorFor = name;
          else { el.id = id; el.name = name; }
        }
        fs.querySelector('input[data-f="host"]').value = "";
        nodesBox.appendChild(fs);
      }
      const idInput = fs.querySelector('input[data-f="id"]');
      if (pair || !idInput.value || idInput.readOnly) idInput.value = ids[i];
      idInput.readOnly = pair;
      fs.querySelector("legend").textContent = "Node " + (i + 1);
    }
  }

  function syncVisibility() {
    const t = topology();
    for (const el of form.querySelectorAll("[data-show]")) {
      const show = el.dataset.show;
      el.hidden = !(show === t || (show === "group" && t !== "single") || (show === "own" && tlsMode() === "own") ||
        (show === "kube" && document.getElementById("kubernetes").checked));
    }
    syncNodes();
  }

  function intOr0(v) {
    const n = Number(v);
    return v === "" || !Number.isFinite(n) ? 0 : Math.trunc(n);
  }
  function value(id) {
    return document.getElementById(id).value.trim();
  }

  // spec is the deploy.Spec of the form (its JSON names).
  function spec() {
    const t = topology();
    const s = {
      topology: t, dir: value("dir"),
      port: intOr0(value("port")), admin_port: intOr0(value("admin_port")),
      tls: tlsMode(), client_tokens: intOr0(value("client_tokens")),
      admin_token: document.getElementById("admin_token").checked,
      console_keys: document.getElementById("console_keys").checked,
      token_start: value("token_start"),
    };
    if (document.getElementById("kubernetes").checked) {
      s.kubernetes = { namespace: value("kubernetes.namespace"), image: value("kubernetes.image") };
    }
    if (s.tls === "own") {
      s.own_tls = { cert_file: value("own_tls.cert_file"), key_file: value("own_tls.key_file"), ca_file: value("own_tls.ca_file") };
    }
    if (t === "single") {
      s.hosts = value("hosts").split(",").map(function (h) { return h.trim(); }).filter(Boolean);
      return s;
    }
    s.peer_port = intOr0(value("peer_port"));
    s.peer_tls = document.getElementById("peer_tls").checked;
    s.nodes = [];
    for (const fs of nodesBox.children) {
      const f = function (name) { return fs.querySelector('input[data-f="' + name + '"]').value.trim(); };
      s.nodes.push({ id: f("id"), host: f("host"), client_port: intOr0(f("client_port")), peer_port: intOr0(f("peer_port")), admin_port: intOr0(f("admin_port")) });
    }
    return s;
  }

  // errorsFor finds the message element of a field: its own, or that of
  // its list ("hosts[1]" -> "hosts").
  function errorElement(field) {
    const q = function (f) { return form.querySelector('p.err[data-error-for="' + CSS.escape(f) + '"]'); };
    return q(field) || q(field.replace(/\[\d+\]$/, ""));
  }

  function clearErrors() {
    for (const p of form.querySelectorAll("p.err")) {
      p.textContent = "";
    }
    for (const el of form.querySelectorAll("[aria-invalid]")) {
      el.removeAttribute("aria-invalid");
      const ids = (el.getAttribute("aria-describedby") || "").split(" ").filter(function (x) { return x && !x.startsWith("err-"); });
      if (ids.length) el.setAttribute("aria-describedby", ids.join(" "));
      else el.removeAttribute("aria-describedby");
    }
    const box = document.getElementById("form-errors");
    box.hidden = true;
    box.querySelector("ul").replaceChildren();
  }

  // labelOf names an input as the page does: its node's legend and its
  // label ("Node 3, Host"), else the field's name.
  function labelOf(input, field) {
    const label = input.labels && input.labels[0];
    if (!label) return field;
    const text = label.textContent.trim();
    const node = input.closest("fieldset.node");
    return node ? node.querySelector("legend").textContent + ", " + text : text;
  }

  // showErrors puts each field's message beside its field and a summary
  // on top that links to them, in the order of the page (top to bottom),
  // not the order of the answer. A message whose field is not on the page
  // is in the summary only.
  function showErrors(message, fields) {
    const box = document.getElementById("form-errors");
    const list = box.querySelector("ul");
    document.getElementById("form-errors-h").textContent = message;
    let n = 0;
    const order = function (field) {
      const p = errorElement(field);
      if (!p || p.closest("[hidden]")) return Infinity;
      return [...form.querySelectorAll("p.err")].indexOf(p);
    };
    const names = Object.keys(fields || {}).sort(function (a, b) { return order(a) - order(b); });
    for (const field of names) {
      const msgs = fields[field].join("; ");
      const p = errorElement(field);
      const li = document.createElement("li");
      if (p && !p.closest("[hidden]")) {
        li.dataset.errorFor = p.dataset.errorFor;
        p.textContent = (p.textContent ? p.textContent + "; " : "") + (p.dataset.errorFor === field ? msgs : field + ": " + msgs);
        p.id = p.id || "err-" + (n++) + "-" + field.replace(/[^a-z0-9]/gi, "-");
        const input = form.querySelector('[name="' + CSS.escape(p.dataset.errorFor) + '"]');
        if (input) {
          input.setAttribute("aria-invalid", "true");
          const d = input.getAttribute("aria-describedby");
          input.setAttribute("aria-describedby", (d ? d + " " : "") + p.id);
          const a = document.createElement("a");
          a.href = "#" + input.id;
          a.textContent = labelOf(input, field) + ": " + msgs;
          li.appendChild(a);
        } else {
          li.textContent = field + ": " + msgs;
        }
      } else {
        li.textContent = field + ": " + msgs;
      }
      list.appendChild(li);
    }
    box.hidden = false;
    box.focus();
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  function renderPreview() {
    if (!last) return;
    const show = showSecrets.checked;
    document.getElementById("url").textContent = show ? last.url : last.url_masked;
    document.getElementById("guide").textContent = show ? last.guide : last.guide_masked;
    const warn = document.getElementById("warnings");
    warn.replaceChildren(...last.warnings.map(function (w) { return el("li", w); }));
    warn.hidden = last.warnings.length === 0;
    const files = document.getElementById("files");
    const open = new Set([...files.querySelectorAll("details[open]")].map(function (d) { return d.dataset.path; }));
    files.replaceChildren(...last.files.map(function (f) {
      const d = el("details");
      d.dataset.path = f.path;
      d.open = open.has(f.path);
      const s = el("summary");
      s.appendChild(el("code", f.path));
      s.appendChild(document.createTextNode(" " + f.mode + ", " + f.size.toLocaleString("en-US") + " bytes"));
      if (f.secret) s.appendChild(el("span", "secret", "badge secret"));
      d.appendChild(s);
      d.appendChild(el("pre", show ? f.text : f.masked));
      return d;
    }));
  }

  function download(b64, name, type) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const url = URL.createObjectURL(new Blob([bytes], { type: type }));
    const a = document.createElement("a");
    a.href = url;
    a.download = name;
    a.hidden = true;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(function () { URL.revokeObjectURL(url); }, 60000);
  }

  form.addEventListener("change", function (ev) {
    if (ev.target.name === "topology" || ev.target.name === "tls" || ev.target.id === "size" || ev.target.id === "kubernetes") syncVisibility();
  });
  // Any edit after a preview: the downloads no longer match the form.
  // An edit of a field marked wrong takes its mark, its message and its
  // line of the summary away (the next preview checks it again); the
  // summary goes when it is empty.
  form.addEventListener("input", function (ev) {
    if (last) stale.hidden = false;
    const input = ev.target;
    if (!input.name || input.getAttribute("aria-invalid") !== "true") return;
    input.removeAttribute("aria-invalid");
    const ids = (input.getAttribute("aria-describedby") || "").split(" ").filter(function (x) { return x && !x.startsWith("err-"); });
    if (ids.length) input.setAttribute("aria-describedby", ids.join(" "));
    else input.removeAttribute("aria-describedby");
    const p = form.querySelector('p.err[data-error-for="' + CSS.escape(input.name) + '"]');
    if (p) p.textContent = "";
    const box = document.getElementById("form-errors");
    for (const li of box.querySelectorAll('li[data-error-for="' + CSS.escape(input.name) + '"]')) li.remove();
    if (!box.querySelector("li")) box.hidden = true;
  });

  form.addEventListener("submit", async function (ev) {
    ev.preventDefault();
    clearErrors();
    planStatus.textContent = "Planning…";
    let resp, body;
    try {
      resp = await fetch("/v1/deploy", {
        method: "POST", credentials: "same-origin", cache: "no-store",
        headers: { "Content-Type": "application/json" }, body: JSON.stringify(spec()),
      });
      body = await resp.json();
    } catch (e) {
      planStatus.textContent = "";
      showErrors("The console did not answer: " + e.message, {});
      return;
    }
    if (!resp.ok) {
      planStatus.textContent = "";
      showErrors(resp.status === 400 && body.fields ? "Please correct the fields marked below: " + body.error + "." : body.error || ("HTTP " + resp.status), body.fields);
      return;
    }
    last = body;
    showSecrets.checked = false;
    stale.hidden = true;
    preview.hidden = false;
    renderPreview();
    planStatus.textContent = "Planned: " + last.files.length + " files.";
    document.getElementById("preview-h").focus();
  });

  showSecrets.addEventListener("change", renderPreview);
  document.getElementById("dl-tgz").addEventListener("click", function () {
    if (last) download(last.tar_gz, last.tar_gz_name, "application/gzip");
  });
  document.getElementById("dl-zip").addEventListener("click", function () {
    if (last) download(last.zip, last.zip_name, "application/zip");
  });
  syncVisibility();
})();
