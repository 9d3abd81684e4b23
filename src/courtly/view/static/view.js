// courtly's live view: fetches the JSON API every few seconds and draws it.
// Everything shown comes from the web (URLs, server messages): it is set with textContent only.
"use strict";
(function () {
  const REFRESH_MS = 2000;   // while the crawl answers; the next ask waits for the answers
  const RETRY_MS = 10000;    // once the crawl has ended or its server is gone (a next run?)
  const TIMEOUT_MS = 10000;  // an answer that takes longer: the server does not answer
  const C = window.courtlyChart;
  const sorting = { key: "errors", order: "desc" };
  let renders = 0;
  let ended = "";            // why the live crawl ended, as its last summary said
  let seen = null;           // the time of the last summary
  let timer = null;
  let busy = false;
  let again = false;

  const $ = (id) => document.getElementById(id);

  function setText(id, value) {
    $(id).textContent = value === null || value === undefined ? "–" : String(value);
  }

  function cell(row, value, className) {
    const td = row.insertCell();
    td.textContent = value === null || value === undefined ? "" : String(value);
    if (className) td.className = className;
    return td;
  }

  function bytes(n) {
    if (n === null || n === undefined) return null;
    const units = ["B", "kB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
    return `${C.format(n)} ${units[i]}`;
  }

  async function get(path) {
    const response = await fetch(path,
      { cache: "no-store", signal: AbortSignal.timeout(TIMEOUT_MS) });
    if (!response.ok) {
      const answer = await response.json().catch(() => ({}));
      throw new Error(`${path}: HTTP ${response.status}${answer.error ? `: ${answer.error}` : ""}`);
    }
    return response.json();
  }

  function drawSummary(s) {
    const where = s.source === "live" ? "live crawl" : "crawl database";
    setText("source", `${where}: ${s.db || ""}${s.worker ? ` · worker ${s.worker}` : ""}`);
    setText("updated", `updated ${C.clock(s.now)}`);
    setText("total-actions", s.actions.toLocaleString("en"));
    setText("rate-actions", C.format(s.rate.actions));
    setText("total-requests", s.requests === null ? null : s.requests.toLocaleString("en"));
    setText("rate-requests", s.rate.requests === null ? null : C.format(s.rate.requests));
    setText("total-errors", s.errors.toLocaleString("en"));
    setText("total-bytes", bytes(s.bytes));
    setText("in-flight", s.in_flight);
    setText("total-origins", s.origins.total);
    ended = s.source === "live" ? s.stop_reason : "";
    seen = s.now;
    document.title = ended ? "courtly: crawl ended" : `courtly: ${where}`;
    const notes = [];
    if (ended) notes.push(`the crawl has ended: ${ended}`);
    if (s.reading) notes.push("reading the crawl log…");
    if (s.failure) notes.push(s.failure);
    $("notice").hidden = notes.length === 0;
    $("notice").textContent = notes.join(" · ");
    const codes = Object.entries(s.exit_codes).map(([code, n]) => (
      { label: code, value: n, color: C.codeColor(code, s.error_codes) }));
    C.bars($("exit-codes"), codes, { title: "crawl actions by exit code" });
    const states = Object.entries(s.origins).filter(([k]) => k !== "total")
      .map(([state, n]) => ({ label: state, value: n }));
    C.bars($("origin-states"), states, { title: "origins by state", labelWidth: 120 });
  }

  function drawSeries(series) {
    C.line($("rate-chart"), [
      { name: "requests", color: "#4c78a8", points: C.ratePoints(series, "requests") },
      { name: "crawl actions", color: "#f58518", points: C.ratePoints(series, "actions") },
    ], { title: "requests and crawl actions per second" });
  }

  function drawOrigins(data) {
    setText("origins-count", `(${data.total}${data.total > data.origins.length ?
      `, the first ${data.origins.length} shown` : ""})`);
    const body = $("origins").tBodies[0];
    body.replaceChildren();
    for (const o of data.origins) {
      const row = body.insertRow();
      cell(row, o.origin, "origin");
      cell(row, o.state, `state ${o.state.replace(" ", "-")}`);
      cell(row, o.reason);
      cell(row, o.actions, "num");
      cell(row, o.errors, o.errors ? "num bad" : "num");
      cell(row, o.delay === null ? "" : C.format(o.delay), "num");
      cell(row, o.robots);
    }
    for (const th of $("origins").tHead.rows[0].cells) {
      th.classList.toggle("sorted", th.dataset.key === sorting.key);
      th.dataset.order = th.dataset.key === sorting.key ? sorting.order : "";
    }
  }

  function drawErrors(data) {
    const body = $("errors").tBodies[0];
    body.replaceChildren();
    for (const e of data.errors) {
      const row = body.insertRow();
      cell(row, C.clock(e.time));
      cell(row, e.exit_code);
      cell(row, e.http_status, "num");
      cell(row, e.url, "url");
      cell(row, e.detail, "detail");
    }
  }

  function drawWorkers(data) {
    $("fleet").hidden = !data.fleet;
    if (!data.fleet) return;
    setText("fleet-line", `${data.workers.length} workers, ${data.partitions} partitions ` +
      `(${data.free_partitions} not leased)`);
    const body = $("workers").tBodies[0];
    body.replaceChildren();
    for (const w of data.workers) {
      const row = body.insertRow();
      cell(row, w.worker);
      cell(row, w.state);
      cell(row, w.leases, "num");
      cell(row, w.actions, "num");
      cell(row, C.format(w.rate), "num");
      cell(row, C.format(w.rate_last_minute), "num");
      cell(row, `${w.heartbeat_age}s`, "num");
    }
  }

  // why the crawl did not answer, in words
  function failure(err) {
    const last = seen === null ? "" : ` (last answer at ${C.clock(seen)})`;
    if (err.name === "TimeoutError") {
      return `the crawl's server does not answer within ${TIMEOUT_MS / 1000} s${last}`;
    }
    if (err.name === "TypeError") {  // fetch's only word for a refused or reset connection
      return `${ended ? `the crawl has ended (${ended}) and its` : "the crawl's"} server is ` +
        `gone${last}; asking again every ${RETRY_MS / 1000} s for a next run at this address`;
    }
    return `the crawl's server answered ${err.message}`;
  }

  // one ask at a time: the next is timed from this one's answers, so a slow server is never
  // asked again before it has answered
  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    clearTimeout(timer);
    let wait = REFRESH_MS;
    try {
      const origins = `api/origins?sort=${encodeURIComponent(sorting.key)}` +
        `&order=${sorting.order}&limit=200`;
      const [summary, series, table, errors, workers] = await Promise.all([
        get("api/summary"), get("api/series"), get(origins), get("api/errors"),
        get("api/workers")]);
      drawSummary(summary);
      drawSeries(series);
      drawOrigins(table);
      drawErrors(errors);
      drawWorkers(workers);
      renders += 1;
      document.body.dataset.renders = String(renders);
      if (ended) wait = RETRY_MS;
    } catch (err) {
      wait = RETRY_MS;
      document.title = ended ? "courtly: crawl ended" : "courtly: no answer";
      $("notice").hidden = false;
      $("notice").textContent = failure(err);
    }
    busy = false;
    timer = setTimeout(refresh, again ? 0 : wait);
    again = false;
  }

  for (const th of document.querySelectorAll("#origins th[data-key]")) {
    th.addEventListener("click", () => {
      const key = th.dataset.key;
      const numeric = ["actions", "errors", "delay"].includes(key);
      if (sorting.key === key) sorting.order = sorting.order === "asc" ? "desc" : "asc";
      else { sorting.key = key; sorting.order = numeric ? "desc" : "asc"; }
      refresh();
    });
  }
  refresh();
})();
