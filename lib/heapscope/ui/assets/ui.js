// heapscope ui: draws the timeline of each series (GET /api/timeline) as inline SVG, and on a click
// the snapshot's top table (/api/top), and with two picks their diff (/api/diff). Written here, no
// library: the page must work offline and request nothing but this server (the CSP says so too).
// Every text from a profile goes through textContent, never innerHTML.
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var SELECTED = "#e6007e"; // the samples carrying the label filters, over time
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
                "#17becf", "#ff7f0e", "#393b79", "#637939", "#843c39"];
  // The chart leaves room for the leak table beside it on a wide window.
  var W = Math.max(560, Math.min(900, window.innerWidth - 600)), H = 320, PAD = { l: 70, r: 12, t: 10, b: 28 };
  var token = new URLSearchParams(location.search).get("token");
  var picks = []; // snapshot ids picked on the charts, oldest pick first (at most 2)
  var data = null;
  window.hsUI = { picks: picks, pick: pick, data: function () { return data; }, filter: setFilter };

  var filters = {}; // label key -> value: the top table, diff and flame graphs show those samples only

  // A URL of this server, with the token when the page was opened with one, and the label filters.
  function api(path, params, withLabels) {
    var q = new URLSearchParams(params || {});
    if (withLabels) Object.keys(filters).sort().forEach(function (k) { q.append("label", k + "=" + filters[k]); });
    if (token) q.set("token", token);
    var s = q.toString();
    return path + (s ? "?" + s : "");
  }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function svg(tag, attrs) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    return e;
  }

  function bytes(v) {
    if (v === null || v === undefined) return "-";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], a = Math.abs(v), i = 0;
    while (a >= 1024 && i < units.length - 1) { a /= 1024; i++; }
    return (v < 0 ? "-" : "") + (i === 0 ? a.toFixed(0) : a.toFixed(a < 10 ? 2 : 1)) + " " + units[i];
  }

  function value(v, unit) { return unit === "bytes" ? bytes(v) : String(v); }

  function pct(e) { return e === null || e === undefined ? "-" : "±" + (100 * e).toPrecision(2) + "%"; }

  function status(text, error) {
    var s = document.getElementById("hs-status");
    s.textContent = text;
    s.className = error ? "hs-error" : "";
  }

  // Asks for the timeline every second while profiles are being read, then every refresh period (live
  // sources, and new files in a folder an application still writes to); redraws only what changed.
  // A filter changed asks at once (setFilter): an answer to an older request is then dropped, so it
  // neither draws the old filter over the new one nor keeps a second polling loop going.
  var lastText = null, timer = null, asked = 0;
  function load() {
    clearTimeout(timer);
    var mine = ++asked;
    fetch(api("/api/timeline", {}, true)).then(function (r) {
      if (!r.ok) throw new Error("timeline: " + r.status);
      return r.text();
    }).then(function (text) {
      if (mine !== asked) return;
      var d = JSON.parse(text);
      if (text !== lastText) { data = d; render(d); lastText = text; }
      timer = setTimeout(load, d.pending > 0 ? 1000 : d.refresh * 1000);
    }).catch(function (e) {
      if (mine !== asked) return;
      status(String(e), true);
      timer = setTimeout(load, 5000);
    });
  }

  function render(d) {
    var shown = d.series.reduce(function (n, s) { return n + s.snapshots.length; }, 0);
    status(shown + " snapshots in " + d.series.length + " series" +
           (d.pending > 0 ? "; reading " + d.pending + " more profiles..." : "") +
           ". Click a point for its top table; click a second one for the diff.");
    var root = document.getElementById("hs-series");
    root.textContent = "";
    d.series.forEach(function (s, k) { root.appendChild(series(s, k)); });
    markPicks();
  }

  function series(s, k) {
    var sec = el("section", { "class": "hs-series", "data-series": String(k) });
    sec.appendChild(el("h2", {}, s.name + (s.kind === "live" ? " (live, refreshed every " + data.refresh + " s)" : "")));
    if (s.last_error) sec.appendChild(el("div", { "class": "hs-error" }, "last fetch failed: " + s.last_error));
    s.errors.forEach(function (e) { sec.appendChild(el("div", { "class": "hs-error" }, e.file + ": " + e.error)); });
    if (s.snapshots.length === 0) { sec.appendChild(el("div", {}, "no snapshot read yet")); return sec; }
    var row = el("div", { "class": "hs-row" });
    var left = el("div", { "class": "hs-chart", style: "width:" + (W + 2) + "px" });
    left.appendChild(chart(s));
    left.appendChild(legend(s));
    if (s.snapshots.some(function (p) { return p.memory; })) left.appendChild(memoryChart(s));
    row.appendChild(left);
    row.appendChild(leaks(s));
    sec.appendChild(row);
    return sec;
  }

  // Scales of a chart: x by time, y from 0 to the highest value plus its 2σ.
  function scales(snaps, max, h) {
    var t0 = snaps[0].time, t1 = snaps[snaps.length - 1].time;
    var span = t1 > t0 ? t1 - t0 : 1;
    var ymax = max > 0 ? max * 1.05 : 1;
    return {
      x: function (t) { return PAD.l + (snaps.length === 1 ? 0.5 : (t - t0) / span) * (W - PAD.l - PAD.r); },
      y: function (v) { return h - PAD.b - Math.max(0, v) / ymax * (h - PAD.t - PAD.b); },
      ymax: ymax, t0: t0, t1: t1
    };
  }

  function axes(g, sc, h, unit) {
    g.appendChild(svg("line", { "class": "axis", x1: PAD.l, y1: h - PAD.b, x2: W - PAD.r, y2: h - PAD.b }));
    g.appendChild(svg("line", { "class": "axis", x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: h - PAD.b }));
    for (var i = 0; i <= 4; i++) {
      var v = sc.ymax * i / 4, t = svg("text", { x: PAD.l - 4, y: sc.y(v) + 3, "text-anchor": "end" });
      t.textContent = value(Math.round(v), unit);
      g.appendChild(t);
    }
    [sc.t0, sc.t1].forEach(function (tm, j) {
      var t = svg("text", { x: sc.x(tm), y: h - 8, "text-anchor": j ? "end" : "start" });
      t.textContent = new Date(tm * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
      g.appendChild(t);
    });
  }

  // A line through values and its ±2σ band (errors are 1σ).
  function trace(g, snaps, sc, values, errors, color, name, kind) {
    var up = [], down = [], pts = [];
    snaps.forEach(function (p, i) {
      var x = sc.x(p.time).toFixed(1), e = 2 * (errors[i] || 0);
      pts.push(x + "," + sc.y(values[i]).toFixed(1));
      up.push(x + "," + sc.y(values[i] + e).toFixed(1));
      down.unshift(x + "," + sc.y(values[i] - e).toFixed(1));
    });
    var band = svg("polygon", { "class": "band", points: up.concat(down).join(" "), fill: color, "data-site": name, "data-kind": kind });
    var line = svg("path", { "class": "line", d: "M" + pts.join("L"), stroke: color, "data-site": name, "data-kind": kind });
    var title = svg("title"); title.textContent = name;
    line.appendChild(title);
    g.appendChild(band);
    g.appendChild(line);
  }

  function chart(s) {
    var snaps = s.snapshots;
    var max = 0;
    snaps.forEach(function (p) { max = Math.max(max, p.total + 2 * p.total_error); });
    var sc = scales(snaps, max, H);
    var root = svg("svg", { width: W, height: H, "class": "hs-timeline" });
    axes(root, sc, H, s.unit);
    trace(root, snaps, sc, snaps.map(function (p) { return p.total; }), snaps.map(function (p) { return p.total_error; }),
          "#000", "total", "total");
    if (s.selected) trace(root, snaps, sc, s.selected.values, s.selected.errors, SELECTED, "with " + s.selected.filter, "selected");
    s.sites.forEach(function (site, i) { trace(root, snaps, sc, site.values, site.errors, COLORS[i % COLORS.length], site.name, "site"); });
    // Wide invisible columns make a point easy to click; the dot shows where it is.
    var step = snaps.length > 1 ? (W - PAD.l - PAD.r) / (snaps.length - 1) : 20;
    snaps.forEach(function (p) {
      var x = sc.x(p.time);
      var hit = svg("rect", { "class": "hit", x: x - Math.max(step / 2, 2), y: PAD.t, width: Math.max(step, 4), height: H - PAD.t - PAD.b, "data-id": p.id });
      var dot = svg("circle", { "class": "snap", cx: x, cy: sc.y(p.total), r: snaps.length > 100 ? 2 : 3.5, "data-id": p.id });
      var tip = svg("title");
      tip.textContent = p.iso + (p.file ? " " + p.file : "") + ": " + value(p.total, s.unit) + " live";
      hit.appendChild(tip);
      [hit, dot].forEach(function (e) { e.addEventListener("click", function () { pick(p.id); }); });
      root.appendChild(hit);
      root.appendChild(dot);
    });
    return root;
  }

  function legend(s) {
    var box = el("div", { "class": "hs-legend" });
    var total = el("span", {}, "total");
    total.insertBefore(el("i", { style: "background:#000" }), total.firstChild);
    box.appendChild(total);
    if (s.selected) {
      // rest: what the label sets a summary left out could add (summaries keep the largest 200).
      var rest = Math.max.apply(null, s.selected.rest);
      var sel = el("span", { "data-kind": "selected" }, "with " + s.selected.filter +
                   (rest > 0 ? " (at most " + value(rest, s.unit) + " more in smaller label sets)" : ""));
      sel.insertBefore(el("i", { style: "background:" + SELECTED }), sel.firstChild);
      box.appendChild(sel);
    }
    s.sites.forEach(function (site, i) {
      var item = el("span", { title: site.name }, site.name.length > 60 ? "..." + site.name.slice(-57) : site.name);
      item.insertBefore(el("i", { style: "background:" + COLORS[i % COLORS.length] }), item.firstChild);
      item.addEventListener("click", function () { highlight(box.parentNode, site.name); });
      box.appendChild(item);
    });
    return box;
  }

  // Dims every trace but name's (clicking it again shows them all).
  function highlight(chartBox, name) {
    var same = chartBox.getAttribute("data-highlight") === name;
    chartBox.setAttribute("data-highlight", same ? "" : name);
    chartBox.querySelectorAll("[data-site]").forEach(function (e) {
      e.classList.toggle("dim", !same && e.getAttribute("data-site") !== name);
    });
  }

  // The process's memory (Heapscope::Memory) over time, when the profiles carry it.
  var MEMORY = [["rss", "#000"], ["ruby_heap", "#1f77b4"], ["malloc_in_use", "#d62728"], ["profiled", "#2ca02c"]];

  function memoryChart(s) {
    var snaps = s.snapshots.filter(function (p) { return p.memory; }), h = 180, max = 0;
    snaps.forEach(function (p) { MEMORY.forEach(function (m) { max = Math.max(max, p.memory[m[0]] || 0); }); });
    var sc = scales(snaps, max, h);
    var root = svg("svg", { width: W, height: h, "class": "hs-memory" });
    axes(root, sc, h, "bytes");
    MEMORY.forEach(function (m) {
      if (!snaps.some(function (p) { return p.memory[m[0]] !== null && p.memory[m[0]] !== undefined; })) return;
      trace(root, snaps, sc, snaps.map(function (p) { return p.memory[m[0]] || 0; }), [], m[1], m[0], "memory");
    });
    var wrap = el("div", { "class": "hs-legend" });
    wrap.appendChild(document.createTextNode("Process memory (docs/reading-profiles.md, 'Where RSS went'): "));
    MEMORY.forEach(function (m) {
      var item = el("span", {}, m[0]);
      item.insertBefore(el("i", { style: "background:" + m[1] }), item.firstChild);
      wrap.appendChild(item);
    });
    wrap.appendChild(el("br"));
    wrap.appendChild(root);
    return wrap;
  }

  function leaks(s) {
    var box = el("div", { "class": "hs-leaks" });
    box.appendChild(el("div", {}, "Growing sites (heapscope leaks), leaks first"));
    var t = el("table", {});
    var head = el("tr", {});
    ["verdict", "rate/min", "live now", "site"].forEach(function (h, i) { head.appendChild(el("th", i === 3 ? { "class": "n" } : {}, h)); });
    t.appendChild(head);
    if (s.leaks.length === 0) t.appendChild(el("tr", {}, "")).appendChild(el("td", { "class": "n", colspan: "4" }, "none grew (or fewer than 2 snapshots)"));
    s.leaks.forEach(function (r) {
      var tr = el("tr", { "class": r.verdict === "leak" ? "leak" : "", "data-site": r.name });
      tr.appendChild(el("td", {}, r.verdict_text));
      tr.appendChild(el("td", {}, (r.rate_per_minute >= 0 ? "+" : "") + value(Math.round(r.rate_per_minute), s.unit)));
      tr.appendChild(el("td", {}, value(r.last, s.unit) + " " + pct(r.last_relative_error)));
      tr.appendChild(el("td", { "class": "n" }, r.name));
      tr.addEventListener("click", function () { highlight(box.parentNode, r.name); });
      t.appendChild(tr);
    });
    box.appendChild(t);
    return box;
  }

  function snapshotById(id) {
    for (var i = 0; i < data.series.length; i++) {
      var s = data.series[i];
      for (var j = 0; j < s.snapshots.length; j++) if (s.snapshots[j].id === id) return s.snapshots[j];
    }
    return null;
  }

  // Picks a snapshot: its top table; with the previous pick, their diff (older one as the base).
  // again: the same picks shown anew (a filter changed).
  function pick(id, again) {
    if (!again) {
      var at = picks.indexOf(id);
      if (at >= 0) picks.splice(at, 1);
      picks.push(id);
      while (picks.length > 2) picks.shift();
      showLabels(id);
    }
    markPicks();
    showTop(id);
    if (picks.length === 2) {
      var a = snapshotById(picks[0]), b = snapshotById(picks[1]);
      if (a && b) showDiff(a.time <= b.time ? a : b, a.time <= b.time ? b : a);
    } else {
      document.getElementById("hs-diff").textContent = "";
    }
  }

  function markPicks() {
    document.querySelectorAll("circle.snap").forEach(function (c) {
      c.classList.toggle("picked", picks.indexOf(c.getAttribute("data-id")) >= 0);
    });
  }

  function getJSON(url, into, then) {
    into.textContent = "loading...";
    fetch(url).then(function (r) {
      return r.text().then(function (t) { if (!r.ok) throw new Error(t); return JSON.parse(t); });
    }).then(then).catch(function (e) { into.textContent = ""; into.appendChild(el("div", { "class": "hs-error" }, String(e.message || e))); });
  }

  // Sets (or with value "", clears) a label filter and shows the picks again with it.
  function setFilter(key, v) {
    if (v) filters[key] = v; else delete filters[key];
    if (picks.length) pick(picks[picks.length - 1], true);
    load(); // the timeline draws the filtered samples' live bytes too
  }

  // One select per user label of the snapshot (GET /api/labels).
  function showLabels(id) {
    var box = document.getElementById("hs-labels");
    fetch(api("/api/labels", { snap: id })).then(function (r) { return r.ok ? r.json() : { labels: [] }; }).then(function (d) {
      box.textContent = "";
      if (!d.labels.length) return;
      box.appendChild(document.createTextNode("Only samples with (table, diff, flame graphs; drawn on the timeline too): "));
      d.labels.forEach(function (l) {
        var sel = el("select", { "data-key": l.key });
        sel.appendChild(el("option", { value: "" }, l.key + ": any"));
        l.values.forEach(function (v) {
          var o = el("option", { value: v[0] }, l.key + "=" + v[0] + " (" + v[1] + " samples)");
          if (filters[l.key] === v[0]) o.selected = true;
          sel.appendChild(o);
        });
        sel.addEventListener("change", function () { setFilter(l.key, sel.value); });
        box.appendChild(sel);
      });
    });
  }

  function showTop(id) {
    var box = document.getElementById("hs-top");
    getJSON(api("/api/top", { snap: id }, true), box, function (d) {
      box.textContent = "";
      var snap = snapshotById(id);
      box.appendChild(el("h2", {}, "Snapshot " + (snap ? snap.iso + (snap.file ? " (" + snap.file + ")" : "") : id)));
      var links = el("div", {});
      links.appendChild(el("a", { href: api("/flame", { snap: id }, true), target: "_blank", id: "hs-flame-link" }, "flame graph"));
      box.appendChild(links);
      var sel = d.label_filter.length ? " Selected: " + value(d.selected_total, d.unit) + " (percentages are of the total)." : "";
      box.appendChild(el("div", {}, "Total " + value(d.total, d.unit) + " live; " + d.sampling + ". error: 1σ sampling error." + sel));
      var t = el("table", { id: "hs-top-table" });
      var head = el("tr", {});
      ["flat", "flat%", "error", "objects", "site", ""].forEach(function (h, i) { head.appendChild(el("th", i === 4 ? { "class": "n" } : {}, h)); });
      t.appendChild(head);
      d.entries.forEach(function (e) {
        var tr = el("tr", {});
        tr.appendChild(el("td", {}, value(e.flat, d.unit)));
        tr.appendChild(el("td", {}, e.flat_percent === null ? "-" : e.flat_percent.toFixed(1) + "%"));
        tr.appendChild(el("td", {}, pct(e.relative_error)));
        tr.appendChild(el("td", {}, e.objects === null ? "-" : e.objects));
        tr.appendChild(el("td", { "class": "n" }, e.name));
        var cell = el("td", {});
        // Who holds it: asked of the running process, so only for a live snapshot's sites with a line.
        if (d.live && e.file && e.line > 0) {
          var b = el("button", { "class": "hs-retainers" }, "who holds it");
          b.addEventListener("click", function () { showRetainers(id, e.file + ":" + e.line); });
          cell.appendChild(b);
        }
        tr.appendChild(cell);
        t.appendChild(tr);
      });
      box.appendChild(t);
    });
  }

  function showRetainers(id, site) {
    var box = document.getElementById("hs-retainers");
    box.textContent = "asking the process who holds " + site + "...";
    fetch(api("/api/retainers", { snap: id, site: site })).then(function (r) {
      return r.text().then(function (t) { box.textContent = (r.ok ? "" : "failed: ") + t; });
    }).catch(function (e) { box.textContent = "failed: " + e; });
  }

  function showDiff(base, newer) {
    var box = document.getElementById("hs-diff");
    getJSON(api("/api/diff", { base: base.id, "new": newer.id }, true), box, function (d) {
      box.textContent = "";
      box.appendChild(el("h2", {}, "Diff " + base.iso + " -> " + newer.iso));
      box.appendChild(el("a", { href: api("/diff", { base: base.id, "new": newer.id }, true), target: "_blank" }, "diff flame graph"));
      box.appendChild(el("div", {}, "Total " + value(d.total_base, d.unit) + " -> " + value(d.total_new, d.unit) +
                                    "; change ± 1σ error; noise = within 2σ"));
      var t = el("table", { id: "hs-diff-table" });
      var head = el("tr", {});
      ["change", "error", "base", "new", "verdict", "site"].forEach(function (h, i) { head.appendChild(el("th", i === 5 ? { "class": "n" } : {}, h)); });
      t.appendChild(head);
      d.grew.concat(d.shrank).forEach(function (r) {
        var tr = el("tr", { "data-verdict": r.verdict });
        tr.appendChild(el("td", {}, (r.change > 0 ? "+" : "") + value(r.change, d.unit)));
        tr.appendChild(el("td", {}, r.error === null ? "-" : "±" + value(Math.round(r.error), d.unit)));
        tr.appendChild(el("td", {}, value(r.base, d.unit)));
        tr.appendChild(el("td", {}, value(r["new"], d.unit)));
        tr.appendChild(el("td", {}, r.verdict));
        tr.appendChild(el("td", { "class": "n" }, r.name));
        t.appendChild(tr);
      });
      box.appendChild(t);
    });
  }

  load();
})();
