# frozen_string_literal: true

require "json"
require "erb"
require "heapscope/report/escape"
require "heapscope/report/census"

module Heapscope
  module Report
    # FlamegraphPage is the self-contained HTML of a flame graph: our own CSS and JavaScript inline, the
    # aggregated call tree as JSON, nothing fetched from the network. The browser only lays out and draws;
    # all aggregation happened in Ruby (Flamegraph.tree), so big profiles stay responsive. Kept as Ruby
    # strings so the gem packages them with the code.
    #
    # The data (see Flamegraph.tree): frames [[function, file, line]] (frame 0 is the root "all"), and per
    # node its parent (parents come before children), frame and value per sample type (cumulative:
    # the node and everything it called). base, when present, holds the same for a diff's base profile.
    # errors (and base_errors) hold each node's standard error, of its cumulative and of its self value
    # (FlameTree#errors), or null when the sampling is unknown: the page shows them on hover and in the
    # table, and marks a diff's change as noise when it is at most twice its error, as `heapscope diff`.
    module FlamegraphPage
      CSS = <<~CSS
        body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #222; background: #fff; }
        header { padding: 10px 14px 6px; border-bottom: 1px solid #ddd; }
        h1 { font-size: 16px; margin: 0 0 4px; }
        .meta { color: #555; }
        .controls { display: flex; gap: 10px; align-items: center; flex-wrap: wrap; padding: 8px 14px; }
        .controls input[type=search] { width: 240px; padding: 3px 6px; }
        #hs-status { color: #444; }
        #hs-graph { position: relative; margin: 0 14px; }
        #hs-svg { display: block; width: 100%; }
        #hs-svg g { cursor: pointer; }
        #hs-svg rect { stroke: #fff; stroke-width: 0.5; }
        #hs-svg g:hover rect { stroke: #000; stroke-width: 1; }
        #hs-svg text { font: 11px ui-monospace, Menlo, Consolas, monospace; fill: #000; pointer-events: none; }
        #hs-svg g.hs-dim rect { opacity: 0.35; }
        #hs-tip { position: fixed; display: none; max-width: 560px; background: #fffbe6; border: 1px solid #999;
                  padding: 6px 8px; box-shadow: 0 2px 6px rgba(0,0,0,.2); pointer-events: none; z-index: 10;
                  font: 12px/1.4 ui-monospace, Menlo, Consolas, monospace; white-space: pre-wrap; word-break: break-all; }
        #hs-top { margin: 14px; border-collapse: collapse; }
        #hs-top th, #hs-top td { padding: 2px 10px; text-align: right; border-bottom: 1px solid #eee; }
        #hs-top td.n, #hs-top th.n { text-align: left; font-family: ui-monospace, Menlo, Consolas, monospace; }
        .hs-help { color: #666; margin: 6px 14px 14px; }
        #hs-census { margin: 14px; border-collapse: collapse; }
        #hs-census th, #hs-census td { padding: 2px 10px; text-align: right; border-bottom: 1px solid #eee; }
        #hs-census td.n, #hs-census th.n { text-align: left; font-family: ui-monospace, Menlo, Consolas, monospace; }
        #hs-census td.over { color: #a33; }
      CSS

      JS = <<~'JS'
        (function () {
          "use strict";
          var D = JSON.parse(document.getElementById("hs-data").textContent);
          // T is the tree drawn: the whole profile's (D) or a label value's (D.views[k], the same arrays,
          // its frames in D.frames), swapped by use().
          var ROW = 18, T, N, kids, depth;
          function fn(i) { return D.frames[T.frame[i]][0]; }
          function where(i) {
            var f = D.frames[T.frame[i]];
            return f[1] ? f[1] + (f[2] > 0 ? ":" + f[2] : "") : "";
          }
          function use(tree) {
            var i;
            T = tree;
            N = T.parent.length;
            kids = [];
            depth = new Int32Array(N);
            for (i = 0; i < N; i++) kids.push([]);
            for (i = 1; i < N; i++) { kids[T.parent[i]].push(i); depth[i] = depth[T.parent[i]] + 1; }
            // Children in name order, so a frame keeps its place when the sample type changes.
            kids.forEach(function (k) {
              k.sort(function (a, b) { var x = fn(a) + where(a), y = fn(b) + where(b); return x < y ? -1 : x > y ? 1 : 0; });
            });
          }
          use(D);
          var st = { t: D.type, zoom: 0, icicle: !!D.icicle, base: false, re: null, view: -1, pick: null };
          var $ = function (id) { return document.getElementById(id); };

          function unit() { return D.types[st.t].unit; }
          function cur(i) { return T.values[st.t][i]; }
          function old(i) { return T.base ? T.base[st.t][i] : 0; }
          // Width of a node: its value in the chosen type (a diff can size by the base instead).
          function size(i) { var v = st.base ? old(i) : cur(i); return v > 0 ? v : 0; }
          function selfOf(arr, i) { var v = arr[i]; kids[i].forEach(function (k) { v -= arr[k]; }); return v; }

          function human(v, u) {
            var neg = v < 0, a = Math.abs(v), units, base, k = 0;
            if (u === "bytes") { units = [" B", " KiB", " MiB", " GiB", " TiB"]; base = 1024; }
            else if (u === "count" || u === "objects") { units = ["", "k", "M", "G", "T"]; base = 1000; }
            else return String(v);
            while (a >= base && k < units.length - 1) { a /= base; k++; }
            var s = k === 0 ? String(Math.round(a)) : a.toFixed(a >= 100 ? 0 : 1);
            return (neg ? "-" : "") + s + units[k];
          }
          function signed(v, u) { return (v > 0 ? "+" : "") + human(v, u); }
          // Errors, worded as the text reports word them (Units.error, Units.abs_error): only an exact 0
          // prints "0%"; a small nonzero error never rounds to it.
          function relErr(e, v) {
            if (e === null || e === undefined || !v) return "?";
            var r = e / Math.abs(v);
            if (r > 1) return ">100%";
            if (r === 0) return "0%";
            if (r < 0.001) return "<0.1%";
            return "\u00b1" + (r < 0.01 ? (100 * r).toFixed(1) : (100 * r).toFixed(0)) + "%";
          }
          function absErr(e, u) {
            if (e === null || e === undefined) return "?";
            return "\u00b1" + (e > 0 && e < 0.5 ? "<1" + (u === "bytes" ? " B" : "") : human(e, u));
          }
          // Standard errors of [profile errors, base errors] at node i, kind "cum" or "self"; null unknown.
          function errOf(E, kind, i) { return E ? E[kind][st.t][i] : null; }
          function quad(a, b) { return a === null || b === null ? null : Math.sqrt(a * a + b * b); }
          function changeText(d, e, u) {
            return signed(d, u) + " " + absErr(e, u) + (e !== null && Math.abs(d) <= 2 * e ? " noise" : "");
          }
          function pct(v, total) { return total ? (100 * v / total).toFixed(1) + "%" : "-"; }
          function esc(s) {
            return String(s).replace(/[&<>"']/g, function (c) {
              return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
            });
          }
          function hash(s) { var h = 2166136261; for (var j = 0; j < s.length; j++) { h ^= s.charCodeAt(j); h = Math.imul(h, 16777619); } return h >>> 0; }

          var maxDelta = 1;
          function color(i) {
            if (st.re && matches(i)) return "#d34fe8";
            if (T.base) {
              // Diff: red grew, blue shrank, white unchanged; intensity relative to the largest change.
              var d = cur(i) - old(i), a = Math.min(1, Math.abs(d) / maxDelta), c = Math.round(235 - 180 * a);
              return d > 0 ? "rgb(255," + c + "," + c + ")" : d < 0 ? "rgb(" + c + "," + c + ",255)" : "rgb(238,238,238)";
            }
            if (i === 0) return "rgb(200,200,200)";
            var h = hash(fn(i));
            return "hsl(" + (8 + h % 42) + "," + (70 + (h >> 8) % 25) + "%," + (55 + (h >> 16) % 10) + "%)";
          }
          function matches(i) { return st.re.test(fn(i)) || st.re.test(where(i)); }

          function render() {
            var svg = $("hs-svg"), W = Math.max(200, $("hs-graph").clientWidth), rects = [], maxDepth = 0;
            if (T.base) {
              maxDelta = 1;
              for (var j = 1; j < N; j++) maxDelta = Math.max(maxDelta, Math.abs(cur(j) - old(j)));
            }
            // The zoomed node and its ancestors span the full width; below it, widths are proportional.
            for (var a = st.zoom; ; a = T.parent[a]) { rects.push([a, 0, W]); if (a === 0) break; }
            var total = size(st.zoom);
            (function lay(node, x, scale) {
              kids[node].forEach(function (k) {
                var w = size(k) * scale;
                if (w >= 0.5) { rects.push([k, x, w]); lay(k, x, scale); }
                x += w;
              });
            })(st.zoom, 0, total > 0 ? W / total : 0);
            rects.forEach(function (r) { maxDepth = Math.max(maxDepth, depth[r[0]]); });
            var H = (maxDepth + 1) * ROW, out = [];
            rects.forEach(function (r) {
              var n = r[0], x = r[1], w = r[2], y = st.icicle ? depth[n] * ROW : H - (depth[n] + 1) * ROW;
              // The label is the function and its share of the total, shortened to fit the frame.
              var name = fn(n), chars = Math.floor((w - 6) / 6.6), text = "";
              var full = n === 0 ? name : name + " (" + pct(cur(n), cur(0)) + ")";
              if (chars >= full.length) text = full;
              else if (chars >= 3) text = name.length > chars ? name.slice(0, chars - 1) + "\u2026" : name;
              var dim = T.base ? "" : (st.re && !matches(n) ? " class=\"hs-dim\"" : "");
              out.push("<g data-i=\"" + n + "\" data-name=\"" + esc(name) + "\"" + dim + "><rect x=\"" + x.toFixed(1) +
                "\" y=\"" + y + "\" width=\"" + Math.max(w - 0.5, 0.5).toFixed(1) + "\" height=\"" + (ROW - 1) +
                "\" fill=\"" + color(n) + "\"></rect>" + (text ? "<text x=\"" + (x + 3).toFixed(1) + "\" y=\"" + (y + 13) + "\">" +
                esc(text) + "</text>" : "") + "</g>");
            });
            svg.setAttribute("height", H);
            svg.setAttribute("viewBox", "0 0 " + W + " " + H);
            svg.innerHTML = out.join("");
            status();
          }

          function status() {
            var t = D.types[st.t], total = cur(0), s = t.name + ": total " + human(total, t.unit);
            if (T.base) s = t.name + ": base " + human(old(0), t.unit) + ", new " + human(total, t.unit) + ", change " + signed(total - old(0), t.unit);
            // (Text only: the value is the application's string, set with textContent below.)
            if (st.pick) s = "samples with " + st.pick + " (" + pct(total, D.values[st.t][0]) + " of all); " + s;
            if (st.zoom) s += "; zoomed on " + fn(st.zoom) + " (" + pct(cur(st.zoom), total) + ")";
            if (st.re) {
              // Count each matching stack once: skip matches under a matching ancestor.
              var m = 0;
              for (var j = 1; j < N; j++) {
                if (!matches(j)) continue;
                var up = T.parent[j], under = false;
                for (; up !== 0; up = T.parent[up]) if (matches(up)) { under = true; break; }
                if (!under) m += cur(j);
              }
              s += "; matched " + human(m, t.unit) + " (" + pct(m, total) + " of total)";
            }
            $("hs-status").textContent = s;
          }

          // The table under the graph: sites by self value (or by self growth in a diff), summed per frame.
          function table() {
            var per = {}, t = D.types[st.t], total = cur(0);
            // Self values of one frame's nodes are disjoint sets of samples: their variances add.
            for (var j = 1; j < N; j++) {
              var f = T.frame[j], e = per[f] || (per[f] = { i: j, self: 0, base: 0, v: 0, bv: 0 });
              var se = errOf(T.errors, "self", j), be = errOf(T.base_errors, "self", j);
              e.self += selfOf(T.values[st.t], j);
              e.v = e.v === null || se === null ? null : e.v + se * se;
              if (T.base) { e.base += selfOf(T.base[st.t], j); e.bv = e.bv === null || be === null ? null : e.bv + be * be; }
            }
            var rows = Object.keys(per).map(function (k) { return per[k]; })
              .filter(function (e) { return e.self !== 0 || e.base !== 0; });
            rows.sort(function (a, b) { return T.base ? (b.self - b.base) - (a.self - a.base) : b.self - a.self; });
            var head = T.base ? "<tr><th>base</th><th>new</th><th>change, error</th><th class=\"n\">site (self)</th></tr>"
                              : "<tr><th>self</th><th>share</th><th>error</th><th class=\"n\">site (self)</th></tr>";
            var body = rows.slice(0, 20).map(function (e) {
              var name = esc(fn(e.i)) + (where(e.i) ? " <span style=\"color:#777\">" + esc(where(e.i)) + "</span>" : "");
              var err = e.v === null ? null : Math.sqrt(e.v);
              return T.base ? "<tr><td>" + human(e.base, t.unit) + "</td><td>" + human(e.self, t.unit) + "</td><td>" +
                  esc(changeText(e.self - e.base, e.bv === null ? null : quad(err, Math.sqrt(e.bv)), t.unit)) +
                  "</td><td class=\"n\">" + name + "</td></tr>"
                : "<tr><td>" + human(e.self, t.unit) + "</td><td>" + pct(e.self, total) + "</td><td>" + relErr(err, e.self) +
                  "</td><td class=\"n\">" + name + "</td></tr>";
            });
            $("hs-top").innerHTML = "<caption style=\"text-align:left\">" + (T.base ? "Largest growth" : "Top sites") +
              " by self " + esc(t.name) + "</caption>" + head + body.join("");
          }

          function tip(i, ev) {
            var t = D.types[st.t], lines = [fn(i)];
            if (where(i)) lines.push(where(i));
            if (T.base) {
              var ce = quad(errOf(T.errors, "cum", i), errOf(T.base_errors, "cum", i));
              lines.push(t.name + ": " + human(old(i), t.unit) + " -> " + human(cur(i), t.unit) + " (" +
                         changeText(cur(i) - old(i), ce, t.unit) + ")");
            } else {
              var own = selfOf(T.values[st.t], i), oe = errOf(T.errors, "self", i);
              lines.push(t.name + ": " + human(cur(i), t.unit) + " (" + pct(cur(i), cur(0)) + " of total) " +
                         relErr(errOf(T.errors, "cum", i), cur(i)) + ", self " + human(own, t.unit) + (own ? " " + relErr(oe, own) : ""));
              // The paired types: bytes and objects of the same kind (inuse_space <-> inuse_objects).
              var stem = t.name.replace(/_(space|objects)$/, "");
              D.types.forEach(function (o, k) {
                if (k !== st.t && o.name.replace(/_(space|objects)$/, "") === stem) lines.push(o.name + ": " + human(T.values[k][i], o.unit));
              });
            }
            var el = $("hs-tip");
            el.textContent = lines.join("\n");
            el.style.display = "block";
            var x = ev.clientX + 14, y = ev.clientY + 14;
            if (x + el.offsetWidth > window.innerWidth) x = Math.max(0, ev.clientX - el.offsetWidth - 14);
            if (y + el.offsetHeight > window.innerHeight) y = Math.max(0, ev.clientY - el.offsetHeight - 14);
            el.style.left = x + "px";
            el.style.top = y + "px";
          }

          function nodeOf(ev) { var g = ev.target.closest ? ev.target.closest("g[data-i]") : null; return g ? +g.getAttribute("data-i") : -1; }
          $("hs-svg").addEventListener("mousemove", function (ev) { var i = nodeOf(ev); if (i >= 0) tip(i, ev); else $("hs-tip").style.display = "none"; });
          $("hs-svg").addEventListener("mouseleave", function () { $("hs-tip").style.display = "none"; });
          $("hs-svg").addEventListener("click", function (ev) { var i = nodeOf(ev); if (i >= 0) { st.zoom = i; render(); } });
          $("hs-reset").addEventListener("click", function () { st.zoom = 0; render(); });
          $("hs-icicle").checked = st.icicle;
          $("hs-icicle").addEventListener("change", function () { st.icicle = this.checked; render(); });
          var sel = $("hs-type");
          D.types.forEach(function (t, k) {
            var o = document.createElement("option");
            o.value = k; o.textContent = t.name + " (" + t.unit + ")"; o.selected = k === st.t;
            sel.appendChild(o);
          });
          sel.addEventListener("change", function () { st.t = +this.value; labelTexts(); render(); table(); });

          // Label selectors, one per user label key: a value's choice draws that value's tree (built
          // when the page was written, see Flamegraph.add_label_views) and sets the other keys back to
          // "all", since the trees are per value, not per combination. Every string here is the
          // application's: options and labels get it as textContent, never as markup.
          var picks = [];
          (D.labels || []).forEach(function (L) {
            var box = document.createElement("label"), s = document.createElement("select");
            box.appendChild(document.createTextNode(L.key + " "));
            var add = function (text, view) {
              var o = document.createElement("option");
              o.value = String(view); o.textContent = text;
              s.appendChild(o);
              return o;
            };
            var entries = [{ o: add("all", -1), name: "all", view: -1 }];
            L.values.forEach(function (v) { entries.push({ o: add(v.name, v.view), name: v.name, view: v.view }); });
            if (L.missing !== null) entries.push({ o: add(L.missing_name, L.missing), name: L.missing_name, view: L.missing });
            if (L.more > 0) { var o = add(L.more + " more values (heapscope flamegraph --label " + L.key + "=VALUE)", -2); o.disabled = true; }
            s.addEventListener("change", function () {
              var v = +s.value;
              picks.forEach(function (p) { if (p.select !== s) p.select.value = "-1"; });
              st.view = v;
              st.pick = null;
              entries.forEach(function (e) { if (v >= 0 && e.view === v) st.pick = e.view === L.missing ? e.name : L.key + "=" + e.name; });
              st.zoom = 0;
              use(v < 0 ? D : D.views[v]);
              render();
              table();
            });
            box.appendChild(s);
            $("hs-labels").appendChild(box);
            picks.push({ select: s, entries: entries });
          });
          // Each value with its total in the sample type shown (the whole profile's for "all").
          function labelTexts() {
            var u = unit();
            picks.forEach(function (p) {
              p.entries.forEach(function (e) {
                var tree = e.view < 0 ? D : D.views[e.view], v = tree.values[st.t][0];
                e.o.textContent = e.name + " (" + (tree.base ? signed(v - tree.base[st.t][0], u) : human(v, u)) + ")";
              });
            });
          }
          labelTexts();
          $("hs-search").addEventListener("input", function () {
            var q = this.value.trim();
            if (!q) st.re = null;
            else { try { st.re = new RegExp(q, "i"); } catch (e) { st.re = new RegExp(q.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "i"); } }
            render();
          });
          if (D.base) {
            $("hs-sizeby").style.display = "";
            $("hs-size").addEventListener("change", function () { st.base = this.value === "base"; render(); });
          }
          document.addEventListener("keydown", function (ev) {
            if (ev.key === "Escape") { st.zoom = 0; $("hs-search").value = ""; st.re = null; render(); }
          });
          window.addEventListener("resize", render);
          render();
          table();
        })();
      JS

      TEMPLATE = ERB.new(<<~HTML, trim_mode: "-")
        <!DOCTYPE html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title><%= title %></title>
        <style><%= css %></style>
        </head>
        <body>
        <header>
        <h1><%= title %></h1>
        <div class="meta"><%= meta %></div>
        </header>
        <div class="controls">
        <label>Sample type <select id="hs-type"></select></label>
        <span id="hs-labels"></span>
        <span id="hs-sizeby" style="display:none"><label>Width <select id="hs-size"><option value="new">new</option><option value="base">base</option></select></label></span>
        <input id="hs-search" type="search" placeholder="Search functions or files (regexp)" aria-label="search">
        <button id="hs-reset" type="button">Reset zoom</button>
        <label><input id="hs-icicle" type="checkbox"> icicle</label>
        <span id="hs-status"></span>
        </div>
        <div id="hs-graph"><svg id="hs-svg" xmlns="http://www.w3.org/2000/svg" width="100%" height="0"></svg></div>
        <div id="hs-tip"></div>
        <p class="hs-help"><%= help %></p>
        <table id="hs-top"></table>
        <%= census %>
        <script type="application/json" id="hs-data"><%= json %></script>
        <script><%= js %></script>
        </body>
        </html>
      HTML

      module_function

      # Returns the page for data (a Hash, see above).
      # census: the census rows (Census#report) of the profile's inuse_space, or nil.
      def render(data, title:, meta:, help:, census: nil)
        # The JSON sits inside a <script> element, where the HTML parser still looks for "</script",
        # "<!--" and "<script" (a frame named "<!--<script>" would swallow the rest of the page):
        # Escape.script_json writes <, >, & and U+2028/2029 as \uXXXX, the same string to JSON.parse.
        json = Escape.script_json(data)
        esc = ->(s) { ERB::Util.html_escape(Escape.scrub(s)) }
        TEMPLATE.result_with_hash(title: esc[title], meta: esc[meta], help: esc[help], json: json, css: CSS, js: JS,
                                  census: census_table(census, esc))
      end

      # The census's rows as a static table (no script: the page's sample type selector does not change
      # them, they are of inuse_space or inuse_objects as the caption says). Errors are one standard
      # error, as in the text reports.
      def census_table(data, esc)
        return "" unless data

        unit = data["unit"]
        caption = "Exact totals (census, #{format("%.1f", data["seconds"] * 1000)} ms): #{Census.delimit(data["objects"])} " \
                  "objects, #{Units.bytes(data["bytes"])} in #{Census.delimit(data["classes"])} classes"
        return "<table id=\"hs-census\"><caption style=\"text-align:left\">#{esc[caption]}; #{esc[data["note"]]}</caption></table>" if data["note"]

        row = lambda do |r, name|
          over = r["not_seen"].negative?
          rest = Census.cells(r, unit, name)[3]
          "<tr><td class=\"n\">#{esc[name]}</td><td>#{esc[Units.format(r["exact"], unit)]}</td>" \
            "<td>#{esc[Units.format(r["at_sites"], unit)]}</td><td#{over ? " class=\"over\"" : ""}>#{esc[rest]}</td></tr>"
        end
        other = data["other"]
        body = data["rows"].map { |r| row.call(r, r["name"]) }
        body << row.call(other, other["count"] ? "#{Census::OTHER} (#{Census.delimit(other["count"])})" : Census::OTHER)
        types = data["types"].map { |r| row.call(r, r["name"]) }
        head = ->(first) { "<tr><th class=\"n\">#{first}</th><th>exact</th><th>at sites</th><th>not seen at any site (± standard error)</th></tr>" }
        "<table id=\"hs-census\"><caption style=\"text-align:left\">#{esc[caption]}; #{esc[data["sample_type"]]}</caption>" \
          "#{head.call("class")}#{body.join}#{head.call("type")}#{types.join}</table>"
      end
    end
  end
end
