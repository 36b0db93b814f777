/* raytrain dashboard: a page over the public HTTP API, with the same token as any client.
 *
 * Views (by the URL's hash): #/jobs, #/jobs/ID, #/submit, #/offers. Charts are uPlot;
 * YAML specs are read with js-yaml; both are vendored under /ui/vendor/. The job page reads
 * /v1/jobs/ID/history once, then follows /v1/jobs/ID/events. The events are read with
 * fetch() and parsed here (a few lines) because the browser's EventSource cannot send the
 * Authorization header, and a token in the URL would land in logs.
 */
"use strict";
(() => {
  const TOKEN_KEY = "raytrain.token";
  const LIST_POLL_MS = 3000;
  const JOB_POLL_MS = 5000;
  const RECONNECT_MS = 2000;
  const COLORS = { loss: "#1d4ed8", val: "#be123c", speed: "#047857", cost: "#b45309", rate: "#7c3aed",
                   nodes: "#1d4ed8", preempt: "#b91c1c" };

  let token = sessionStorage.getItem(TOKEN_KEY);
  let authRequired = true;
  let view = null;  // the current page's lifetime: its fetches and timers end with it

  class SignedOut extends Error {}

  // ------------------------------------------------------------------ small helpers

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else if (key === "class") el.className = value;
      else el.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : String(child));
    }
    return el;
  }

  // Replace an element's children, leaving out the null and false of conditional parts.
  const fill = (el, ...children) => el.replaceChildren(
    ...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));

  const num = (x, digits = 3) => x === null || x === undefined || Number.isNaN(x) ? "–"
    : Number(x).toLocaleString(undefined, { maximumSignificantDigits: digits });
  const usd = (x) => x === null || x === undefined ? "–"
    : "$" + Number(x).toLocaleString(undefined, { minimumFractionDigits: 2,
                                                  maximumFractionDigits: x < 1 && x > 0 ? 4 : 2 });
  function duration(s) {
    if (s === null || s === undefined) return "–";
    s = Math.max(0, Math.round(s));
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
    const hours = Math.floor(s / 3600);
    return `${hours} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
  }
  const clock = (t) => t ? new Date(t * 1000).toLocaleString() : "–";
  const stateBadge = (state) => h("span", { class: `state ${state}` }, state);
  const terminal = (state) => ["SUCCEEDED", "FAILED", "CANCELLED"].includes(state);
  const sleep = (ms, signal) => new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });

  class View {
    constructor() { this.controller = new AbortController(); this.timers = []; }
    get signal() { return this.controller.signal; }
    get live() { return !this.controller.signal.aborted; }
    every(fn, ms) { this.timers.push(setInterval(() => this.run(fn), ms)); }
    end() { this.controller.abort(); this.timers.forEach(clearInterval); }
    // Run a step of the page; failures show on the page, never as uncaught errors.
    async run(fn) {
      try { await fn(); } catch (error) { this.failed(error); }
    }
    failed(error) {
      if (!this.live || error instanceof SignedOut || error.name === "AbortError") return;
      const where = document.getElementById("page-error");
      if (where) fill(where, h("div", { class: "alert", role: "alert" },
        `Could not reach the service: ${error.message}. It is retried on its own.`));
    }
  }

  // ------------------------------------------------------------------------ the API

  function headers(extra) {
    const all = { Accept: "application/json", ...extra };
    if (token) all.Authorization = `Bearer ${token}`;
    return all;
  }

  async function api(method, path, body, extra) {
    const init = { method, headers: headers(extra), signal: view.signal };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    const response = await fetch(path, init);
    if (response.status === 401) { signOut("The service refused the token: sign in again."); }
    const text = await response.text();
    let data = text;
    try { data = text ? JSON.parse(text) : null; } catch (_) { /* not JSON: keep the text */ }
    if (response.status >= 500) throw new Error(`${method} ${path} answered ${response.status}`);
    return { ok: response.ok, status: response.status, data, headers: response.headers };
  }

  // Server-Sent Events over fetch: `onEvent` gets each {seq, type, time, data}; it returns
  // true to stop. Reconnects after a drop with the last id seen.
  async function follow(path, after, onEvent, signal) {
    let last = after;
    while (!signal.aborted) {
      try {
        const response = await fetch(`${path}?after=${last}`, {
          headers: headers({ Accept: "text/event-stream" }), signal });
        if (response.status === 401) { signOut("The service refused the token."); return; }
        if (!response.ok) throw new Error(`events answered ${response.status}`);
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replace(/\r\n/g, "\n");
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            const data = block.split("\n").filter((l) => l.startsWith("data:"))
              .map((l) => l.slice(5).trimStart()).join("\n");
            if (!data) continue;  // a keep-alive comment
            const event = JSON.parse(data);
            last = event.seq;
            if (onEvent(event)) return;
          }
        }
      } catch (error) {
        if (signal.aborted || error instanceof SignedOut) return;
      }
      await sleep(RECONNECT_MS, signal);
    }
  }

  // ------------------------------------------------------------------- sign in / out

  function signOut(message) {
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    if (view) view.end();
    view = new View();
    showSignIn(message);
    throw new SignedOut();
  }

  function showSignIn(message) {
    document.getElementById("signout").hidden = true;
    const user = h("input", { type: "text", name: "username", autocomplete: "username", value: "raytrain", hidden: true });
    const input = h("input", { id: "token", name: "token", type: "password", required: true,
                               autocomplete: "current-password", size: 40 });
    const problem = h("div", { id: "signin-problem" },
      message ? h("div", { class: "alert", role: "alert" }, message) : null);
    const form = h("form", { class: "card login", onsubmit: async (e) => {
      e.preventDefault();
      token = input.value.trim();
      const check = await fetch("/v1/jobs?limit=1", { headers: headers() });
      if (!check.ok) {
        token = null;
        fill(problem, h("div", { class: "alert", role: "alert" },
          check.status === 401 ? "This service does not know that token."
            : `The service answered ${check.status}; try again shortly.`));
        input.focus();
        return;
      }
      sessionStorage.setItem(TOKEN_KEY, token);
      route();
    } },
      h("h1", {}, "Sign in to raytrain"),
      h("p", { class: "muted" }, "Paste a token. The operator's is in tokens.json in the " +
        "service's state directory; `raytrain token add NAME` makes another. It is kept " +
        "for this browser tab only."),
      user, h("label", { for: "token" }, "Token"), input, problem,
      h("div", { class: "row end" }, h("button", { type: "submit" }, "Sign in")));
    mount(form);
    input.focus();
  }

  function mount(...nodes) {
    const main = document.getElementById("view");
    fill(main, h("div", { id: "page-error" }), ...nodes);
  }

  // --------------------------------------------------------------------- the router

  async function route() {
    if (view) view.end();
    view = new View();
    const current = view;
    const [, page, id] = (location.hash || "#/jobs").split("/");
    for (const link of document.querySelectorAll("[data-nav]")) {
      if (link.dataset.nav === (page || "jobs")) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    if (authRequired && !token) { showSignIn(); return; }
    document.getElementById("signout").hidden = !authRequired;
    const pages = { jobs: id ? () => jobPage(decodeURIComponent(id)) : jobList,
                    submit: submitPage, offers: offersPage };
    await current.run(pages[page] || jobList);
  }

  // ---------------------------------------------------------------------- job list

  const COLUMNS = [
    ["name", "Job", (j) => j.spec.name || j.id],
    ["state", "State", (j) => j.state],
    ["progress", "Progress", (j) => j.progress.total_steps ? j.progress.step / j.progress.total_steps : 0],
    ["speed", "Tokens/s", (j) => j.progress.tokens_per_s || 0],
    ["eta", "ETA", (j) => j.progress.eta_s ?? Infinity],
    ["cost", "Spent", (j) => j.cost_usd],
    ["rate", "$/hour", (j) => j.resources.usd_per_hour || 0],
    ["capacity", "Capacity", (j) => capacity(j)],
    ["created", "Submitted", (j) => j.created_at],
  ];
  let sortBy = { key: "created", descending: true };

  function capacity(job) {
    const r = job.resources;
    if (!r.nodes) return "–";
    const what = r.offer || r.accelerator;
    return `${what} · ${r.market} · ${r.nodes} node${r.nodes === 1 ? "" : "s"}`;
  }

  async function jobList() {
    const table = h("table", { id: "jobs" });
    mount(h("h1", {}, "Jobs"), h("div", { class: "scroll" }, table),
          h("p", { class: "muted", id: "jobs-note" }));
    const draw = (jobs) => {
      const [, , value] = COLUMNS.find(([key]) => key === sortBy.key);
      jobs.sort((a, b) => {
        const x = value(a), y = value(b);
        const order = x < y ? -1 : x > y ? 1 : 0;
        return sortBy.descending ? -order : order;
      });
      const head = h("tr", {}, COLUMNS.map(([key, label]) => h("th", {
        scope: "col", class: ["speed", "cost", "rate", "eta"].includes(key) ? "num" : null,
        "aria-sort": sortBy.key === key ? (sortBy.descending ? "descending" : "ascending")
          : "none" },
        h("button", { type: "button", onclick: () => {
          sortBy = { key, descending: sortBy.key === key ? !sortBy.descending : false };
          draw(jobs);
          table.querySelector(`th:nth-child(${COLUMNS.findIndex(([k]) => k === key) + 1}) button`).focus();
        } }, label))));
      const rows = jobs.map((j) => h("tr", { "data-job": j.id },
        h("td", {}, h("a", { href: `#/jobs/${j.id}` }, j.spec.name || j.id),
          h("div", { class: "muted" }, j.id)),
        h("td", {}, stateBadge(j.state)),
        h("td", {}, `${j.progress.step} / ${j.progress.total_steps}`,
          h("div", { class: "bar", role: "presentation" }, h("span", {
            style: `width: ${Math.min(100, 100 * (j.progress.step / (j.progress.total_steps || 1)))}%` }))),
        h("td", { class: "num" }, num(j.progress.tokens_per_s)),
        h("td", { class: "num" }, terminal(j.state) ? "–" : duration(j.progress.eta_s)),
        h("td", { class: "num" }, usd(j.cost_usd)),
        h("td", { class: "num" }, usd(j.resources.usd_per_hour)),
        h("td", {}, capacity(j)),
        h("td", {}, clock(j.created_at))));
      fill(table, h("thead", {}, head), h("tbody", {}, rows));
      document.getElementById("jobs-note").textContent = jobs.length ? "" :
        "No jobs yet: submit one from the Submit page, or with `raytrain submit FILE`.";
    };
    const load = async () => {
      const answer = await api("GET", "/v1/jobs?limit=1000");
      if (answer.ok && view.live) draw(answer.data);
    };
    await load();
    view.every(load, LIST_POLL_MS);
  }

  // ----------------------------------------------------------------------- job page

  // Axis labels that fit the axis and keep their digits: 12k, not a clipped "2,000"; as
  // many decimals as the ticks' spacing needs, so $0.002 and $0.004 are not both "$0.00";
  // whole seconds of the clock, never ":21.500".
  const decimals = (incr) => Math.min(6, Math.max(0, -Math.floor(Math.log10(incr || 1) + 1e-9)));
  const compactTicks = (u, vals) => vals.map((v) => v === null ? "" : Math.abs(v) >= 1000
    ? Number(v).toLocaleString(undefined, { notation: "compact", maximumFractionDigits: 1 })
    : num(v));
  const usdTicks = (suffix = "") => (u, vals, axis, space, incr) =>
    vals.map((v) => v === null ? "" : `$${Number(v).toFixed(decimals(incr))}${suffix}`);
  const clockTicks = (u, vals) => vals.map((v) => new Date(v * 1000).toLocaleTimeString(
    undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false }));
  const TIME_AXIS = { values: clockTicks, space: 70,
                      incrs: [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
                              10800, 21600, 43200, 86400] };

  function chart(el, title, series, axes, scales) {
    const x = scales && scales.x && scales.x.time === false ? { label: "step" } : { label: "time" };
    const width = () => Math.max(240, el.clientWidth - 10);
    const timed = !(scales && scales.x && scales.x.time === false);
    axes = axes || [{}, {}];
    axes = [{ ...(timed ? TIME_AXIS : {}), ...axes[0] },
            ...axes.slice(1).map((a) => ({ values: compactTicks, size: 60, ...a }))];
    const plot = new uPlot({
      title, width: width(), height: 220, scales: scales || { x: { time: true } },
      series: [x, ...series.map((s) => ({ points: { show: false }, ...s }))], axes,
      legend: { live: true }, cursor: { drag: { x: true, y: false } },
    }, [[], ...series.map(() => [])], el);
    el.plot = plot;  // what a test reads the drawn axis labels from (plot.axes[i]._values)
    let drawn = width();
    new ResizeObserver(() => requestAnimationFrame(() => {
      if (view.live && width() !== drawn) { drawn = width(); plot.setSize({ width: drawn, height: 220 }); }
    })).observe(el);
    return plot;
  }

  // The capacity the job held over time, as steps, and where preemptions struck.
  function timeline(job, now) {
    const changes = [];
    for (const d of job.decisions) {
      if (["start", "switch", "stay", "wait"].includes(d.action)) {
        changes.push([d.time, d.action === "wait" ? 0 : d.nodes]);
      }
    }
    if (!changes.length && job.started_at) changes.push([job.started_at, job.resources.nodes || 1]);
    const strikes = [];
    // An elastic job's replica group lost and replaced: its nodes are missing in between.
    const gaps = [];
    const perGroup = Math.max(1, Math.round((job.resources.nodes || 1) / Math.max(1, job.groups.length)));
    for (const p of job.preemption_log) {
      const before = changes.filter(([t]) => t <= p.time).pop();
      strikes.push([p.time, before ? before[1] : job.resources.nodes]);
      if (p.group !== null && p.group !== undefined) {
        const back = p.replaced_after_s !== null && p.replaced_after_s !== undefined
          ? p.time + p.replaced_after_s : (job.finished_at || now);
        gaps.push([p.time, back]);
        continue;
      }
      changes.push([p.time, 0]);
      if (p.down_s !== null && p.down_s !== undefined) {
        changes.push([p.time + p.down_s, job.resources.nodes]);
      }
    }
    if (changes.length) changes.push([job.finished_at || now, job.finished_at ? 0 : job.resources.nodes]);
    changes.sort((a, b) => a[0] - b[0]);
    const xs = [...new Set([...changes.map(([t]) => t), ...strikes.map(([t]) => t),
      ...gaps.flat()])].sort((a, b) => a - b);
    let held = 0;
    const nodes = xs.map((t) => {
      for (const [when, count] of changes) if (when === t) held = count;
      const missing = gaps.filter(([from, to]) => from <= t && t < to).length * perGroup;
      return Math.max(0, held - (held ? missing : 0));
    });
    const marks = xs.map((t) => { const s = strikes.find(([when]) => when === t); return s ? s[1] : null; });
    return [xs, nodes, marks];
  }

  function happenings(job, seen) {
    const rows = [];
    for (const d of job.decisions) {
      const what = d.action === "wait" ? "wait"
        : `${d.action}: ${d.offer || "?"} · ${d.market || "?"} · ${d.nodes} node(s) at ${usd(d.usd_per_hour)}/h`;
      rows.push([d.time, "decision", what, d.reason]);
    }
    for (const p of job.preemption_log) {
      if (p.group !== null && p.group !== undefined) {
        rows.push([p.time, "preemption",
          `replica group ${p.group} lost ${p.notice ? "after a notice" : "without notice"} at step ` +
          `${p.reached_step}: ${p.lost_steps} step(s) redone, ${p.survivors} group(s) trained on ` +
          `after a ${duration(p.stall_s)} stall`,
          p.replaced_after_s !== null && p.replaced_after_s !== undefined
            ? `replaced after ${duration(p.replaced_after_s)}` : "replacement on its way"]);
        continue;
      }
      rows.push([p.time, "preemption",
        `${p.notice ? "with" : "without"} notice at step ${p.reached_step}: ${p.lost_steps} steps lost, ` +
        `down ${duration(p.down_s)}, ${usd(p.extra_cost_usd)} extra`,
        `${p.before} → ${p.after || "(not resumed yet)"}`]);
    }
    for (const e of seen) {
      if (e.type === "state") rows.push([e.time, "state", e.data.state, e.data.message || ""]);
      if (e.type === "checkpoint") rows.push([e.time, "checkpoint", `step ${e.data.step}`, e.data.path]);
    }
    return rows.sort((a, b) => a[0] - b[0]);
  }

  function errorBox(text) {
    const [what, fix] = text.split(/To fix:\s*/);
    return h("div", { class: "alert", role: "alert", id: "job-error" }, h("div", {}, what.trim()),
      fix ? h("div", { class: "fix" }, `To fix: ${fix}`) : null);
  }

  async function jobPage(id) {
    const first = await api("GET", `/v1/jobs/${encodeURIComponent(id)}`);
    if (!first.ok) {
      mount(h("h1", {}, "No such job"), h("div", { class: "alert", role: "alert" },
        typeof first.data === "object" ? first.data.detail : String(first.data)),
        h("p", {}, h("a", { href: "#/jobs" }, "Back to the jobs")));
      return;
    }
    let job = first.data;
    const header = h("div", { id: "job-header" });
    const stats = h("div", { class: "stats", id: "job-stats" });
    const lossEl = h("div", { class: "chart", id: "chart-loss" });
    const speedEl = h("div", { class: "chart", id: "chart-speed" });
    const costEl = h("div", { class: "chart", id: "chart-cost" });
    const capEl = h("div", { class: "chart", id: "chart-capacity" });
    const events = h("div", { class: "scroll", id: "job-events" });
    const plan = h("div", { id: "job-plan" });
    const checkpoints = h("div", { id: "job-checkpoints" });
    mount(header, stats,
      h("h2", {}, "Training"), h("div", { class: "charts" }, lossEl, speedEl),
      h("h2", {}, "Dollars"), h("div", { class: "charts" }, costEl),
      h("h2", {}, "Capacity held"), h("div", { class: "charts" }, capEl), events,
      h("div", { class: "split" }, h("section", {}, h("h2", {}, "Plan"), plan),
        h("section", {}, h("h2", {}, "Checkpoints"), checkpoints)));

    const loss = chart(lossEl, "Loss by step",
      [{ label: "loss", stroke: COLORS.loss, width: 2 },
       { label: "val loss", stroke: COLORS.val, width: 2, dash: [6, 4], spanGaps: true,
         points: { show: true, size: 6, fill: COLORS.val } }],
      undefined, { x: { time: false } });
    const speed = chart(speedEl, "Tokens per second",
      [{ label: "tokens/s", stroke: COLORS.speed, width: 2 }]);
    const cost = chart(costEl, "Spent", [
      { label: "spent ($)", stroke: COLORS.cost, width: 2, scale: "usd", value: (u, v) => usd(v) },
      { label: "rate ($/h)", stroke: COLORS.rate, width: 1, dash: [6, 4], scale: "rate",
        value: (u, v) => v === null ? "–" : `${usd(v)}/h` }],
      [{}, { scale: "usd", values: usdTicks(), size: 70 },
       { scale: "rate", side: 1, grid: { show: false }, values: usdTicks("/h"), size: 80 }],
      { x: { time: true }, usd: { range: (u, lo, hi) => [0, Math.max(hi, 0.01)] },
        rate: { range: (u, lo, hi) => [0, Math.max(hi, 0.01)] } });
    const cap = chart(capEl, "Nodes held (red: preemption)", [
      { label: "nodes", stroke: COLORS.nodes, width: 2, fill: "rgba(29,78,216,.12)",
        paths: uPlot.paths.stepped({ align: 1 }) },
      { label: "preempted", stroke: COLORS.preempt, paths: () => null,
        points: { show: true, size: 12, fill: COLORS.preempt } }],
      undefined, { x: { time: true }, y: { range: (u, lo, hi) => [0, Math.max(1, hi) + 0.5] } });

    const history = await api("GET", `/v1/jobs/${encodeURIComponent(id)}/history`);
    const points = history.ok ? history.data.points : [];
    const seen = [];  // state and checkpoint events seen on the stream
    let pending = false;
    const redraw = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        if (!view.live) return;
        const bySteps = new Map();  // a step redone after a restart: its latest loss
        const valBySteps = new Map();  // each validation loss at the step it was measured
        for (const p of points) {
          if (p.loss !== null) bySteps.set(p.step, p.loss);
          if (p.val_loss != null && p.val_step != null) valBySteps.set(p.val_step, p.val_loss);
        }
        const steps = [...new Set([...bySteps.keys(), ...valBySteps.keys()])]
          .sort((a, b) => a - b);
        loss.setData([steps, steps.map((s) => bySteps.has(s) ? bySteps.get(s) : null),
                      steps.map((s) => valBySteps.has(s) ? valBySteps.get(s) : null)]);
        lossEl.dataset.valPoints = String(valBySteps.size);
        speed.setData([points.map((p) => p.time), points.map((p) => p.tokens_per_s)]);
        cost.setData([points.map((p) => p.time), points.map((p) => p.cost_usd),
                      points.map((p) => p.usd_per_hour)]);
        cap.setData(timeline(job, Date.now() / 1000));
        lossEl.dataset.points = String(steps.length);
      });
    };

    const drawJob = () => {
      const p = job.progress;
      const cancel = terminal(job.state) ? null : h("button", { type: "button", class: "danger",
        id: "cancel", onclick: () => confirmCancel(job) }, "Cancel job");
      fill(header, 
        h("div", { class: "row" }, h("h1", {}, job.spec.name || job.id), stateBadge(job.state),
          h("span", { class: "muted" }, job.id), h("span", { style: "flex: 1" }), cancel),
        job.message && !terminal(job.state) ? h("p", { class: "muted", id: "job-message" }, job.message) : null,
        job.error ? errorBox(job.error) : null);
      header.querySelector(".state").id = "job-state";
      const stat = (label, value, statId) => h("div", { class: "stat" },
        h("div", { class: "label" }, label), h("div", { class: "value", id: statId }, value));
      fill(stats, 
        stat("Step", `${p.step} / ${p.total_steps}`, "stat-step"),
        stat("Loss", num(p.loss, 4), "stat-loss"),
        stat("Val loss", p.val_loss == null ? "–" : `${num(p.val_loss, 4)} (perplexity ${
          num(p.val_perplexity, 3)})`, "stat-val-loss"),
        stat("Tokens/s", num(p.tokens_per_s), "stat-speed"),
        stat("MFU", p.mfu == null ? "–" : num(100 * p.mfu, 1) + "%", "stat-mfu"),
        stat("ETA", terminal(job.state) ? "–" : duration(p.eta_s), "stat-eta"),
        stat("Spent", usd(job.cost_usd), "stat-cost"),
        stat("Rate", `${usd(job.resources.usd_per_hour)}/h`, "stat-rate"),
        stat("Capacity", capacity(job), "stat-capacity"),
        stat("Preemptions", `${job.preemptions} (${job.lost_steps} steps lost)`, "stat-preemptions"),
        stat("Restarts", String(job.restarts), "stat-restarts"));
      const rows = happenings(job, seen);
      fill(events, rows.length ? h("table", {},
        h("thead", {}, h("tr", {}, ["When", "What", "", "Why / detail"].map((t) => h("th", { scope: "col" }, t)))),
        h("tbody", {}, rows.map(([t, kind, what, why]) => h("tr", { "data-kind": kind },
          h("td", {}, clock(t)), h("td", {}, kind), h("td", {}, what), h("td", {}, why)))))
        : h("p", { class: "muted" }, "Nothing held yet."));
      const pl = job.plan;
      fill(plan, pl ? h("dl", { class: "facts" },
        h("dt", {}, "Layout"), h("dd", {}, `${pl.strategy}: ${pl.description}`),
        h("dt", {}, "Step time"), h("dd", { id: "plan-step" },
          `predicted ${num(pl.predicted_step_s)} s, measured ${num(pl.measured_step_s)} s` +
          (pl.predicted_step_s && pl.measured_step_s ? ` (${num(pl.measured_step_s / pl.predicted_step_s, 2)}×)` : "")),
        h("dt", {}, "Tokens/s"), h("dd", {}, `predicted ${num(pl.predicted_tokens_per_s)}`),
        h("dt", {}, "Memory"), h("dd", {}, `${num(pl.predicted_memory_gib)} GiB per device (predicted)`),
        h("dt", {}, "Batch"), h("dd", {}, `${pl.tokens_per_step} tokens per step, ${pl.grad_accum_steps} micro-batch(es) accumulated`),
        h("dt", {}, "Backend"), h("dd", {}, pl.backend),
        pl.reason ? [h("dt", {}, "Why"), h("dd", {}, pl.reason)] : null,
        tracked(job.tracking))
        : h("p", { class: "muted" }, "No plan."));
      const c = job.checkpoint;
      const saved = seen.filter((e) => e.type === "checkpoint");
      fill(checkpoints, c ? h("dl", { class: "facts" },
        h("dt", {}, "Latest"), h("dd", { id: "checkpoint-step" }, `step ${c.step}`),
        h("dt", {}, "Where"), h("dd", {}, c.path),
        h("dt", {}, "Saved in"), h("dd", {}, c.save_s === null ? "–" : `${num(c.save_s)} s`))
        : h("p", { class: "muted" }, "No checkpoint yet."),
        saved.length ? h("p", { class: "muted" }, `Saved at steps ${saved.map((e) => e.data.step).join(", ")}.`) : null);
      redraw();
    };

    // Each tracker's run: a link where it is a web page (http(s) only), else its folder.
    const tracked = (t) => t ? [
      Object.entries(t.runs).map(([name, run]) => [h("dt", {}, `${name} run`),
        h("dd", { class: "tracked-run" }, run.url && /^https?:\/\//.test(run.url)
          ? h("a", { href: run.url, target: "_blank", rel: "noopener noreferrer" }, run.url)
          : (run.url || run.run_id || "–"))]),
      t.warning ? [h("dt", {}, "Tracking"), h("dd", { class: "warn" }, t.warning)] : null] : null;

    let refreshing = null;
    const refresh = () => {
      refreshing = refreshing || (async () => {
        try {
          const answer = await api("GET", `/v1/jobs/${encodeURIComponent(id)}`);
          if (answer.ok && view.live) { job = answer.data; drawJob(); }
        } finally { refreshing = null; }
      })();
      return refreshing;
    };

    drawJob();
    const lastPoint = points.length ? points[points.length - 1].time : -Infinity;
    view.every(async () => { if (!terminal(job.state)) await refresh(); }, JOB_POLL_MS);
    const signal = view.signal;
    follow(`/v1/jobs/${encodeURIComponent(id)}/events`, -1, (event) => {
      if (event.type === "progress") {
        if (event.time > lastPoint) {
          const d = event.data;
          points.push({ time: event.time, step: d.step, loss: d.loss, tokens_per_s: d.tokens_per_s,
                        cost_usd: d.cost_usd || 0, usd_per_hour: d.usd_per_hour || 0,
                        val_loss: d.val_loss, val_step: d.val_step });
          job.progress = { ...job.progress, step: d.step, loss: d.loss,
                           tokens_per_s: d.tokens_per_s, eta_s: d.eta_s };
          if (d.val_loss != null) {
            job.progress = { ...job.progress, val_loss: d.val_loss, val_step: d.val_step,
                             val_perplexity: d.val_perplexity };
          }
          if (d.cost_usd !== undefined) job.cost_usd = d.cost_usd;
          drawJob();
        }
        return false;
      }
      if (event.type === "state" || event.type === "checkpoint") seen.push(event);
      view.run(refresh);
      return event.type === "end";
    }, signal);
  }

  function confirmCancel(job) {
    const dialog = document.getElementById("confirm");
    document.getElementById("confirm-text").textContent =
      `${job.spec.name || job.id} (${job.id}) stops now; its capacity is released. ` +
      "Its checkpoints are kept, so it can be resumed later.";
    dialog.returnValue = "";
    dialog.addEventListener("close", () => view.run(async () => {
      if (dialog.returnValue !== "yes") return;
      const answer = await api("DELETE", `/v1/jobs/${encodeURIComponent(job.id)}`);
      if (!answer.ok) {
        fill(document.getElementById("page-error"), h("div", { class: "alert", role: "alert" },
          answer.data.detail || `cancel answered ${answer.status}`));
      }
      route();
    }), { once: true });
    dialog.showModal();
  }

  // ------------------------------------------------------------------- spec editing

  // A pasted or uploaded spec: YAML (JSON is YAML too). Throws with the line on a typo.
  function parseSpec(text) {
    const value = jsyaml.load(text);
    if (!value || typeof value !== "object" || Array.isArray(value)) {
      throw new Error("the spec must be a mapping (name:, model:, training:, ...)");
    }
    return value;
  }

  // The line of `text` that names the field at `path` (["training", "steps"]), or -1.
  function lineOf(text, path) {
    const lines = text.split("\n");
    let at = -1, indent = -1;
    for (const key of path) {
      if (typeof key === "number") continue;
      const pattern = new RegExp(`^(\\s*)(?:-\\s+)?["']?${key.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}["']?\\s*:`);
      let found = -1;
      for (let i = at + 1; i < lines.length; i++) {
        const m = lines[i].match(pattern);
        if (m && m[1].length > indent) { found = i; indent = m[1].length; break; }
      }
      if (found < 0) break;
      at = found;
    }
    return at;
  }

  // 422 details as [path, message] with the body's wrapping ("body", "spec") taken off.
  function fieldProblems(detail, wrapped) {
    if (!Array.isArray(detail)) return [[[], typeof detail === "string" ? detail : JSON.stringify(detail)]];
    return detail.map((d) => {
      let loc = (d.loc || []).slice(d.loc && d.loc[0] === "body" ? 1 : 0);
      if (wrapped && loc[0] === "spec") loc = loc.slice(1);
      return [loc, d.msg + (d.suggestions && d.suggestions.length ? ` Try: ${d.suggestions.join("; ")}` : "")];
    });
  }

  function annotated(text, problems) {
    const lines = text.replace(/\n+$/, "").split("\n");
    const at = new Map();
    for (const [path, message] of problems) {
      const line = lineOf(text, path);
      if (!at.has(line)) at.set(line, []);
      at.get(line).push([path, message]);
    }
    const note = ([path, message]) => h("li", { class: "field-error", "data-field": path.join(".") },
      h("span", { class: "ln" }, "↑"), h("span", {}, h("code", {}, path.join(".") || "spec"), `: ${message}`));
    const items = [];
    for (const problem of at.get(-1) || []) items.push(note(problem));
    lines.forEach((line, i) => {
      items.push(h("li", { class: at.has(i) ? "has-error" : null },
        h("span", { class: "ln" }, String(i + 1)), h("span", {}, line || " ")));
      for (const problem of at.get(i) || []) items.push(note(problem));
    });
    return h("ol", { class: "annotated", "aria-label": "The spec, with what to fix" }, items);
  }

  function specEditor(id, label) {
    const area = h("textarea", { id, name: id, spellcheck: "false",
      placeholder: "name: my-job\nmodel:\n  kind: gpt\n  ...", "aria-describedby": `${id}-help` });
    const file = h("input", { type: "file", id: `${id}-file`, accept: ".yaml,.yml,.json,application/json,text/yaml",
      onchange: async () => { if (file.files[0]) area.value = await file.files[0].text(); } });
    return { area, nodes: [
      h("label", { for: id }, label), area,
      h("p", { class: "muted", id: `${id}-help` }, "YAML or JSON, as for `raytrain submit FILE`. ",
        h("label", { for: `${id}-file`, style: "display: inline; font-weight: 400" }, "Or upload a file: "), file)] };
  }

  function planTable(plans) {
    return h("div", { class: "scroll" }, h("table", { id: "plans" },
      h("thead", {}, h("tr", {}, ["#", "Layout", "Step s", "Tokens/s", "MFU", "Memory GiB", "Why"]
        .map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, plans.map((p) => h("tr", {},
        h("td", {}, p.rank), h("td", {}, p.layout), h("td", { class: "num" }, num(p.step_s)),
        h("td", { class: "num" }, num(p.tokens_per_s)), h("td", { class: "num" }, num(100 * p.mfu, 2) + "%"),
        h("td", { class: "num" }, `${num(p.memory_gib)} / ${num(p.memory_limit_gib)}`),
        h("td", {}, p.reason))))));
  }

  // ---------------------------------------------------------------------- submit

  async function submitPage() {
    const editor = specEditor("spec", "Job spec");
    const result = h("div", { id: "submit-result", "aria-live": "polite" });
    let key = null;
    editor.area.addEventListener("input", () => { key = null; });
    const read = () => {
      try { return parseSpec(editor.area.value); } catch (error) {
        const line = error.mark ? ` (line ${error.mark.line + 1})` : "";
        fill(result, h("div", { class: "alert", role: "alert", id: "parse-error" },
          `The spec is not valid YAML or JSON${line}: ${error.reason || error.message}`));
        return null;
      }
    };
    const showProblems = (answer, wrapped) => {
      const problems = fieldProblems(answer.data.detail, wrapped);
      fill(result, h("div", { class: "alert", role: "alert", id: "field-errors" },
        `${problems.length} field${problems.length === 1 ? "" : "s"} to fix, shown under the lines that set them:`),
        annotated(editor.area.value, problems));
    };
    const preview = () => view.run(async () => {
      const spec = read();
      if (!spec) return;
      const answer = await api("POST", "/v1/plans", { spec });
      if (!answer.ok) { showProblems(answer, true); return; }
      const d = answer.data;
      fill(result, h("h2", {}, `Plans on ${d.gpus} × ${d.accelerator} (${d.shape} nodes, ${d.precision})`), planTable(d.plans));
    });
    const submit = () => view.run(async () => {
      const spec = read();
      if (!spec) return;
      key = key || (crypto.randomUUID ? crypto.randomUUID() : String(Math.random()).slice(2));
      const answer = await api("POST", "/v1/jobs", spec, { "Idempotency-Key": key });
      if (answer.status === 202) { location.hash = `#/jobs/${answer.data.id}`; return; }
      if (answer.status === 422) { showProblems(answer, false); return; }
      fill(result, h("div", { class: "alert", role: "alert" },
        answer.data.detail || `the service answered ${answer.status}`));
    });
    mount(h("h1", {}, "Submit a job"), ...editor.nodes,
      h("div", { class: "row" }, h("button", { type: "button", id: "submit", onclick: submit }, "Submit"),
        h("button", { type: "button", class: "quiet", id: "preview", onclick: preview }, "Preview the plan")),
      result);
    editor.area.focus();
  }

  // ----------------------------------------------------------------------- offers

  async function offersPage() {
    const answer = await api("GET", "/v1/offers");
    const d = answer.data;
    const observed = new Map((d.observed || []).map((o) => [o.offer, o]));
    const offerId = (o) => `${o.provider}/${o.region}/${o.instance_type}`;
    const perHour = (x) => x === null || x === undefined ? "–" : usd(x);
    const offers = h("div", { class: "scroll" }, h("table", { id: "offers" },
      h("thead", {}, h("tr", {}, ["Offer", "GPUs", "Interconnect", "On-demand /h", "Spot /h",
        "Interruptions /node-h: prior", "seen", "estimate"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, d.offers.map((o) => {
        const seen = observed.get(offerId(o));
        return h("tr", {},
          h("td", {}, `${o.provider} ${o.instance_type}`, h("div", { class: "muted" }, o.region)),
          h("td", {}, `${o.gpus_per_node} × ${o.gpu_kind}`),
          h("td", {}, `${o.intra_link}; ${num(o.network_gbps)} Gbit/s${o.rdma ? " RDMA" : ""}`),
          h("td", { class: "num" }, perHour(o.on_demand_usd_per_hour)),
          h("td", { class: "num" }, perHour(o.spot_usd_per_hour)),
          h("td", { class: "num" }, o.spot_usd_per_hour === null ? "–" : num(o.spot_interruptions_per_hour)),
          h("td", { class: "num" }, seen ? `${seen.preemptions} in ${num(seen.spot_node_hours)} h` : "–"),
          h("td", { class: "num" }, seen ? num(seen.estimate_per_node_hour) : "–"));
      }))));
    const editor = specEditor("offers-spec", "A job spec to rank the offers for");
    const ranking = h("div", { id: "ranking", "aria-live": "polite" });
    const rank = () => view.run(async () => {
      let spec;
      try { spec = parseSpec(editor.area.value); } catch (error) {
        fill(ranking, h("div", { class: "alert", role: "alert" }, `Not valid YAML or JSON: ${error.reason || error.message}`));
        return;
      }
      const ranked = await api("POST", "/v1/offers", { spec, keep: 20 });
      if (!ranked.ok) {
        fill(ranking, annotated(editor.area.value, fieldProblems(ranked.data.detail, true)));
        return;
      }
      const r = ranked.data;
      fill(ranking, 
        r.decision ? h("p", { id: "decision" }, h("strong", {}, `${r.policy}: `), r.decision) : null,
        r.ranking.length ? h("div", { class: "scroll" }, h("table", { id: "ranking-table" },
          h("thead", {}, h("tr", {}, ["#", "Offer", "Market", "Nodes", "$/h", "Tokens/s", "Layout",
            "Preemptions/h", "Hours", "Expected $"].map((t) => h("th", { scope: "col" }, t)))),
          h("tbody", {}, r.ranking.map((o) => h("tr", {},
            h("td", {}, o.rank), h("td", {}, o.offer), h("td", {}, o.market), h("td", { class: "num" }, o.nodes),
            h("td", { class: "num" }, usd(o.usd_per_hour)), h("td", { class: "num" }, num(o.tokens_per_s)),
            h("td", {}, o.layout), h("td", { class: "num" }, num(o.preemptions_per_hour)),
            h("td", { class: "num" }, num(o.expected_hours)), h("td", { class: "num" }, usd(o.expected_cost_usd)))))))
          : h("p", { class: "muted" }, "No offer holds this job."));
    });
    mount(h("h1", {}, "Offers"),
      h("p", { class: "muted" }, `Catalog ${d.catalog_version}; prices from ${d.source}.`),
      (d.warnings || []).map((w) => h("div", { class: "alert warn" }, w)),
      offers, h("h2", {}, "The policy's ranking for a job"), ...editor.nodes,
      h("div", { class: "row" }, h("button", { type: "button", id: "rank", onclick: rank }, "Rank the offers")),
      ranking);
  }

  // ------------------------------------------------------------------------ start

  async function start() {
    document.getElementById("signout").addEventListener("click", () => {
      try { signOut("Signed out."); } catch (_) { /* signOut ends the page by throwing */ }
    });
    window.addEventListener("hashchange", () => { route(); });
    try {
      const health = await (await fetch("/healthz")).json();
      authRequired = health.auth !== false;
    } catch (_) { authRequired = true; }
    await route();
  }

  window.addEventListener("unhandledrejection", (e) => {
    if (e.reason instanceof SignedOut || (e.reason && e.reason.name === "AbortError")) e.preventDefault();
  });
  start();
})();
