/* The live page (serve/page.py). GET /page/state is the document `main.py report --json` prints; its curves are
   drawn with uPlot (vendored), its tables with plain DOM. GET /page/events is read with fetch() and a stream reader,
   since EventSource cannot send the key; an event of a kind the document folds brings a fresh document within
   seconds. The key comes from the URL fragment (#key=..., never sent in a request line), is kept in this tab's
   sessionStorage and removed from the address bar. */
"use strict";
(function () {
  const KEY = "kaizen.key";
  const MAX_EVENTS = 200;
  const FOLDED = new Set(["interaction", "feedback", "rollout", "judgement", "experience", "learner_step",
    "weights_published", "weights_status", "weights_promoted", "weights_rolled_back", "heldout_scored"]);
  const BLUE = "#1f6fb2", BLUE_SOFT = "rgba(31,111,178,.35)", BAND = "rgba(31,111,178,.12)", GREY = "#8a939c";
  const STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000];  // whole learner steps on the x axes
  const $ = (id) => document.getElementById(id);
  const page = window.kaizenPage = { curves: {}, signal: null, state: null, events: 0 };
  let key = null, refreshTimer = null, lastRefresh = 0, ticking = null;

  function takeKey() {
    const m = /(?:^#|&)key=([^&]+)/.exec(location.hash);
    if (m) {
      sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
      history.replaceState(null, "", location.pathname + location.search);
    }
    return sessionStorage.getItem(KEY);
  }

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }

  function status(text, bad) {
    const s = $("status");
    s.textContent = text;
    s.classList.toggle("bad", !!bad);
  }

  function askKey(why) {
    sessionStorage.removeItem(KEY);
    key = null;
    status(why, true);
    $("keyform").hidden = false;
  }

  async function api(path) {
    const r = await fetch(path, { headers: { Authorization: "Bearer " + key }, cache: "no-store" });
    if (r.status === 401) {
      askKey("the API key was refused");
      throw Object.assign(new Error("unauthorized"), { auth: true });
    }
    if (!r.ok) {
      let msg = r.status + "";
      try { msg += ": " + (await r.json()).error.message; } catch (e) { /* not our error object */ }
      throw new Error(msg);
    }
    return r;
  }

  const pct = (x) => (x === null || x === undefined ? null : 100 * x);
  const secs = (x) => (x === null || x === undefined ? "–" : Math.round(x) + " s");
  const width = (box) => Math.max(240, box.clientWidth);

  // ------------------------------------------------------------------ held-out curves (uPlot)
  function curveOpts(env, w) {
    return {
      title: env, width: w, height: 220, legend: { live: false },
      scales: { x: { time: false, range: (u, lo, hi) => [lo - 0.5, hi + 0.5] },
        y: { range: (u, lo, hi) => [0, Math.max(10, Math.ceil((hi || 0) / 10) * 10)] } },
      axes: [{ label: "learner step of the version (0 = base)", incrs: STEPS }, { label: "held-out avg@k %", size: 50 }],
      series: [{ label: "step" },
        { label: "version", stroke: BLUE, width: 2, points: { show: true, size: 7 } },
        { label: "95% low", stroke: BLUE_SOFT, width: 1, dash: [4, 4], points: { show: false } },
        { label: "95% high", stroke: BLUE_SOFT, width: 1, dash: [4, 4], points: { show: false } },
        { label: "base", stroke: GREY, width: 1.5, dash: [8, 5], points: { show: false } }],
      bands: [{ series: [3, 2], fill: BAND }],
    };
  }

  function renderCurves(s) {
    const box = $("curves");
    const envs = Object.keys(s.curve);
    if (!envs.length) {
      for (const env of Object.keys(page.curves)) { page.curves[env].destroy(); delete page.curves[env]; }
      box.replaceChildren(el("p", { class: "empty" }, "No held-out checks yet: the guard scores each served " +
        "version against the base in the background (minutes a version on 2 cores)."));
      return;
    }
    if (box.querySelector(".empty")) box.replaceChildren();
    for (const env of envs) {
      const c = s.curve[env];
      let wrap = box.querySelector(`:scope > div[data-env="${env}"]`);
      if (!wrap) {
        wrap = el("div", { class: "chart", "data-env": env });
        wrap.append(el("div", { class: "plot" }), el("div", { class: "scroll" }));
        box.append(wrap);
      }
      const data = [c.step, c.avg.map(pct), c.lo.map(pct), c.hi.map(pct), c.base.map(pct)];
      if (page.curves[env]) page.curves[env].setData(data);
      else page.curves[env] = new uPlot(curveOpts(env, width(box)), data, wrap.querySelector(".plot"));
      const table = el("table", { class: "points" }), head = el("tr"), body = el("tbody");
      head.append(...["version", "step", "avg@k", "95% interval", "p vs base", "verdict"].map((h) => el("th", {}, h)));
      table.append(el("thead"), body);
      table.tHead.append(head);
      c.version.forEach((v, i) => {
        const tr = body.appendChild(el("tr", { "data-version": v, "data-env": env, "data-avg": c.avg[i] }));
        tr.append(el("td", { class: "v" }, v), el("td", { class: "num" }, c.step[i]),
          el("td", { class: "num" }, pct(c.avg[i]).toFixed(1) + "%"),
          el("td", { class: "num" }, pct(c.lo[i]).toFixed(1) + "–" + pct(c.hi[i]).toFixed(1) + "%"),
          el("td", { class: "num" }, c.p_value[i] === null ? "–" : c.p_value[i].toFixed(4)), el("td", {}, c.verdict[i]));
      });
      wrap.querySelector(".scroll").replaceChildren(table);
    }
  }

  // ------------------------------------------------------------------ tables
  function renderRows(rows) {
    const body = $("rows").tBodies[0];
    if (!rows.length) {
      const tr = el("tr");
      tr.append(el("td", { colspan: 7, class: "empty" }, "No weights version yet: the learner publishes one after its first step."));
      body.replaceChildren(tr);
      return;
    }
    body.replaceChildren(...rows.slice().reverse().map((r) => {
      const tr = el("tr", { "data-version": r.version });
      tr.append(el("td", { class: "v" }, r.version), el("td", { class: "v" }, r.parent),
        el("td", { class: "num" }, r.step), el("td", {}, r.status),
        el("td", { class: "why" }, r.gate), el("td", { class: "why" }, r.canary),
        el("td", { class: "num" }, secs(r.served_after_s)));
      return tr;
    }));
  }

  function renderMemory(m) {
    const figures = [["active", m.active], ["quarantined", m.quarantined], ["retired", m.retired],
      ["merged", m.merged], ["requests", m.interactions], ["with memory", m.with_memory],
      ["retrieved", m.retrieved], ["guided samples", m.guided_samples], ["uses", m.uses], ["helped", m.helped]];
    $("pool").replaceChildren(...figures.map(([k, v]) => {
      const d = el("div", { "data-figure": k });
      d.append(el("dt", {}, k), el("dd", {}, v));
      return d;
    }));
    $("helped").replaceChildren(...(m.top.length ? m.top.map((t) => el("li", { "data-id": t.id },
      `helped ${t.helped} of ${t.uses} uses (${t.state || "?"}): ${t.text || t.id}`))
      : [el("li", { class: "empty" }, "No experience has helped yet.")]));
  }

  function renderSignal(sig) {
    const box = $("signalchart");
    if (!sig.step.length) {
      box.replaceChildren(el("p", { class: "empty" }, "No learner step yet."));
      if (page.signal) { page.signal.destroy(); page.signal = null; }
      return;
    }
    const data = [sig.step, sig.informative.map(pct), sig.informative_own.map(pct), sig.live.map(pct)];
    if (page.signal) { page.signal.setData(data); return; }
    box.replaceChildren();
    page.signal = new uPlot({
      width: width(box), height: 200, legend: { live: false },
      scales: { x: { time: false, range: (u, lo, hi) => [lo - 0.5, hi + 0.5] }, y: { range: [0, 100] } },
      axes: [{ label: "learner step", incrs: STEPS }, { label: "%", size: 40 }],
      series: [{ label: "step" }, { label: "informative", stroke: BLUE, width: 2 },
        { label: "own samples informative", stroke: "#6a9fd0", width: 1, dash: [4, 4] },
        { label: "live share", stroke: "#c2571a", width: 2 }],
    }, data, box);
  }

  function renderStages(stages) {
    const fmt = (x) => (x === null ? "–" : x.toFixed(1));
    $("cycle").tBodies[0].replaceChildren(...stages.map((s) => {
      const tr = el("tr", { "data-stage": s.stage, title: s.what });
      tr.append(el("td", {}, s.what), el("td", { class: "num" }, fmt(s.p50)), el("td", { class: "num" }, fmt(s.p90)),
        el("td", { class: "num" }, fmt(s.last)), el("td", { class: "num" }, s.n));
      return tr;
    }));
  }

  function render(s) {
    page.state = s;
    renderCurves(s);
    renderRows(s.rows);
    renderMemory(s.memory);
    renderSignal(s.signal);
    renderStages(s.stages);
    status(`${s.rows.length} versions; stream read to #${s.seq}; updated ${new Date().toLocaleTimeString()}`);
  }

  async function refresh() {
    lastRefresh = Date.now();
    try { render(await (await api("/page/state")).json()); } catch (e) { if (!e.auth) status("state: " + e.message, true); }
  }

  function soon() {  // at most one refresh every 3 s, however many events come
    if (refreshTimer) return;
    refreshTimer = setTimeout(() => { refreshTimer = null; refresh(); }, Math.max(0, 3000 - (Date.now() - lastRefresh)));
  }

  // ------------------------------------------------------------------ live events
  function summary(kind, e) {
    const w = e.weights || {};
    switch (kind) {
      case "weights_status": return `${e.version} ${e.previous_status || "new"} → ${e.status}: ${e.reason || ""}`;
      case "weights_published": case "weights_promoted": return `${w.version} from ${w.parent}` + (e.stage ? ` (${e.stage})` : "");
      case "weights_rolled_back": return `${e.from_version} → ${(e.to || {}).version}: ${e.reason}`;
      case "learner_step": return `step ${e.step}: ${e.groups} groups, loss ${e.loss.toFixed(4)}, reward ${e.mean_reward.toFixed(3)}`;
      case "interaction": return `${e.interaction_id}, ${e.experience_ids.length} experiences in context`;
      case "feedback": return `${e.interaction_id} rated ${e.score}`;
      case "judgement": return `${e.task_id} outcomes ${e.outcomes.map((x) => x.toFixed(2)).join(" ")}`;
      case "experience": return `${e.state} ${e.success ? "success" : "failure"}: ${e.text}`;
      case "dropped": return `this page lost ${e.dropped} events (it read too slowly)`;
      default: return e.reason || e.task_id || e.version || e.interaction_id || "";
    }
  }

  function onEvent(kind, data) {
    let e = {};
    try { e = JSON.parse(data); } catch (err) { e = { reason: data.slice(0, 200) }; }
    const at = (e.occurred_at || new Date().toISOString()).slice(11, 19);
    const li = el("li", { "data-kind": kind, "data-id": e.event_id || "" });
    li.append(el("time", {}, at), el("span", { class: "kind" }, kind),
      document.createTextNode(`${e.weights_version || ""} ${summary(kind, e)}`.slice(0, 400)));
    const list = $("events");
    list.querySelector(".empty")?.remove();
    list.prepend(li);
    while (list.children.length > MAX_EVENTS) list.lastChild.remove();
    page.events += 1;
    if (FOLDED.has(kind)) soon();
  }

  function onBlock(block) {  // one SSE event: `event:` and `data:` lines; comments start with ':'
    let kind = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const c = line.indexOf(":");
      const field = c < 0 ? line : line.slice(0, c);
      const value = c < 0 ? "" : line.slice(c + 1).replace(/^ /, "");
      if (field === "event") kind = value;
      else if (field === "data") data.push(value);
    }
    if (data.length) onEvent(kind, data.join("\n"));
  }

  function pill(text, cls) {
    const p = $("stream");
    p.textContent = text;
    p.className = "pill " + (cls || "");
  }

  async function follow() {
    for (;;) {
      try {
        const r = await api("/page/events");
        pill("live", "on");
        const reader = r.body.getReader(), dec = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
            onBlock(buf.slice(0, i));
            buf = buf.slice(i + 2);
          }
        }
      } catch (e) {
        if (e.auth) return;
        pill(e.message.slice(0, 60), "bad");
      }
      if (!key) return;
      if ($("stream").textContent === "live") pill("reconnecting", "bad");
      await new Promise((ok) => setTimeout(ok, 3000));
      refresh();  // what was missed while away
    }
  }

  function start() {
    $("keyform").hidden = true;
    status("loading");
    refresh();
    follow();
    ticking = ticking || setInterval(refresh, 60000);  // a safety net for events this page lost
  }

  window.addEventListener("resize", () => {
    for (const u of Object.values(page.curves)) u.setSize({ width: width($("curves")), height: u.height });
    if (page.signal) page.signal.setSize({ width: width($("signalchart")), height: page.signal.height });
  });
  $("keyform").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const k = $("key").value.trim();
    if (!k) return;
    sessionStorage.setItem(KEY, k);
    key = k;
    $("key").value = "";
    start();
  });
  key = takeKey();
  if (key) start(); else askKey("Open this page as /page#key=<API key>, or paste the key:");
})();
