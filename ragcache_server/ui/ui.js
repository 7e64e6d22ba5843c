// The ragcache dashboard: plain JavaScript, no build step, no library. It reads the API with the key the
// operator types in (kept in sessionStorage, for this tab only, never in a URL) and renders every value as
// text (textContent), never as markup, so nothing an API answer holds can run as script here.
"use strict";

(() => {
  const KEY_STORE = "ragcache.ui.key";
  const FETCH_TIMEOUT_MS = 10000; // a call the service has not answered by then is shown as failed
  const CHART_WINDOW_MS = 5 * 60 * 1000; // the chart's time axis: at most the last five minutes, now at the right
  const MIN_CHART_WINDOW_MS = 60 * 1000; // and at least the last minute, so a young chart is not a sliver
  const HISTORY_POINTS = 300; // points kept per chart line (5 minutes at a 1 s refresh)
  const MAX_PREFIXES = 50; // prefixes whose stats one refresh reads (one call each)
  const COLORS = ["#2f6fde", "#e08a1e", "#8e44ad", "#16a2b8", "#c0392b"];
  // A dash pattern per line as well as a colour: two levels at the same rate (L2 and L3 both at 0%) stay apart.
  const DASHES = ["", "7 3", "2 3", "9 3 2 3", "4 4"];
  // Fields of a model's figures this page lays out itself; any other number the service adds (tokens or
  // money saved, upstream calls of a provider) is shown as an extra tile under its own name.
  const KNOWN_TOTALS = new Set(["space_id", "model", "period", "period_s", "requests", "texts", "hits", "hit_rate",
    "texts_computed", "compute_s", "compute_s_saved", "levels"]);
  const KNOWN_ENTRY = new Set(["space", "levels", "since_start", "recent"]);
  const KNOWN_LEVEL = new Set(["level", "lookups", "hits", "misses", "errors", "hit_rate", "latency_mean_ms",
    "latency_p50_ms", "latency_p99_ms", "misses_by_cause"]);
  const KNOWN_HIT = new Set(["id", "score", "text", "metadata"]);
  const KNOWN_PREFIX = new Set(["name", "version", "num_tokens", "pinned", "num_warms", "num_resident", "num_evicted",
    "num_errors", "num_skipped", "residency_rate", "last_outcome", "last_warm_at", "rewarm_interval_s", "num_uses",
    "endpoints"]);

  let apiKey = sessionStorage.getItem(KEY_STORE) || "";
  let timer = null;
  let busy = false;
  const previousTotals = new Map(); // model -> the last since_start figures (for rates between refreshes)
  const history = new Map(); // model -> {lines: Map(level -> [{t: ms since epoch, value: rate or null}])}
  let targetsInUse = null; // the vLLM targets some registered prefix uses (null: unknown, the key may not list them)
  let lastTargets = [];

  // ---- small helpers ------------------------------------------------------------------------------------

  const $ = (id) => document.getElementById(id);

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === undefined || value === null) continue;
      if (name === "text") node.textContent = String(value);
      else if (name === "className") node.className = value;
      else if (name === "title") node.title = String(value);
      else node.setAttribute(name, String(value));
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function svgEl(tag, attributes) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [name, value] of Object.entries(attributes)) {
      if (value !== null && value !== undefined) node.setAttribute(name, String(value));
    }
    return node;
  }

  const fmtInt = (n) => (typeof n === "number" ? Math.round(n).toLocaleString("en-US") : "–");
  const fmtPct = (x) => (typeof x === "number" ? (x * 100).toFixed(1) + "%" : "–");
  const fmtMs = (x) => (typeof x === "number" ? x.toFixed(3) : "–");
  const fmtNum = (x) => (typeof x === "number" ? (Number.isInteger(x) ? fmtInt(x) : x.toPrecision(4)) : String(x ?? "–"));
  const label = (name) => name.replace(/_/g, " ");

  function fmtBytes(n) {
    if (typeof n !== "number") return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
  }

  function fmtAgo(epochS) {
    if (typeof epochS !== "number") return "never";
    const s = Math.max(0, Date.now() / 1000 - epochS);
    if (s < 90) return Math.round(s) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    return Math.round(s / 3600) + " h ago";
  }

  // A level's misses by cause (ragcache.core.causes), the causes that counted anything: "never seen 3, evicted 1".
  function fmtCauses(causes) {
    const parts = Object.entries(causes || {}).filter(([, n]) => n > 0).map(([cause, n]) => cause.replace("_", " ") + " " + fmtInt(n));
    return parts.length ? parts.join(", ") : "–";
  }

  // Per vLLM endpoint, one line of what its KV events say (issue 30): the prefix's resident blocks of its full blocks,
  // or why they are unknown, then the reasons it cannot be kept cached. Text only (set as text, never as HTML); the
  // counts also as data-resident-blocks / data-num-blocks, per line (data-endpoint), for a script or a test to read.
  function engineCell(endpoints) {
    const lines = endpoints.map((e) => {
      const counted = e.events === "synced" && e.num_blocks !== null && e.resident_blocks !== null;
      const blocks = counted ? `${fmtInt(e.resident_blocks)}/${fmtInt(e.num_blocks)} blocks resident`
        : e.events === "off" ? "no events" : e.events === "synced" ? "synced, blocks not known yet" : e.events.replace("_", " ");
      const keep = e.keepable === false ? ", not keepable" : "";
      const why = (e.why_not_cached || []).length ? " — " + e.why_not_cached.join("; ") : "";
      return el("div", { "data-endpoint": e.base_url, "data-events": e.events,
        "data-resident-blocks": counted ? e.resident_blocks : null, "data-num-blocks": counted ? e.num_blocks : null,
        text: `${e.base_url}: ${blocks}${keep}${why}` });
    });
    return el("td", { "data-field": "engine", "data-value": endpoints.map((e) => e.resident_blocks).join(","), className: "text" },
      ...(lines.length ? lines : ["–"]));
  }

  // A value of any shape as short text: numbers formatted, objects as compact JSON.
  function fmtAny(value) {
    if (typeof value === "number") return fmtNum(value);
    if (value === null || value === undefined) return "–";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  // ---- the API ------------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  // Relative paths, so the page works behind a root path; the key goes in a header, never in the URL.
  async function api(path, options = {}) {
    const headers = { Accept: "application/json" };
    if (apiKey) headers.Authorization = "Bearer " + apiKey;
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    const controller = new AbortController();
    const timeout = setTimeout(() => controller.abort(), FETCH_TIMEOUT_MS);
    let response;
    try {
      response = await fetch(path, {
        method: options.method || "GET",
        headers,
        body: options.body === undefined ? undefined : JSON.stringify(options.body),
        signal: controller.signal,
        cache: "no-store",
        credentials: "omit",
      });
    } catch (error) {
      throw new ApiError(0, error.name === "AbortError" ? `no answer within ${FETCH_TIMEOUT_MS / 1000} s` : "the service is unreachable");
    } finally {
      clearTimeout(timeout);
    }
    const body = await response.json().catch(() => null);
    if (response.status === 401) $("key-form").hidden = false;
    if (!response.ok) {
      const message = body && body.error && body.error.message ? body.error.message : `HTTP ${response.status}`;
      throw new ApiError(response.status, message);
    }
    return body;
  }

  // What a panel says when its call was refused: the page shows what the key's scopes allow, no more.
  function refusal(error) {
    if (error.status === 401) return "Needs an API key: enter one above.";
    if (error.status === 403) return "Not for this key: " + error.message;
    if (error.status === 0) return "Could not load: " + error.message + ".";
    return `Could not load (HTTP ${error.status}): ${error.message}`;
  }

  function setStatus(id, text) {
    $(id).textContent = text || "";
  }

  // ---- health -------------------------------------------------------------------------------------------

  async function refreshHealth() {
    const badge = $("health");
    try {
      const health = await api("health");
      badge.textContent = health.status === "ok" ? "ok" : "degraded: " + health.levels_down.join(", ") + " down";
      badge.className = "badge " + (health.status === "ok" ? "ok" : "degraded");
    } catch (error) {
      badge.textContent = "unreachable";
      badge.className = "badge degraded";
    }
  }

  // ---- models: tiles, levels, chart ---------------------------------------------------------------------

  async function refreshStats() {
    let stats;
    try {
      stats = await api("stats");
    } catch (error) {
      setStatus("models-status", refusal(error));
      $("models").replaceChildren();
      $("targets").replaceChildren();
      return;
    }
    // Answered without a key: this service has none, and the key box would only puzzle (it comes back on a 401).
    $("key-form").hidden = !apiKey;
    setStatus("models-status", Object.keys(stats.models).length ? "" : "No model is served.");
    const sections = Object.entries(stats.models).map(([model, entry]) => {
      record(model, entry.since_start);
      return renderModel(model, entry);
    });
    // Rerankers' scores are cached like vectors, with the same figures: the same card, named as such.
    for (const [name, entry] of Object.entries(stats.rerankers || {})) {
      record("reranker " + name, entry.since_start);
      sections.push(renderModel("reranker " + name, entry));
    }
    // Sections this page does not know yet (a newer service) are still shown, as plain values.
    const unknown = Object.entries(stats).filter(([name]) => !["models", "rerankers", "prefixes"].includes(name));
    if (unknown.length) sections.push(renderExtras(unknown));
    $("models").replaceChildren(...sections);
    renderTargets(stats.prefixes && stats.prefixes.targets ? stats.prefixes.targets : []);
  }

  // Hit rate per level between two refreshes, from the difference of the since-start counters (they only
  // grow, so the difference is exactly what happened in between); null where nothing was looked up.
  function record(model, totals) {
    const before = previousTotals.get(model);
    previousTotals.set(model, totals);
    if (!history.has(model)) history.set(model, { lines: new Map() });
    if (!before) return;
    const lines = history.get(model).lines;
    const now = Date.now();
    const push = (name, value) => {
      if (!lines.has(name)) lines.set(name, []);
      const line = lines.get(name);
      line.push({ t: now, value });
      while (line.length > HISTORY_POINTS || (line.length && now - line[0].t > CHART_WINDOW_MS)) line.shift();
    };
    // One line per level (the "any level" rate is the tile above: drawn here it hid L1's line, equal to it when
    // L1 serves every hit).
    for (const level of totals.levels) {
      const old = before.levels.find((l) => l.level === level.level);
      const lookups = level.lookups - (old ? old.lookups : 0);
      push(level.level, lookups > 0 ? (level.hits - (old ? old.hits : 0)) / lookups : null);
    }
  }

  function tile(field, caption, value, text) {
    return el("div", { className: "tile", "data-field": field, "data-value": value },
      el("div", { className: "label", text: caption }), el("div", { className: "value", text }));
  }

  function renderModel(model, entry) {
    const totals = entry.since_start;
    const tiles = [
      tile("texts", "texts asked for", totals.texts, fmtInt(totals.texts)),
      tile("hit_rate", "hit rate (any level)", totals.hit_rate, fmtPct(totals.hit_rate)),
      tile("texts_computed", "texts computed", totals.texts_computed, fmtInt(totals.texts_computed)),
      tile("compute_s_saved", "compute saved", totals.compute_s_saved, totals.compute_s_saved.toFixed(2) + " s"),
      tile("compute_s", "compute spent", totals.compute_s, totals.compute_s.toFixed(2) + " s"),
      tile("requests", "requests", totals.requests, fmtInt(totals.requests)),
    ];
    for (const [name, value] of Object.entries(totals)) {
      if (!KNOWN_TOTALS.has(name) && typeof value === "number") tiles.push(tile(name, label(name), value, fmtNum(value)));
    }
    const extras = Object.entries(entry).filter(([name]) => !KNOWN_ENTRY.has(name));
    return el("section", { className: "model", "data-model": model },
      el("h3", { text: model }, el("span", { className: "muted", text: "  space " + entry.space.space_id })),
      el("div", { className: "tiles" }, ...tiles),
      el("div", { className: "row" }, renderLevels(entry), renderChart(model)),
      extras.length ? renderExtras(extras) : null);
  }

  function cell(field, value, text, className) {
    return el("td", { "data-field": field, "data-value": value, className }, typeof text === "string" ? text : text);
  }

  function renderLevels(entry) {
    const totals = entry.since_start;
    const recent = new Map(entry.recent.levels.map((l) => [l.level, l]));
    const extraNames = [...new Set(totals.levels.flatMap((l) => Object.keys(l).filter((k) => !KNOWN_LEVEL.has(k))))];
    const head = el("tr", {}, ...["level", "state", "outages", "lookups", "texts served", "misses", "why missed", "errors",
      "hit rate", "recent hit rate", "p50 ms", "p99 ms", "fill", "admission", ...extraNames.map(label)].map((h) => el("th", { text: h })));
    const rows = totals.levels.map((level) => {
      const state = entry.levels[level.level] || {};
      const stateText = state.up === false ? "down" : "up";
      const stateCell = el("td", { "data-field": "up", "data-value": state.up !== false },
        el("span", { className: "state " + stateText, text: stateText, title: state.last_error || "" }));
      return el("tr", { "data-level": level.level },
        el("td", { text: level.level }),
        stateCell,
        cell("num_outages", state.num_outages, fmtInt(state.num_outages)),
        cell("lookups", level.lookups, fmtInt(level.lookups)),
        cell("hits", level.hits, fmtInt(level.hits)),
        cell("misses", level.misses, fmtInt(level.misses)),
        cell("misses_by_cause", JSON.stringify(level.misses_by_cause || {}), fmtCauses(level.misses_by_cause)),
        cell("errors", level.errors, fmtInt(level.errors)),
        cell("hit_rate", level.hit_rate, fmtPct(level.hit_rate)),
        cell("recent_hit_rate", recent.has(level.level) ? recent.get(level.level).hit_rate : null,
          recent.has(level.level) && recent.get(level.level).lookups ? fmtPct(recent.get(level.level).hit_rate) : "–"),
        cell("latency_p50_ms", level.latency_p50_ms, fmtMs(level.latency_p50_ms)),
        cell("latency_p99_ms", level.latency_p99_ms, fmtMs(level.latency_p99_ms)),
        fillCell(state),
        admissionCell(state),
        ...extraNames.map((name) => cell(name, level[name], fmtAny(level[name]))));
    });
    const compute = el("tr", { "data-level": "compute" }, el("td", { text: "compute" }), el("td", {}),
      el("td", {}), el("td", {}), cell("hits", totals.texts_computed, fmtInt(totals.texts_computed)),
      ...Array.from({ length: 9 + extraNames.length }, () => el("td", {})));
    return el("table", { className: "grid levels" }, head, ...rows, compute);
  }

  // Which vectors a level takes, for one that takes only some (L3 on reuse): the rule, what it took and declined.
  function admissionCell(state) {
    if (typeof state.admission !== "string") return el("td", {});
    return el("td", { "data-field": "admission", "data-value": state.admission, "data-admitted": state.num_admitted,
      "data-declined": state.num_declined, title: "admitted: proved reuse; declined: computed, not written here" },
      `${state.admission}: ${fmtInt(state.num_admitted)} admitted, ${fmtInt(state.num_declined)} declined`);
  }

  // Any level's bytes against its budget (L1's slab, the disk level's files), in that level's row.
  function fillCell(state) {
    if (typeof state.used_bytes !== "number" || typeof state.capacity_bytes !== "number") return el("td", {});
    const ratio = state.capacity_bytes ? state.used_bytes / state.capacity_bytes : 0;
    const bar = el("span");
    bar.style.width = Math.min(100, ratio * 100).toFixed(1) + "%";
    return el("td", { "data-field": "used_bytes", "data-value": state.used_bytes,
      title: `${state.used_bytes} of ${state.capacity_bytes} bytes` },
      el("span", { className: "fill" }, bar), `${fmtBytes(state.used_bytes)} / ${fmtBytes(state.capacity_bytes)}`);
  }

  // Hit rate per level over time, drawn as SVG by hand (nothing loaded from elsewhere): a line per level on a time
  // axis of the last five minutes, now at the right; a gap where a level was not asked between two refreshes.
  function renderChart(model) {
    const width = 460, height = 180, left = 34, right = 10, top = 8, bottom = 30;
    const plotW = width - left - right, plotH = height - top - bottom;
    const chart = svgEl("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
      "aria-label": "hit rate per level over the last five minutes", "data-chart": model });
    for (const y of [0, 0.5, 1]) {
      const py = top + plotH * (1 - y);
      chart.append(svgEl("line", { x1: left, x2: width - right, y1: py, y2: py, stroke: "#e2e5eb" }));
      const tick = svgEl("text", { x: left - 4, y: py + 3, "text-anchor": "end" });
      tick.textContent = (y * 100).toFixed(0) + "%";
      chart.append(tick);
    }
    const now = Date.now();
    const lines = history.has(model) ? history.get(model).lines : new Map();
    // The axis spans what the page has seen, from one minute up to five, with a tick every 15 s, 30 s or minute.
    const oldest = Math.min(now, ...[...lines.values()].filter((points) => points.length).map((points) => points[0].t));
    const windowMs = Math.min(CHART_WINDOW_MS, Math.max(MIN_CHART_WINDOW_MS, now - oldest));
    const stepS = windowMs <= 60000 ? 15 : windowMs <= 120000 ? 30 : 60;
    const xOf = (t) => left + plotW * (1 - (now - t) / windowMs);
    for (let ago = Math.floor(windowMs / 1000 / stepS) * stepS; ago >= 0; ago -= stepS) {
      const x = xOf(now - ago * 1000);
      chart.append(svgEl("line", { x1: x, x2: x, y1: top, y2: top + plotH, stroke: "#eef0f4" }));
      const tick = svgEl("text", { x, y: top + plotH + 12, "text-anchor": ago === 0 ? "end" : "middle", "data-tick": ago });
      tick.textContent = ago === 0 ? "now" : ago % 60 === 0 ? `-${ago / 60} min` : `-${ago} s`;
      chart.append(tick);
    }
    const caption = svgEl("text", { x: left, y: height - 3 });
    caption.textContent = "hit rate per level between refreshes";
    chart.append(caption);
    const legend = el("div", { className: "legend" });
    let index = 0;
    for (const [name, points] of lines) {
      const color = COLORS[index % COLORS.length], dash = DASHES[index % DASHES.length];
      index++;
      let segment = [];
      const flush = () => {
        if (segment.length === 1) {
          const [x, y] = segment[0].split(",");
          chart.append(svgEl("circle", { cx: x, cy: y, r: 2.5, fill: color, "data-line": name }));
        } else if (segment.length > 1) {
          chart.append(svgEl("polyline", { points: segment.join(" "), fill: "none", stroke: color, "stroke-width": 2,
            "stroke-dasharray": dash || null, "data-line": name }));
        }
        segment = [];
      };
      for (const point of points) {
        if (now - point.t > windowMs) continue;
        if (point.value === null) { flush(); continue; }
        segment.push(`${xOf(point.t).toFixed(1)},${(top + plotH * (1 - point.value)).toFixed(1)}`);
      }
      flush();
      const swatch = el("span", { className: "swatch" });
      swatch.style.background = color;
      legend.append(el("span", { "data-legend": name }, swatch, name));
    }
    return el("div", {}, chart, legend);
  }

  // Figures this page has no layout for (a remote model's "upstream": calls, tokens, and the tokens and money
  // its cache hits saved): an object becomes a titled row of tiles, savings first; anything else one line.
  const FIRST_FIELDS = ["tokens_saved", "money_saved", "texts_saved"];

  function renderExtras(extras) {
    return el("div", { className: "extra" }, ...extras.map(([name, value]) => {
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        return el("div", { "data-field": name, text: `${label(name)}: ${fmtAny(value)}` });
      }
      const fields = Object.entries(value).sort(([a], [b]) => rank(a) - rank(b));
      if (!fields.length) return null;
      return el("div", { "data-section": name }, el("h4", { text: label(name) }),
        el("div", { className: "tiles" }, ...fields.map(([field, v]) =>
          tile(field, label(field), typeof v === "object" && v !== null ? JSON.stringify(v) : v, fmtField(field, v)))));
    }));
  }

  // A "..._at" number is a time (seconds since the epoch): shown as how long ago.
  function fmtField(field, value) {
    if (field.endsWith("_at") && (typeof value === "number" || value === null)) return fmtAgo(value);
    return fmtAny(value);
  }

  function rank(field) {
    const index = FIRST_FIELDS.indexOf(field);
    return index === -1 ? FIRST_FIELDS.length : index;
  }

  // The vLLM targets this process has talked to. One that no registered prefix uses any more is stale: its state
  // is its last one, kept for the record, and shown as such (after the others) rather than as a live "down".
  function renderTargets(targets) {
    lastTargets = targets;
    const table = $("targets");
    if (!targets.length) { table.replaceChildren(); return; }
    const head = el("tr", {}, ...["vLLM target", "state", "failures", "prefix-cache hit rate", "queries (tokens)",
      "hits (tokens)"].map((h) => el("th", { text: h })));
    const stale = (t) => targetsInUse !== null && !targetsInUse.has(t.base_url);
    const ordered = [...targets].sort((a, b) => Number(stale(a)) - Number(stale(b)));
    const stateOf = (t) => stale(t) ? { className: "stale", text: "stale: no prefix uses it", title: "last seen " + (t.up ? "up" : "down") }
      : { className: t.up ? "up" : "down", text: t.up ? "up" : "down" };
    const rows = ordered.map((t) => el("tr", { "data-target": t.base_url, "data-stale": stale(t) },
      el("td", { text: t.base_url }),
      el("td", {}, el("span", { ...stateOf(t), className: "state " + stateOf(t).className })),
      el("td", { text: fmtInt(t.num_failures) }),
      el("td", { text: fmtPct(t.prefix_cache_hit_rate) }),
      el("td", { text: fmtInt(t.prefix_cache_queries) }),
      el("td", { text: fmtInt(t.prefix_cache_hits) })));
    table.replaceChildren(head, ...rows);
  }

  // ---- prefixes -----------------------------------------------------------------------------------------

  async function refreshPrefixes() {
    let prefixes;
    try {
      prefixes = await api("prefixes");
    } catch (error) {
      setStatus("prefixes-status", refusal(error));
      $("prefixes").replaceChildren();
      targetsInUse = null;
      return;
    }
    const shown = prefixes.slice(0, MAX_PREFIXES);
    const stats = await Promise.all(shown.map((p) =>
      api("prefixes/" + encodeURIComponent(p.name) + "/stats").catch((error) => ({ name: p.name, error }))));
    const more = prefixes.length > shown.length ? ` Showing ${shown.length} of ${prefixes.length}.` : "";
    // Only a complete list can tell a stale target: with more prefixes than shown, none is called stale.
    targetsInUse = prefixes.length > shown.length ? null : new Set([
      ...prefixes.map((p) => p.target && p.target.base_url).filter(Boolean),
      ...stats.flatMap((s) => (s.endpoints || []).map((e) => e.base_url))]);
    setStatus("prefixes-status", prefixes.length ? more.trim() : "No prefix is registered.");
    const extraNames = [...new Set(stats.flatMap((s) => Object.keys(s).filter((k) => !KNOWN_PREFIX.has(k) && k !== "error")))];
    const head = el("tr", {}, ...["prefix", "version", "tokens", "pinned", "residency", "last warm", "last outcome",
      "warms", "resident", "evicted", "errors", "skipped", "uses", "re-warm every", "engine: resident / blocks (KV events)",
      ...extraNames.map(label)]
      .map((h) => el("th", { text: h })));
    const rows = stats.map((s) => {
      if (s.error) return el("tr", { "data-prefix": s.name }, el("td", { text: s.name }), el("td", { colspan: 14, className: "text", text: refusal(s.error) }));
      return el("tr", { "data-prefix": s.name },
        el("td", { text: s.name }),
        cell("version", s.version, fmtInt(s.version)),
        cell("num_tokens", s.num_tokens, s.num_tokens === null ? "–" : fmtInt(s.num_tokens)),
        cell("pinned", s.pinned, s.pinned ? "yes" : "no"),
        cell("residency_rate", s.residency_rate, s.residency_rate === null ? "not judged yet" : fmtPct(s.residency_rate)),
        el("td", { "data-field": "last_warm_at", "data-value": s.last_warm_at,
          title: s.last_warm_at ? new Date(s.last_warm_at * 1000).toISOString() : "", text: fmtAgo(s.last_warm_at) }),
        cell("last_outcome", s.last_outcome, s.last_outcome || "–"),
        cell("num_warms", s.num_warms, fmtInt(s.num_warms)),
        cell("num_resident", s.num_resident, fmtInt(s.num_resident)),
        cell("num_evicted", s.num_evicted, fmtInt(s.num_evicted)),
        cell("num_errors", s.num_errors, fmtInt(s.num_errors)),
        cell("num_skipped", s.num_skipped, fmtInt(s.num_skipped)),
        cell("num_uses", s.num_uses, fmtInt(s.num_uses)),
        cell("rewarm_interval_s", s.rewarm_interval_s, s.rewarm_interval_s.toFixed(1) + " s"),
        engineCell(s.endpoints || []),
        ...extraNames.map((name) => cell(name, s[name], fmtAny(s[name]))));
    });
    $("prefixes").replaceChildren(...(prefixes.length ? [head, ...rows] : []));
  }

  // ---- search playground --------------------------------------------------------------------------------

  async function loadCollections() {
    try {
      const answer = await api("collections");
      const options = answer.collections.map((c) => el("option", { value: c.name, text: `${c.name} (${fmtInt(c.num_documents)} documents)` }));
      $("collections").replaceChildren(...options);
      if (!$("collection").value && answer.collections.length) $("collection").value = answer.collections[0].name;
      setStatus("search-status", answer.collections.length ? "" : "No collection yet: add documents with POST /documents.");
    } catch (error) {
      $("collections").replaceChildren();
      setStatus("search-status", refusal(error));
    }
  }

  async function runSearch(event) {
    event.preventDefault();
    const button = $("search-button");
    button.disabled = true;
    $("search-meta").replaceChildren();
    $("hits").replaceChildren();
    const started = performance.now();
    try {
      const answer = await api("search", { method: "POST", body: {
        query: $("query").value, collection: $("collection").value.trim(), top_k: Number($("top-k").value) || 5 } });
      setStatus("search-status", "");
      renderSearch(answer, performance.now() - started);
    } catch (error) {
      setStatus("search-status", refusal(error));
    } finally {
      button.disabled = false;
    }
  }

  function metaItem(field, name, value) {
    return el("div", { "data-field": field, "data-value": value }, el("dt", { text: name }), el("dd", { text: fmtAny(value) }));
  }

  function renderSearch(answer, roundTripMs) {
    const items = [
      metaItem("embedding_level", "query vector from",
        answer.embedding_level ?? (answer.result_cache === "hit" ? "(whole result cached)" : null)),
      metaItem("result_cache", "result cache", answer.result_cache),
      ...Object.entries(answer.timings_ms || {}).map(([name, ms]) => metaItem("timings_ms." + name, name + " ms", ms)),
      metaItem("round_trip_ms", "round trip ms (browser)", Math.round(roundTripMs * 10) / 10),
    ];
    // Fields a newer /search adds (mode, reranking, ...) are shown when they hold something.
    for (const [name, value] of Object.entries(answer)) {
      if (value === null || ["hits", "embedding_level", "result_cache", "timings_ms", "collection"].includes(name)) continue;
      items.push(metaItem(name, label(name), value));
    }
    $("search-meta").replaceChildren(...items);
    const hits = answer.hits || [];
    const extraNames = [...new Set(hits.flatMap((h) => Object.keys(h).filter((k) => !KNOWN_HIT.has(k))))];
    const head = el("tr", {}, ...["#", "id", "score", ...extraNames.map(label)].map((h) => el("th", { text: h })),
      el("th", { className: "text", text: "text" }), el("th", { className: "text", text: "metadata" }));
    const rows = hits.map((hit, i) => el("tr", { "data-hit": hit.id },
      el("td", { text: String(i + 1) }),
      cell("id", hit.id, String(hit.id)),
      cell("score", hit.score, hit.score.toFixed(4)),
      ...extraNames.map((name) => cell(name, typeof hit[name] === "object" ? JSON.stringify(hit[name]) : hit[name], fmtAny(hit[name]))),
      el("td", { className: "text", text: hit.text }),
      el("td", { className: "text", text: JSON.stringify(hit.metadata || {}) })));
    $("hits").replaceChildren(...(hits.length ? [head, ...rows] : [el("tr", {}, el("td", { text: "No hits." }))]));
  }

  // ---- refresh loop and controls ------------------------------------------------------------------------

  async function refresh() {
    if (busy) return; // a slow service is not asked again before it answered
    busy = true;
    try {
      await Promise.all([refreshHealth(), refreshStats(), refreshPrefixes()]);
      renderTargets(lastTargets); // with this refresh's prefixes: which targets are stale
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
      document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
    } finally {
      busy = false;
    }
  }

  function schedule() {
    clearInterval(timer);
    timer = setInterval(refresh, Number($("interval").value));
  }

  function useKey(value) {
    apiKey = value;
    if (value) sessionStorage.setItem(KEY_STORE, value);
    else sessionStorage.removeItem(KEY_STORE);
    $("key").value = "";
    $("key").placeholder = value ? "a key is in use (this tab only)" : "kept in this tab only (sessionStorage)";
    loadCollections();
    refresh();
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    useKey($("key").value.trim());
  });
  $("forget").addEventListener("click", () => useKey(""));
  $("interval").addEventListener("change", schedule);
  $("search-form").addEventListener("submit", runSearch);
  useKey(apiKey);
  schedule();
})();
