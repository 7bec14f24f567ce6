// The dashboard's only script. The queues page's live charts: poll GET /v1/queues every ~2 s (with the session
// cookie) and draw each queue's depth, enqueue and completion rates and oldest age as inline SVG sparklines; and
// keep the workers and alerts panels fresh. Values are put on the page with textContent and attributes only,
// never as HTML, so a queue name cannot become markup; the panels' HTML is the server's, escaped there.
(function () {
  "use strict";
  // The workers and alerts panels are rendered (and escaped) by the server: swap in the fresh HTML. A
  // <template> parses it without running anything.
  function refreshPanel(id, panelUrl) {
    var current = document.getElementById(id);
    if (!current) return;
    fetch(panelUrl, { credentials: "same-origin", cache: "no-store" })
      .then(function (resp) { return resp.ok ? resp.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var parsed = document.createElement("template");
        parsed.innerHTML = html;
        var fresh = parsed.content.getElementById(id);
        if (fresh) current.replaceWith(fresh);
      })
      .catch(function () { /* the queue poll reports the service's state */ });
  }

  function refreshPanels() {
    refreshPanel("workers-panel", "/panels/workers");
    refreshPanel("alerts-panel", "/panels/alerts");
  }

  var table = document.getElementById("queues");
  if (!table) {
    // The workers and alerts pages: only their panel, every 4 s.
    if (document.getElementById("workers-panel") || document.getElementById("alerts-panel")) {
      window.setInterval(refreshPanels, 4000);
    }
    return;
  }
  var url = table.getAttribute("data-poll");
  var interval = Number(table.getAttribute("data-interval")) || 2000;
  var HISTORY = 90; // 3 minutes at 2 s
  var live = document.getElementById("live");
  var body = table.tBodies[0];
  var template = document.getElementById("queue-row");
  var polls = 0;
  var series = new Map(); // queue name -> {last: sample, points: {chart: [values]}}

  function fmtRate(v) { return v === null ? "…" : (v >= 100 ? v.toFixed(0) : v.toFixed(1)); }
  function fmtAge(s) {
    if (s === null || s === undefined) return "—";
    if (s < 10) return s.toFixed(1) + " s";
    if (s < 120) return s.toFixed(0) + " s";
    if (s < 7200) return Math.floor(s / 60) + " m " + Math.floor(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " m";
  }

  // Queue name -> its row (the server's rows, then those added here): a scan of the rows for each queue of each
  // poll grew with the square of the number of queues (10,000 queues: 100 million attribute reads every 2 s).
  var rows = new Map();
  for (var i = 0; i < body.rows.length; i++) rows.set(body.rows[i].getAttribute("data-queue"), body.rows[i]);

  function rowOf(name) {
    var known = rows.get(name);
    if (known) return known;
    var row = template.content.firstElementChild.cloneNode(true);
    rows.set(name, row);
    row.setAttribute("data-queue", name);
    var link = row.querySelector("td.name a");
    link.textContent = name;
    link.setAttribute("href", "/dead-letters?queue=" + encodeURIComponent(name));
    body.appendChild(row);
    var empty = document.getElementById("no-queues");
    if (empty) empty.hidden = true;
    return row;
  }

  function setField(row, field, text) {
    var cell = row.querySelector('[data-field="' + field + '"]');
    if (cell && cell.textContent !== text) cell.textContent = text;
  }

  function setDead(row, name, dead) {
    var cell = row.querySelector('[data-field="dead"]');
    if (!cell) return;
    if (dead > 0) {
      var link = cell.firstElementChild;
      if (link === null) {
        cell.textContent = "";
        link = document.createElement("a");
        link.className = "bad";
        link.setAttribute("href", "/dead-letters?queue=" + encodeURIComponent(name));
        cell.appendChild(link);
      }
      link.textContent = String(dead);
    } else if (cell.textContent !== "0") {
      cell.textContent = "0";
    }
  }

  function draw(row, chart, values) {
    var svg = row.querySelector('svg[data-chart="' + chart + '"]');
    if (!svg) return;
    var max = 0;
    for (var i = 0; i < values.length; i++) if (values[i] > max) max = values[i];
    // Right-aligned; a short history is spread over at least a third of the width so that it reads as a line.
    var span = Math.max(values.length, 30);
    var step = 120 / (span - 1);
    var offset = (span - values.length) * step;
    var pts = [];
    for (var j = 0; j < values.length; j++) {
      var y = max > 0 ? 30 - (values[j] / max) * 28 : 30;
      pts.push((offset + j * step).toFixed(1) + "," + y.toFixed(1));
    }
    svg.firstElementChild.setAttribute("points", pts.join(" "));
    svg.setAttribute("data-max", String(max));
  }

  function push(list, v) { list.push(v); if (list.length > HISTORY) list.shift(); }

  function update(q, now) {
    var row = rowOf(q.queue);
    var depth = q.pending + q.scheduled + q.processing;
    // Every job the queue ever had (the service's `enqueued`: live ones plus the per-queue outcome totals; a replay
    // is a new job), so that a purge or retention never looks like negative traffic.
    var total = typeof q.enqueued === "number" ? q.enqueued
      : depth + q.completed + (typeof q.dead_total === "number" ? q.dead_total : q.dead) + q.expired + q.cancelled;
    var s = series.get(q.queue);
    if (!s) {
      s = { last: null, points: { depth: [], enqueue_rate: [], completion_rate: [], oldest: [] } };
      series.set(q.queue, s);
    }
    var enqueueRate = null, completionRate = null;
    if (s.last) {
      var dt = now - s.last.t;
      if (dt > 0) {
        // A purge or retention lowers the totals: a rate is never negative.
        enqueueRate = Math.max(0, (total - s.last.total) / dt);
        completionRate = Math.max(0, (q.completed - s.last.completed) / dt);
      }
    }
    s.last = { t: now, total: total, completed: q.completed };
    push(s.points.depth, depth);
    push(s.points.oldest, q.oldest_pending_age || 0);
    if (enqueueRate !== null) {
      push(s.points.enqueue_rate, enqueueRate);
      push(s.points.completion_rate, completionRate);
    }
    setField(row, "depth", String(depth));
    setField(row, "pending", String(q.pending));
    setField(row, "scheduled", String(q.scheduled));
    setField(row, "processing", String(q.processing));
    setField(row, "completed", String(q.completed));
    setField(row, "oldest", fmtAge(q.oldest_pending_age));
    setField(row, "enqueue_rate", fmtRate(enqueueRate));
    setField(row, "completion_rate", fmtRate(completionRate));
    setDead(row, q.queue, q.dead);
    for (var chart in s.points) draw(row, chart, s.points[chart]);
  }

  function status(text, stale) {
    if (!live) return;
    live.textContent = text;
    live.className = stale ? "live stale" : "live";
  }

  function poll() {
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (resp) {
        if (resp.status === 401) { window.location.assign("/login?next=%2F"); return null; }
        if (!resp.ok) throw new Error("HTTP " + resp.status);
        return resp.json();
      })
      .then(function (data) {
        if (data === null) return;
        var now = performance.now() / 1000;
        for (var i = 0; i < data.queues.length; i++) update(data.queues[i], now);
        // The panels every other poll: they cost the server more reads than the counts.
        if (polls % 2 === 0) refreshPanels();
        polls += 1;
        table.setAttribute("data-polls", String(polls));
        status("live, updated " + new Date().toLocaleTimeString(), false);
      })
      .catch(function (err) { status("not updating: " + err.message, true); })
      .then(function () { window.setTimeout(poll, interval); });
  }
  poll();
})();
