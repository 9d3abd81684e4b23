// courtly's report: draws the charts from the data embedded in this file (set as text only).
(function () {
  const C = window.courtlyChart;
  const data = JSON.parse(document.getElementById("data").textContent);
  const $ = (id) => document.getElementById(id);
  const day = (t) => new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";

  $("db").textContent = data.db;
  $("span").textContent = data.first === null ? "an empty crawl log" :
    `${day(data.first)} to ${day(data.last)}`;
  $("actions").textContent = C.format(data.actions);
  $("requests").textContent = C.format(data.requests);
  $("errors").textContent = C.format(data.errors);
  $("bytes").textContent = C.format(data.bytes);
  $("origins").textContent = C.format(data.origins);
  const span = data.first === null ? 0 : Math.max(1, data.last - data.first);
  $("rate").textContent = span ? C.format(data.actions / span) : "–";
  $("generated").textContent = `generated ${day(data.generated)} by courtly report`;

  C.line($("rate-chart"), [
    { name: "requests", color: "#4c78a8", points: C.ratePoints(data.series, "requests") },
    { name: "crawl actions", color: "#f58518", points: C.ratePoints(data.series, "actions") },
  ], { title: "requests and crawl actions per second" });
  C.bars($("exit-codes"), Object.entries(data.exit_codes).map(([code, n]) => (
    { label: code, value: n, color: C.codeColor(code, data.error_codes) })),
  { title: "crawl actions by exit code" });

  const ms = (s) => (s < 1 ? `${Math.round(s * 1000)} ms` : `${C.format(s)} s`);
  const bounds = data.elapsed.bounds;
  C.bars($("elapsed"), data.elapsed.counts.map((n, i) => ({
    label: i < bounds.length ? `≤ ${ms(bounds[i])}` : `> ${ms(bounds[bounds.length - 1])}`,
    value: n,
  })), { title: "crawl actions by time", labelWidth: 100 });
  C.bars($("slowest"), data.slowest.map((o) => ({
    label: o.origin, value: o.mean,
    text: `${ms(o.mean)} (slowest ${ms(o.slowest)}, ${o.requests} requests)`,
  })), { title: "slowest origins", valueWidth: 200 });
  C.bars($("failing"), data.failing.map((o) => ({
    label: o.origin, value: o.errors, color: "#c2413b",
    text: `${o.errors} of ${o.actions} (${Math.round(o.share * 100)}%)`,
  })), { title: "most failing origins", valueWidth: 120 });

  const body = $("latest-errors").tBodies[0];
  for (const e of data.latest_errors) {
    const row = body.insertRow();
    for (const [value, cls] of [[day(e.time).slice(11, 19)], [e.exit_code],
      [e.http_status === null ? "" : e.http_status, "num"], [e.url, "url"],
      [e.detail, "detail"]]) {
      const td = row.insertCell();
      td.textContent = String(value);
      if (cls) td.className = cls;
    }
  }
  document.body.dataset.drawn = "1";
})();
