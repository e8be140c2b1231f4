// The relay's dashboard. No framework and no build step: this file is
// served as is from the relay binary. Every call to the relay is signed
// with the user's key through NIP-07 (window.nostr): HTTP calls carry a
// NIP-98 header, the live WebSocket authenticates with NIP-42. Data is
// put into the page with textContent only, never as HTML.
"use strict";
(() => {
  const S = { pubkey: null, role: null, relayPubkey: null, socket: null, liveReady: false,
              subs: new Map(), oks: new Map(), profiles: new Map(), seq: 0, refreshTimer: null, rendering: false, backoffMs: 1000 };
  const REFRESH_MS = 5000;        // lists also refresh on their own (claims post no event)
  const PROFILE_TTL_MS = 60000;   // a name (or its absence) is read again after this
  const MAX_PROFILES = 100;       // pubkeys asked for in one kind 0 query
  const MAX_QUERY_EVENTS = 200;   // a query over the live socket keeps at most this many
  const MAX_PICTURE_CHARS = 65536; // a profile picture shown only as a data: URL up to this size
  const $ = (id) => document.getElementById(id);

  // ---- DOM helpers -------------------------------------------------------
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "onclick") e.addEventListener("click", v);
      else if (k === "text") e.textContent = String(v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  const short = (hex) => (hex && hex.length > 16 ? hex.slice(0, 8) + "…" + hex.slice(-4) : hex || "-");
  function when(t) {
    if (t === null || t === undefined) return el("span", { class: "muted" }, "-");
    const d = Math.floor(Date.now() / 1000) - t;
    const a = Math.abs(d);
    const span = a < 60 ? a + "s" : a < 3600 ? Math.floor(a / 60) + "m" : a < 86400 ? Math.floor(a / 3600) + "h" : Math.floor(a / 86400) + "d";
    return el("span", { title: new Date(t * 1000).toISOString() }, d >= 0 ? span + " ago" : "in " + span);
  }
  const badge = (s) => el("span", { class: "badge s-" + s, "data-status": s }, s);
  const link = (href, text) => el("a", { href }, text);
  function table(headers, rows, attrs) {
    return el("div", { class: "scroll", tabindex: 0 }, el("table", attrs || {},
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.length ? rows.map((r) => el("tr", r.attrs || {}, r.cells.map((c) => el("td", {}, c))))
                                 : el("tr", {}, el("td", { colspan: headers.length, class: "muted" }, "none")))));
  }
  function fields(pairs) {
    return el("dl", {}, pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v ?? "-")]));
  }
  // Scrollable boxes take the keyboard's focus, so that they scroll without a mouse.
  const pre = (v) => el("pre", { tabindex: 0 }, typeof v === "string" ? v : JSON.stringify(v, null, 2));

  // ---- people: NIP-19 npub, names from kind 0 ---------------------------
  const BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l";
  function polymod(values) {
    const G = [0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3];
    let chk = 1;
    for (const v of values) {
      const top = chk >> 25;
      chk = ((chk & 0x1ffffff) << 5) ^ v;
      for (let i = 0; i < 5; i++) if ((top >> i) & 1) chk ^= G[i];
    }
    return chk;
  }
  // A hex pubkey as its npub (NIP-19, bech32).
  function npub(hex) {
    if (!/^[0-9a-f]{64}$/.test(hex || "")) return hex || "-";
    const data = [];
    let acc = 0, bits = 0;
    for (const byte of hex.match(/../g).map((h) => parseInt(h, 16))) {
      acc = ((acc << 8) | byte) & 0xffff;
      bits += 8;
      while (bits >= 5) { bits -= 5; data.push((acc >> bits) & 31); }
    }
    if (bits > 0) data.push((acc << (5 - bits)) & 31);
    const hrp = [..."npub"].map((c) => c.charCodeAt(0));
    const expanded = hrp.map((c) => c >> 5).concat([0], hrp.map((c) => c & 31));
    const mod = polymod(expanded.concat(data, [0, 0, 0, 0, 0, 0])) ^ 1;
    const check = [0, 1, 2, 3, 4, 5].map((i) => (mod >> (5 * (5 - i))) & 31);
    return "npub1" + data.concat(check).map((d) => BECH32[d]).join("");
  }
  // Reads the kind 0 profiles of `pubkeys` not known lately, over the live
  // socket (nothing while it is not ready: the next redraw asks again).
  async function loadProfiles(pubkeys) {
    const now = Date.now();
    const stale = (p) => !S.profiles.has(p) || now - S.profiles.get(p).at > PROFILE_TTL_MS;
    const want = [...new Set(pubkeys.filter((p) => /^[0-9a-f]{64}$/.test(p || "") && stale(p)))].slice(0, MAX_PROFILES);
    if (!want.length || !S.liveReady) return;
    const events = await query({ kinds: [0], authors: want });
    for (const p of want) {
      const newest = events.filter((e) => e.pubkey === p).sort((a, b) => b.created_at - a.created_at)[0];
      let name = null, picture = null;
      try {
        const c = newest ? JSON.parse(newest.content) : {};
        name = String(c.display_name || c.name || "").trim().slice(0, 64) || null;
        // Only a picture carried in the profile itself: the page fetches
        // nothing from elsewhere (its CSP allows data: images only).
        const pic = String(c.picture || "");
        if (/^data:image\/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=]+$/.test(pic) && pic.length <= MAX_PICTURE_CHARS) picture = pic;
      } catch { /* a profile that is not JSON has no name */ }
      S.profiles.set(p, { name, picture, at: now });
    }
  }
  // A person: their kind 0 name, else their npub shortened; both in full
  // on hover.
  function person(hex) {
    const n = npub(hex);
    const known = S.profiles.get(hex) || {};
    const name = known.name || (hex === S.relayPubkey ? "this relay" : null);
    return el("span", { class: "person", title: `${name ? name + "\n" : ""}${n}\n${hex}`, "data-pubkey": hex },
      avatar(hex, name, known.picture), name || el("span", { class: "mono" }, n.slice(0, 14) + "…" + n.slice(-4)));
  }
  // The profile's picture when it carries one, else the name's first
  // letter on a colour of the pubkey's own (the same key, the same colour).
  function avatar(hex, name, picture) {
    if (picture) return el("img", { class: "avatar", src: picture, alt: "" });
    const a = el("span", { class: "avatar", "aria-hidden": "true" }, (name || "?").trim().charAt(0).toUpperCase() || "?");
    a.style.backgroundColor = `hsl(${parseInt((hex || "0").slice(0, 6), 16) % 360 || 0}, 45%, 32%)`;
    return a;
  }

  // ---- signing and calls -------------------------------------------------
  class ApiError extends Error {
    constructor(status, code, message) { super(code + ": " + (message || "")); this.status = status; this.code = code; }
  }
  function b64(text) {
    const bytes = new TextEncoder().encode(text);
    let bin = "";
    for (const b of bytes) bin += String.fromCharCode(b);
    return btoa(bin);
  }
  async function sha256hex(text) {
    const bytes = new TextEncoder().encode(text);
    if (!(window.crypto && crypto.subtle)) throw new Error("this page needs a secure context (https or localhost) to sign request bodies");
    const digest = await crypto.subtle.digest("SHA-256", bytes);
    return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
  }
  async function sign(kind, tags, content) {
    return window.nostr.signEvent({ kind, tags, content: content || "", created_at: Math.floor(Date.now() / 1000) });
  }
  async function authHeader(method, path, body) {
    // A random nonce: two calls of one URL in one second are two events
    // even with a signer whose signatures are deterministic.
    const nonce = Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
    const tags = [["u", location.origin + path], ["method", method], ["nonce", nonce]];
    if (body) tags.push(["payload", await sha256hex(body)]);
    return "Nostr " + b64(JSON.stringify(await sign(27235, tags)));
  }
  async function call(method, path) {
    const r = await fetch(path, { method, headers: { Authorization: await authHeader(method, path, "") } });
    const j = await r.json().catch(() => ({}));
    if (!r.ok) throw new ApiError(r.status, j.error || "error", j.message);
    return j;
  }
  // A management call (NIP-86).
  async function rpc(method, params) {
    const body = JSON.stringify({ method, params });
    const headers = { Authorization: await authHeader("POST", "/", body), "Content-Type": "application/nostr+json+rpc" };
    const r = await fetch("/", { method: "POST", headers, body });
    const j = await r.json().catch(() => ({}));
    if (!r.ok || j.error) throw new ApiError(r.status, (j.error || "error").split(":")[0], j.error);
    return j.result;
  }

  // ---- the live socket (NIP-42), and queries over it --------------------
  function connectLive() {
    const url = location.origin.replace(/^http/, "ws");
    const ws = new WebSocket(url);
    S.socket = ws;
    S.liveReady = false;
    let authId = null;
    ws.onopen = () => { S.backoffMs = 1000; };
    ws.onmessage = async (m) => {
      let msg;
      try { msg = JSON.parse(m.data); } catch { return; }
      if (msg[0] === "AUTH" && typeof msg[1] === "string") {
        const ev = await sign(22242, [["relay", url], ["challenge", msg[1]]]);
        authId = ev.id;
        ws.send(JSON.stringify(["AUTH", ev]));
      } else if (msg[0] === "OK" && msg[1] === authId) {
        S.liveReady = true;
        $("live").textContent = "live";
        ws.send(JSON.stringify(["REQ", "live", { kinds: [9, 1985], since: Math.floor(Date.now() / 1000) }]));
      } else if (msg[0] === "OK" && S.oks.has(msg[1])) {
        const done = S.oks.get(msg[1]);
        S.oks.delete(msg[1]);
        done({ accepted: msg[2] === true, message: String(msg[3] || "") });
      } else if (msg[0] === "EVENT" && msg[1] === "live") {
        scheduleRefresh(400);
      } else if ((msg[0] === "EVENT" || msg[0] === "EOSE" || msg[0] === "CLOSED") && S.subs.has(msg[1])) {
        const q = S.subs.get(msg[1]);
        if (msg[0] === "EVENT" && q.events.length < MAX_QUERY_EVENTS) q.events.push(msg[2]);
        if (msg[0] !== "EVENT") { S.subs.delete(msg[1]); ws.send(JSON.stringify(["CLOSE", msg[1]])); q.done(q.events); }
      }
    };
    ws.onclose = () => {
      S.liveReady = false;
      for (const done of S.oks.values()) done({ accepted: false, message: "the connection closed before the relay answered" });
      S.oks.clear();
      $("live").textContent = "reconnecting…";
      for (const q of S.subs.values()) q.done(q.events);
      S.subs.clear();
      setTimeout(connectLive, S.backoffMs);
      S.backoffMs = Math.min(S.backoffMs * 2, 30000);
    };
  }
  // Publishes an event signed here over the live socket: the relay's OK.
  function publish(ev) {
    if (!S.liveReady) return Promise.resolve({ accepted: false, message: "the live connection is not ready yet: try again" });
    return new Promise((done) => {
      S.oks.set(ev.id, done);
      S.socket.send(JSON.stringify(["EVENT", ev]));
    });
  }
  // Stored events matching `filter` (empty while the socket is not ready).
  function query(filter) {
    if (!S.liveReady) return Promise.resolve([]);
    return new Promise((done) => {
      const id = "q" + (++S.seq);
      S.subs.set(id, { events: [], done });
      S.socket.send(JSON.stringify(["REQ", id, filter]));
      setTimeout(() => { if (S.subs.has(id)) { S.subs.delete(id); done([]); } }, 10000);
    });
  }

  // ---- actions -----------------------------------------------------------
  // Asks before an action. From the keyboard: the focus moves to Cancel,
  // Tab stays inside the dialog, Escape cancels, and the focus goes back
  // to the button that asked.
  function confirmAction(text) {
    const from = document.activeElement;
    return new Promise((resolve) => {
      $("confirm-text").textContent = text;
      $("confirm").hidden = false;
      $("confirm-no").focus();
      const keys = (e) => {
        if (e.key === "Escape") { e.preventDefault(); end(false); }
        if (e.key === "Tab") {
          e.preventDefault();
          (document.activeElement === $("confirm-no") ? $("confirm-yes") : $("confirm-no")).focus();
        }
      };
      const end = (yes) => {
        $("confirm").hidden = true;
        $("confirm-yes").onclick = null; $("confirm-no").onclick = null;
        document.removeEventListener("keydown", keys, true);
        if (from && from.isConnected) from.focus();
        resolve(yes);
      };
      document.addEventListener("keydown", keys, true);
      $("confirm-yes").onclick = () => end(true);
      $("confirm-no").onclick = () => end(false);
    });
  }
  function action(label, id, text, run, cls) {
    return el("button", { type: "button", id, class: cls || "secondary", onclick: async () => {
      if (!(await confirmAction(text))) return;
      try { await run(); flash("Done: " + label.toLowerCase()); } catch (e) { flash(e.message, true); }
      render();
    } }, label);
  }
  // The last action's outcome, kept across redraws of the same view.
  function flash(text, bad) {
    S.flash = { text, cls: bad ? "error" : "muted" };
    const f = $("flash");
    if (f) { f.textContent = text; f.className = S.flash.cls; }
  }
  const retryButton = (d) => action("Retry", "retry-" + d.id, `Retry delivery ${d.id}? It becomes pending with a fresh budget.`,
    () => rpc("retrydelivery", [d.id]));
  const cancelButton = (d) => action("Cancel", "cancel-" + d.id, `Cancel delivery ${d.id}?`, () => rpc("canceldelivery", [d.id]), "danger");
  // One action on many rows: the ids the page shows, sent 100 at a time
  // (the relay's bound per call); each is changed as its single action
  // would, and the outcome counts what changed and what was refused.
  const BULK_IDS = 100;
  function bulkButton(label, id, question, method, ids, cls) {
    if (!ids.length) return "";
    return el("button", { type: "button", id, class: cls || "secondary", onclick: async () => {
      if (!(await confirmAction(question))) return;
      let changed = 0;
      const refused = [];
      try {
        for (let i = 0; i < ids.length; i += BULK_IDS) {
          const r = await rpc(method, [ids.slice(i, i + BULK_IDS)]);
          changed += r.changed.length;
          refused.push(...r.refused);
        }
        flash(`Done: ${changed} of ${ids.length} changed` + (refused.length ? `; ${refused.length} refused (${refused[0].id}: ${refused[0].error})` : ""), refused.length > 0);
      } catch (e) { flash(e.message, true); }
      render();
    } }, `${label} (${ids.length})`);
  }
  function deliveryActions(d) {
    if (["failed", "expired", "cancelled"].includes(d.status)) return retryButton(d);
    if (["pending", "claimed"].includes(d.status)) return cancelButton(d);
    return "";
  }

  // ---- views ---------------------------------------------------------------
  function heading(text, ...rest) {
    const f = S.flash || { text: "", cls: "muted" };
    return [el("h1", {}, text), el("p", { id: "flash", class: f.cls, role: "status" }, f.text), ...rest];
  }

  async function overview() {
    const o = await call("GET", "/overview");
    const cards = (pairs, prefix) => el("div", { class: "cards" }, pairs.map(([k, n]) =>
      el("div", { class: "card", id: prefix + k }, el("div", { class: "n" }, n), el("div", { class: "k" }, k))));
    const oldest = o.oldest_pending_secs === null ? "-" : Math.round(o.oldest_pending_secs) + " s";
    const notices = (await query({ kinds: [9, 1985], authors: [S.relayPubkey], limit: 50 }))
      .filter((e) => e.kind === 1985 || e.tags.some((t) => t[0] === "nip86")).slice(0, 10);
    return heading(o.role === "admin" ? "Community overview" : "Your workflows",
      el("h2", {}, "Deliveries"), cards(o.deliveries, "d-"),
      el("div", { class: "cards", style: null }, el("div", { class: "card", id: "oldest" }, el("div", { class: "n" }, oldest), el("div", { class: "k" }, "oldest pending"))),
      el("h2", {}, "Runs"), cards(o.runs, "r-"),
      el("h2", {}, "Last hour"), chart(o.last_hour),
      el("div", { class: "axis" }, el("span", {}, "60 min ago"),
         el("span", {}, "green: delivered, red: failed attempts per minute"), el("span", {}, "now")),
      el("h2", {}, "Recent actions"),
      notices.length ? el("ul", { id: "notices" }, notices.map((n) => el("li", {}, n.content, " ", when(n.created_at))))
                     : el("p", { class: "muted" }, "none"));
  }
  function chart(minutes) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "chart");
    svg.setAttribute("viewBox", "0 0 600 140");
    svg.setAttribute("preserveAspectRatio", "none");
    const max = Math.max(1, ...minutes.map((m) => m.delivered + m.failed));
    minutes.forEach((m, i) => {
      const hd = (m.delivered / max) * 130, hf = (m.failed / max) * 130;
      for (const [h, y, cls] of [[hd, 135 - hd, "d"], [hf, 135 - hd - hf, "f"]]) {
        if (h <= 0) continue;
        const r = document.createElementNS(ns, "rect");
        r.setAttribute("x", i * 10 + 1); r.setAttribute("width", 8); r.setAttribute("y", y); r.setAttribute("height", h);
        r.setAttribute("class", cls);
        svg.append(r);
      }
    });
    svg.setAttribute("aria-label", `delivered ${minutes.reduce((a, m) => a + m.delivered, 0)}, failed ${minutes.reduce((a, m) => a + m.failed, 0)} in the last hour`);
    return svg;
  }

  async function workflows() {
    const list = await call("GET", "/workflows");
    return heading("Workflows", table(["Workflow", "Name", "Channel", "Trigger", "State", "Runs", "Last run"],
      list.map((w) => ({ attrs: { "data-workflow": w.id }, cells: [link("#/workflow/" + encodeURIComponent(w.id), w.id), w.name, w.channel, w.trigger,
        badge(!w.enabled ? "disabled" : w.paused ? "paused" : "enabled"), w.runs,
        w.last_run_status ? el("span", {}, badge(w.last_run_status), " ", when(w.last_run_at)) : "-"] }))));
  }

  async function workflow(id) {
    const w = await call("GET", "/workflows/" + encodeURIComponent(id));
    await loadProfiles([w.owner]);
    const runs = await call("GET", `/workflows/${encodeURIComponent(id)}/runs?limit=20`);
    const openRuns = runs.runs.filter((r) => ["running", "waiting"].includes(r.status)).map((r) => r.id);
    const failedRuns = runs.runs.filter((r) => r.status === "failed").map((r) => r.id);
    const toggle = w.paused
      ? action("Resume", "resume", `Resume workflow ${id}? Its runs go on and its trigger fires again.`, () => rpc("resumeworkflow", [id]))
      : action("Pause", "pause", `Pause workflow ${id}? It starts no run; open work waits.`, () => rpc("pauseworkflow", [id]));
    return heading("Workflow " + id,
      fields([["Name", w.name], ["Channel", w.channel], ["Owner", person(w.owner)], ["Trigger", w.trigger],
              ["State", badge(!w.enabled ? "disabled" : w.paused ? "paused" : "enabled")], ["Updated", when(w.updated_at)]]),
      el("div", { class: "row" }, w.enabled ? toggle : ""),
      el("h2", {}, "How its runs end"), runStats(w.stats),
      el("h2", {}, "Steps"), flow(w.definition),
      el("h2", {}, "Runs"),
      el("div", { class: "row" }, bulkButton("Cancel open runs shown", "bulk-cancel-runs",
        `Cancel the ${openRuns.length} running or waiting runs shown, and their open deliveries?`, "cancelruns", openRuns, "danger"),
        bulkButton("Rerun failed runs shown", "bulk-rerun-runs",
          `Rerun the ${failedRuns.length} failed runs shown, each from the step it failed at? A run rerun before is not rerun again.`, "rerunruns", failedRuns)),
      table(["Run", "Status", "Step", "Cause", "Created", "Error"], runs.runs.map((r) => ({ attrs: { "data-run": r.id }, cells: [
        link("#/run/" + r.id, r.id), badge(r.status), stepAt(r), r.cause.type, when(r.created_at),
        r.error ? r.error.code : "-"] }))),
      el("details", {}, el("summary", {}, "Definition as published"), pre(w.definition)));
  }

  // Seconds in words: 42 s, 3m 5s, 2h 10m.
  function span(secs) {
    if (secs === null || secs === undefined) return "-";
    return secs < 60 ? `${secs} s` : secs < 3600 ? `${Math.floor(secs / 60)}m ${secs % 60}s` : `${Math.floor(secs / 3600)}h ${Math.floor(secs / 60) % 60}m`;
  }

  // The latest ended runs: success rate, how each ended, durations.
  function runStats(st) {
    if (!st.ended) return el("p", { class: "muted", id: "stats" }, "No run has ended yet.");
    const card = (id, n, k) => el("div", { class: "card", id }, el("div", { class: "n" }, n), el("div", { class: "k" }, k));
    return el("div", { id: "stats" },
      el("div", { class: "cards" },
        card("st-rate", Math.round(st.success_rate * 100) + "%", `completed, of the last ${st.ended} ended`),
        card("st-failed", st.failed, "failed"), card("st-cancelled", st.cancelled, "cancelled"),
        card("st-p50", span(st.p50_secs), "median run (completed)"), card("st-p95", span(st.p95_secs), "95th percentile"),
        card("st-max", span(st.max_secs), "longest")),
      el("div", { class: "bar", role: "img", "aria-label": `${st.completed} completed, ${st.failed} failed, ${st.cancelled} cancelled` },
        [["completed", st.completed], ["failed", st.failed], ["cancelled", st.cancelled]].filter(([, n]) => n > 0)
          .map(([k, n]) => {
            // Through the CSSOM: the page's CSP allows no inline style attribute.
            const part = el("span", { class: "s-" + k, "data-part": k, title: `${k}: ${n}` });
            part.style.flex = `${n} 0 0`;
            return part;
          })));
  }

  // A definition drawn as its trigger and steps, each with its condition.
  function flow(def) {
    if (!def || !Array.isArray(def.steps)) return el("p", { class: "muted" }, "The definition is no longer stored.");
    const t = def.trigger || {};
    const trigger = t.on === "schedule" ? (t.cron ? `cron ${t.cron}${t.timezone ? " (" + t.timezone + ")" : ""}` : `every ${span(t.interval_secs)}`) : t.on;
    const what = (s) => {
      switch (s.action) {
        case "ask_agent": return [s.text, s.wait ? ` · waits for ${s.wait}` : "", s.timeout_secs ? ` · timeout ${span(s.timeout_secs)}` : ""];
        case "send_message": return s.text;
        case "delay": return `wait ${span(s.secs)}`;
        case "request_approval": return [s.text, s.timeout_secs ? ` · timeout ${span(s.timeout_secs)}` : "",
          s.on_deny ? ` · if denied: ${s.on_deny}` : ""];
        case "call_webhook": return [el("code", {}, `${s.method || "POST"} ${s.url}`), s.retry ? " · retried" : ""];
        default: return "";
      }
    };
    return el("ol", { class: "flow", id: "flow" },
      el("li", { class: "trigger" }, el("strong", {}, "trigger "), trigger || "-"),
      def.steps.map((s) => el("li", { "data-step": s.id },
        s.if ? el("div", { class: "cond" }, "if ", el("code", {}, s.if)) : "",
        el("div", { class: "box" }, el("strong", {}, s.id), " ", el("span", { class: "muted" }, s.action),
          el("div", { class: "what" }, what(s)),
          s.on_failure ? el("div", { class: "muted" }, "on failure: " + s.on_failure) : ""))));
  }

  // How long a step took (or has been at it), in words.
  function took(s) {
    if (s.started_at === null || s.started_at === undefined) return "";
    const end = s.finished_at ?? Math.floor(Date.now() / 1000);
    const secs = Math.max(0, end - s.started_at);
    const text = secs < 60 ? `${secs}s` : secs < 3600 ? `${Math.floor(secs / 60)}m ${secs % 60}s` : `${Math.floor(secs / 3600)}h ${Math.floor(secs / 60) % 60}m`;
    return el("span", { class: "took" }, s.finished_at ? ` · took ${text}` : ` · for ${text} so far`);
  }

  // The step a run is at (1-based) of how many, with its id; n/n once done.
  function stepAt(r) {
    const n = r.steps.length;
    const s = r.steps[r.current_step];
    return s ? `${r.current_step + 1}/${n} ${s.id}` : `${n}/${n}`;
  }

  async function run(id) {
    const r = await call("GET", "/runs/" + encodeURIComponent(id));
    const rows = await rpc("listdeliveries", [{ run: id }]);
    const ids = [...new Set(rows.flatMap((d) => [d.message_event_id, d.reply_event_id]).filter(Boolean))];
    const events = ids.length ? await query({ ids }) : [];
    await loadProfiles(rows.map((d) => d.target_pubkey).concat(events.map((e) => e.pubkey),
      r.steps.flatMap((s) => (s.approval ? s.approval.approvers : [])),
      r.steps.flatMap((s) => (s.output && Array.isArray(s.output.replies) ? s.output.replies.map((a) => a.agent) : []))));
    const cancel = ["running", "waiting"].includes(r.status)
      ? action("Cancel run", "cancel-run", `Cancel run ${id} and its open deliveries?`, () => rpc("cancelrun", [id]), "danger") : "";
    const from = r.steps[r.current_step];
    const rerun = ["failed", "cancelled"].includes(r.status) && !r.rerun_by && from
      ? action(`Rerun from ${from.id}`, "rerun-run", `Rerun run ${id} from step ${from.id}? The steps before keep their results; ${from.id} and the rest run again.`,
        async () => { const a = await rpc("rerunrun", [id]); location.hash = "#/run/" + encodeURIComponent(a.rerun); }) : "";
    const runLink = (rid) => link("#/run/" + encodeURIComponent(rid), rid);
    return heading("Run " + id,
      fields([["Workflow", link("#/workflow/" + encodeURIComponent(r.workflow_id), r.workflow_id)], ["Status", el("span", { id: "run-status" }, badge(r.status))],
              ["Cause", r.cause.type === "rerun" ? el("span", {}, "rerun of ", runLink(r.cause.id)) : r.cause.type],
              ["Created", when(r.created_at)], ["Updated", when(r.updated_at)],
              ["Error", r.error ? `${r.error.code}: ${r.error.message}` : "-"],
              ...(r.rerun_by ? [["Rerun as", el("span", { id: "rerun-by" }, runLink(r.rerun_by))]] : []),
              ...(r.trace_id ? [["Trace", el("code", { id: "trace-id" }, r.trace_id)]] : [])]),
      el("div", { class: "row" }, cancel, rerun),
      el("h2", {}, "Steps"),
      el("ol", { class: "timeline", id: "steps" }, r.steps.map((s) => el("li", { "data-step": s.id, class: "t-" + s.status },
        el("strong", {}, s.id), " ", el("span", { class: "muted" }, s.action), " ", badge(s.status),
        el("div", { class: "muted" }, "started ", when(s.started_at), " · finished ", when(s.finished_at), took(s),
          s.kept_from ? el("span", { class: "kept" }, " · kept from run ", runLink(s.kept_from)) : ""),
        stepBody(r, s)))),
      el("h2", {}, "Deliveries"), deliveriesTable(rows),
      el("h2", {}, "Message and replies"),
      events.length ? el("ul", { id: "messages" }, events.sort((a, b) => a.created_at - b.created_at).map((e) =>
        el("li", {}, person(e.pubkey), ": ", e.content))) : el("p", { class: "muted" }, "none"));
  }

  // What a step did, read for people: why it was skipped, the agents'
  // replies as messages, the webhook's request and answer, errors in
  // words; any other output as JSON, folded.
  function stepBody(r, s) {
    const out = s.output || {};
    return [
      s.error ? inWords(s.error) : "",
      s.skipped ? skippedBecause(s.skipped) : "",
      s.approval ? approval(r, s.approval) : "",
      s.call ? webhookCall(s.call, out) : "",
      Array.isArray(out.replies) && out.replies.length ? replies(out.replies) : "",
      s.output && !s.skipped && !s.call ? el("details", {}, el("summary", {}, "Output"), pre(s.output)) : "",
    ];
  }

  // Run error codes (docs/workflows.md) in words; the relay's own message
  // and the code follow.
  const ERROR_WORDS = {
    message_too_large: "The step's message was larger than the relay accepts.",
    message_refused: "The relay refused the step's message.",
    template_invalid: "A template of the step could not be filled in.",
    condition_error: "The step's condition could not be evaluated for this run.",
    no_agent: "No managed agent of the channel could be asked.",
    agent_failed: "The agent did not deliver an answer.",
    step_timeout: "Nothing came back before the step's timeout.",
    denied: "An approver denied the request.",
    webhook_timeout: "The webhook did not answer in time.",
    webhook_unreachable: "The webhook could not be reached.",
    webhook_refused: "The relay does not call this address (loopback, private or a redirect elsewhere).",
    answer_too_large: "The webhook's answer was over 64 KiB.",
    body_invalid: "The request body did not make JSON of at most 64 KiB.",
    secret_missing: "The secret the call is signed with is not set.",
    secret_unreadable: "The secret the call is signed with cannot be opened with this relay's secrets key.",
    interrupted: "The relay stopped while the call was in flight; it is not sent twice.",
    workflow_disabled: "The workflow was disabled or deleted.",
    channel_deleted: "The channel was deleted.",
    definition_missing: "The workflow revision this run started with is no longer stored.",
  };
  function inWords(err) {
    const http = /^http_(\d{3})$/.exec(err.code || "");
    const words = http ? `The webhook answered HTTP ${http[1]}.` : ERROR_WORDS[err.code] || "The step failed.";
    return el("div", { class: "error", "data-code": err.code }, words, " ",
      err.message ? el("span", { class: "why" }, err.message) : "", " ", el("code", {}, err.code));
  }

  // A skipped step: its condition, false for this run, and what it read.
  function skippedBecause(k) {
    const shown = (v) => (v === null || v === undefined ? "absent" : JSON.stringify(v));
    return el("div", { class: "skip" },
      el("p", {}, "Skipped: its condition ", el("code", {}, k.condition), " was false for this run."),
      k.inputs.length ? el("ul", { class: "inputs" }, k.inputs.map((i) =>
        el("li", { "data-path": i.path }, el("code", {}, i.path), " = ", el("code", { class: "value" }, shown(i.value))))) : "");
  }

  // The agents' answers of an ask_agent step, as messages.
  function replies(list) {
    return el("ul", { class: "replies" }, list.map((a) => el("li", { "data-delivery": a.delivery_id },
      person(a.agent), " ", badge(a.status), " ",
      a.text ? el("blockquote", {}, a.text) : el("span", { class: "muted" }, "no reply"))));
  }

  // A call_webhook step's latest attempt: request and answer.
  function webhookCall(c, out) {
    const size = (n) => (n === null || n === undefined ? "-" : n < 1024 ? `${n} B` : `${(n / 1024).toFixed(1)} KiB`);
    const secs = c.answered_at === null || c.answered_at === undefined ? null : Math.max(0, c.answered_at - c.sent_at);
    const answer = c.phase === "answered"
      ? [el("span", { class: "http", "data-status": c.status }, `HTTP ${c.status}`), ` · ${size(c.answer_bytes)}`, secs === null ? "" : ` · in ${secs < 1 ? "under 1" : secs} s`]
      : c.phase === "sending" ? [el("span", { class: "muted" }, "waiting for the answer")]
      : [el("span", { class: "error" }, c.phase), c.error ? ` · ${c.error.message}` : ""];
    return el("div", { class: "call" },
      el("p", {}, el("strong", {}, "Request "), el("code", {}, `${c.method} ${c.url}`), ` · ${size(c.request_bytes)}`,
        c.attempt > 1 ? ` · attempt ${c.attempt}` : "", " · sent ", when(c.sent_at)),
      el("details", {}, el("summary", {}, "Request body"), pre(c.request)),
      el("p", { class: "answer" }, el("strong", {}, "Answer "), ...answer),
      out.body !== undefined ? el("details", {}, el("summary", {}, "Answer body"), pre(out.body)) : "");
  }

  // A request_approval step waiting: the request, who may decide, and for
  // an approver Approve / Deny, a NIP-25 reaction signed here (the same
  // rule as a reaction from any client).
  function approval(r, a) {
    const decide = (label, id, content, cls) => el("button", { type: "button", id, class: cls, onclick: async () => {
      try {
        const tags = [["e", a.request_event_id], ["h", r.channel]];
        if (S.relayPubkey) tags.push(["p", S.relayPubkey]);
        const ev = await sign(7, tags, content);
        const ok = await publish(ev);
        if (!ok.accepted) throw new Error("the relay refused the reaction: " + ok.message);
        flash("Done: " + label.toLowerCase());
      } catch (e) { flash(e.message, true); }
      render();
    } }, label);
    const mine = a.approvers.includes(S.pubkey);
    return el("div", { class: "approval", id: "approval-" + a.request_event_id },
      el("p", {}, "Waits for a decision: a reaction (", el("code", {}, "+"), " or a thumbs-up approves, ", el("code", {}, "-"),
        " or a thumbs-down denies) by an approver to the request ", el("span", { class: "mono" }, short(a.request_event_id)), "; times out ", when(a.deadline), "."),
      el("blockquote", {}, a.text),
      el("p", { class: "muted" }, "Approvers: ", a.approvers.flatMap((p, i) => [i ? ", " : "", person(p)])),
      mine ? el("div", { class: "row" }, decide("Approve", "approve", "+", "secondary"), decide("Deny", "deny", "-", "danger")) : "");
  }

  function deliveriesTable(rows) {
    return table(["Delivery", "Status", "Attempt", "Workflow / step", "Agent", "Updated", "Failure", ""],
      rows.map((d) => ({ attrs: { "data-delivery": d.id }, cells: [link("#/delivery/" + d.id, short(d.id)), badge(d.status),
        `${d.attempt}/${d.max_attempts}`, `${d.workflow_id} / ${d.step_id}`, person(d.target_pubkey),
        when(d.updated_at), d.failure_code || "-", deliveryActions(d)] })));
  }

  async function deliveries(params) {
    const q = {};
    for (const k of ["status", "workflow", "target"]) if (params.get(k)) q[k] = params.get(k);
    if (params.get("older")) q.older_than_secs = Number(params.get("older")) * 60;
    const rows = await rpc("listdeliveries", [q]);
    await loadProfiles(rows.map((d) => d.target_pubkey));
    const input = (name, label, value) => el("label", {}, label, el("input", { name, id: "f-" + name, value: value || "" }));
    const status = el("select", { id: "f-status" }, ["", "pending", "claimed", "delivered", "failed", "expired", "cancelled"]
      .map((s) => el("option", { value: s, selected: s === (params.get("status") || "") }, s || "any")));
    const apply = el("button", { type: "button", id: "f-apply", onclick: () => {
      const p = new URLSearchParams();
      if (status.value) p.set("status", status.value);
      for (const k of ["workflow", "target", "older"]) { const v = $("f-" + k).value.trim(); if (v) p.set(k, v); }
      location.hash = "#/deliveries?" + p.toString();
    } }, "Filter");
    const retriable = rows.filter((d) => ["failed", "expired", "cancelled"].includes(d.status)).map((d) => d.id);
    const open = rows.filter((d) => ["pending", "claimed"].includes(d.status)).map((d) => d.id);
    return heading("Deliveries",
      el("div", { class: "row" }, el("label", {}, "Status", status), input("workflow", "Workflow", params.get("workflow")),
         input("target", "Agent (hex)", params.get("target")), input("older", "Older than (min)", params.get("older")), apply),
      el("div", { class: "row", id: "bulk" },
        bulkButton("Retry all shown", "bulk-retry",
          `Retry the ${retriable.length} failed, expired or cancelled deliveries shown? Each becomes pending with a fresh budget, and its relay notice names you.`,
          "retrydeliveries", retriable),
        bulkButton("Cancel all shown", "bulk-cancel",
          `Cancel the ${open.length} pending or claimed deliveries shown? Their agents' next calls are refused.`,
          "canceldeliveries", open, "danger")),
      deliveriesTable(rows));
  }

  async function delivery(id) {
    const d = await call("GET", "/deliveries/" + encodeURIComponent(id));
    await loadProfiles([d.target_pubkey]);
    return heading("Delivery " + short(id),
      fields([["Id", el("span", { class: "mono" }, d.id)], ["Status", el("span", { id: "delivery-status" }, badge(d.status))],
              ["Workflow", link("#/workflow/" + encodeURIComponent(d.workflow_id), d.workflow_id)], ["Run", link("#/run/" + d.run_id, d.run_id)],
              ["Step", d.step_id], ["Channel", d.channel], ["Agent", person(d.target_pubkey)],
              ["Attempt", `${d.attempt} of ${d.max_attempts}`], ["Lease until", d.status === "claimed" ? when(d.claim_expires_at) : "-"], ["Expires", when(d.expires_at)],
              ["Failure", d.failure_code ? `${d.failure_code}: ${d.failure_message || ""}` : "-"], ["Created", when(d.created_at)], ["Updated", when(d.updated_at)]]),
      el("div", { class: "row" }, deliveryActions(d)),
      el("h2", {}, "Attempts"),
      table(["Attempt", "Claimed", "Finished", "Outcome", "Code", "Message"], d.attempts.map((a) => ({ cells: [
        a.attempt, when(a.claimed_at), when(a.finished_at), a.outcome ? badge(a.outcome) : "-", a.failure_code || "-", a.failure_message || "-"] })),
        { id: "attempts" }),
      el("h2", {}, "Recorded operations"),
      table(["Attempt", "Name", "Effect"], d.operations.map((o) => ({ cells: [o.attempt, o.name, o.effect] }))));
  }

  async function agents() {
    const list = await call("GET", "/agents");
    await loadProfiles(list.flatMap((a) => [a.pubkey, a.owner]));
    return heading("Agents", table(["Agent", "Owner", "Registered", "Last claim", "In flight", "Mentions"],
      list.map((a) => ({ attrs: { "data-agent": a.pubkey }, cells: [person(a.pubkey), person(a.owner),
        when(a.registered_at), when(a.last_claimed_at), a.in_flight, mentionsOf(a)] }))));
  }

  // Where an agent takes mentions (setmentions): "off", "every channel",
  // or its channels.
  function mentionsOf(a) {
    const where = a.mentions || [];
    if (where.length === 0) return "off";
    return where.map((c) => (c === "" ? "every channel" : c)).join(", ");
  }

  async function channels() {
    const list = await call("GET", "/channels");
    return heading("Channels", table(["Channel", "Name", "Access", "Members", "Workflows"],
      list.map((c) => ({ attrs: { "data-channel": c.id }, cells: [link("#/channel/" + encodeURIComponent(c.id), c.id), c.name, (c.private ? "private" : "public") + ", " + (c.closed ? "closed" : "open"), c.members, c.workflows] }))));
  }

  // A channel's conversation (its latest kind 9 messages, read over the
  // page's WebSocket with the signed-in key's access), each workflow
  // message with the state of the deliveries it carries to agents, and
  // each agent reply with the delivery it answered.
  const CHANNEL_MESSAGES = 100;
  async function channel(id) {
    const events = (await query({ kinds: [9], "#h": [id], limit: CHANNEL_MESSAGES }))
      .sort((a, b) => a.created_at - b.created_at || (a.id < b.id ? -1 : 1));
    const rows = (await rpc("listdeliveries", [{ limit: 500 }])).filter((d) => d.channel === id);
    const carried = new Map(), answered = new Map();
    for (const d of rows) {
      if (!carried.has(d.message_event_id)) carried.set(d.message_event_id, []);
      carried.get(d.message_event_id).push(d);
      if (d.reply_event_id) answered.set(d.reply_event_id, d);
    }
    await loadProfiles(events.map((e) => e.pubkey).concat(rows.map((d) => d.target_pubkey)));
    const deliveryLink = (d) => link("#/delivery/" + d.id, short(d.id));
    return heading("Channel " + id,
      el("p", { class: "muted" }, `The latest ${CHANNEL_MESSAGES} messages you may read here, oldest first; a workflow's message shows each delivery it carries.`),
      events.length ? el("ol", { class: "chat", id: "chat" }, events.map((e) => {
        const out = carried.get(e.id) || [];
        const reply = answered.get(e.id);
        return el("li", { "data-event": e.id, class: e.pubkey === S.relayPubkey ? "from-relay" : "" },
          el("div", { class: "who" }, person(e.pubkey), " ", when(e.created_at)),
          el("div", { class: "text" }, e.content),
          out.length ? el("ul", { class: "carried" }, out.map((d) => el("li", { "data-delivery": d.id },
            "to ", person(d.target_pubkey), " ", badge(d.status), " ", deliveryLink(d),
            d.failure_code ? el("span", { class: "error" }, " " + d.failure_code) : ""))) : "",
          reply ? el("div", { class: "muted answers" }, "answers delivery ", deliveryLink(reply), " (", reply.workflow_id, " / ", reply.step_id, ")") : "");
      })) : el("p", { class: "muted" }, "No message you may read."));
  }

  async function bans() {
    const [banned, events] = [await rpc("listbannedpubkeys", []), await rpc("listbannedevents", [])];
    const pk = el("input", { id: "ban-pubkey", placeholder: "hex pubkey", size: 40 });
    const reason = el("input", { id: "ban-reason", placeholder: "reason" });
    const ban = action("Ban", "ban", "Ban this pubkey? Its events, sign-ins and calls are refused from now on.",
      () => rpc("banpubkey", [pk.value.trim(), reason.value.trim()]), "danger");
    return heading("Bans",
      el("div", { class: "row" }, el("label", {}, "Pubkey", pk), el("label", {}, "Reason", reason), ban),
      el("h2", {}, "Banned pubkeys"), table(["Pubkey", "Reason"], banned.map((b) => ({ cells: [el("span", { class: "mono" }, b.pubkey), b.reason] })), { id: "banned" }),
      el("h2", {}, "Banned events"), table(["Event", "Reason"], events.map((b) => ({ cells: [el("span", { class: "mono" }, b.id), b.reason] }))));
  }

  // ---- routing -----------------------------------------------------------
  function route() {
    const [path, search] = (location.hash.slice(1) || "/").split("?");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    const params = new URLSearchParams(search || "");
    switch (parts[0]) {
      case undefined: return { nav: "#/", view: overview };
      case "workflows": return { nav: "#/workflows", view: workflows };
      case "workflow": return { nav: "#/workflows", view: () => workflow(parts[1]) };
      case "run": return { nav: "#/workflows", view: () => run(parts[1]) };
      case "deliveries": return { nav: "#/deliveries", view: () => deliveries(params) };
      case "delivery": return { nav: "#/deliveries", view: () => delivery(parts[1]) };
      case "agents": return { nav: "#/agents", view: agents };
      case "channels": return { nav: "#/channels", view: channels };
      case "channel": return { nav: "#/channels", view: () => channel(parts[1]) };
      case "bans": return { nav: "#/bans", view: bans };
      default: return { nav: "", view: async () => heading("Not found") };
    }
  }
  async function render(quiet) {
    if (!S.role) return;
    // Asked while drawing: once done, draw again, quietly when only
    // refreshes asked (a navigation or an action asks loudly).
    if (S.rendering) { S.again = S.again === "loud" || !quiet ? "loud" : "quiet"; return; }
    S.rendering = true;
    S.again = null;
    const { nav, view } = route();
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("current", a.getAttribute("href") === nav);
    try {
      const nodes = await view();
      // A refresh that finds the user typing or confirming (they began
      // while it was drawing) keeps their page: the next one draws it.
      if (!(quiet && userBusy())) {
        $("main").replaceChildren(...nodes);
        $("main").setAttribute("data-rendered", String(Date.now()));
      }
    } catch (e) {
      $("main").replaceChildren(el("h1", {}, "Something went wrong"), el("p", { class: "error", id: "error" }, e.message));
    } finally {
      S.rendering = false;
    }
    if (S.again) render(S.again === "quiet");
  }
  function scheduleRefresh(ms) {
    clearTimeout(S.refreshTimer);
    S.refreshTimer = setTimeout(() => {
      if (!userBusy()) render(true);
      scheduleRefresh(REFRESH_MS);
    }, ms);
  }

  // Whether the user types in a field or answers a confirmation (a refresh
  // then waits).
  function userBusy() {
    const typing = document.activeElement && ["INPUT", "SELECT"].includes(document.activeElement.tagName);
    return typing || !$("confirm").hidden;
  }

  // ---- sign-in -------------------------------------------------------------
  async function signIn() {
    const err = $("signin-error");
    err.textContent = "";
    if (!window.nostr) { err.textContent = "No Nostr signer (NIP-07) was found in this browser: install one, then reload."; return; }
    try {
      S.pubkey = await window.nostr.getPublicKey();
      const o = await call("GET", "/overview");
      S.role = o.role;
    } catch (e) {
      S.role = null;
      err.textContent = e.status === 403
        ? `The key ${short(S.pubkey)} does not manage this community: only its admins and workflow owners see this dashboard.`
        : "Signing in failed: " + e.message;
      return;
    }
    $("nav").hidden = false;
    $("nav-bans").hidden = S.role !== "admin";
    $("who").textContent = `${short(S.pubkey)} · ${S.role}`;
    $("who").setAttribute("data-role", S.role);
    connectLive();
    await render();
    scheduleRefresh(REFRESH_MS);
  }

  async function start() {
    try {
      const info = await (await fetch("/", { headers: { Accept: "application/nostr+json" } })).json();
      S.relayPubkey = info.pubkey;
      $("relay-name").textContent = info.name || "Relay";
      document.title = (info.name || "Relay") + " · dashboard";
    } catch { /* the sign-in still works */ }
    $("signin-button").addEventListener("click", signIn);
    window.addEventListener("hashchange", () => { S.flash = null; render(); });
  }
  start();
})();
