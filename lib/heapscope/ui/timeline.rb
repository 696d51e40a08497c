# frozen_string_literal: true

require "time"
require "heapscope/report/labels"
require "heapscope/report/leaks"

module Heapscope
  module UI
    # Timeline turns a series' summaries into what the page draws (GET /api/timeline): per snapshot its
    # time, total live bytes and memory breakdown; the largest sites' live bytes over time with their
    # 1σ errors (the page draws ±2σ bands); and the leak verdicts of `heapscope leaks` (Report::Leaks.rank)
    # computed from the same summaries, so no profile is read twice.
    #
    # Built from the candidates only (sites in some snapshot's top list, and the sites that grew most
    # from the first to the last snapshot), never from a pass over every site of every snapshot: 500
    # snapshots of 5,000 sites stay a few hundred thousand steps.
    module Timeline
      DRAWN = 10 # sites drawn, by peak live bytes
      LEAK_CANDIDATES = 60 # sites whose trend is fitted, by growth from the first to the last snapshot
      LEAKS_SHOWN = 20
      DRAWN_LEAKS = 3 # leaks drawn even when they are not among the largest

      module_function

      # series: a Sources::Series; table: the SiteTable its summaries number sites by; filters: label
      # filters (Report::Labels::Filter): with some, "selected" is the live bytes of the samples carrying
      # them all, per snapshot (Summary#labelled), drawn beside the whole heap's total.
      def build(series, table, filters = [])
        snaps = series.snapshots.select(&:summary).sort_by { |s| [s.summary.time, s.id.to_i] }
        out = {
          "name" => series.name, "kind" => series.kind, "last_error" => series.last_error,
          "errors" => series.snapshots.select(&:error).map { |s| { "file" => s.path, "error" => s.error } },
          "snapshots" => snaps.map { |s| snapshot_json(s) }, "sites" => [], "leaks" => [], "unit" => "bytes",
        }
        return out if snaps.empty?

        sums = snaps.map(&:summary)
        out["unit"] = sums.last.unit
        out["selected"] = selected(sums, filters) unless filters.empty?
        leaks = snaps.size >= 2 && sums.map(&:time).uniq.size >= 2 ? leak_rows(sums, table) : []
        out["leaks"] = leaks.first(LEAKS_SHOWN)
        leak_ids = leaks.select { |r| r["verdict"] == Report::Verdict::LEAK }.first(DRAWN_LEAKS).map { |r| r["id"] }
        drawn = (largest(sums) + leak_ids).uniq
        out["sites"] = drawn.map do |id|
          points = sums.map { |sum| sum.at(id) }
          site_json(table[id], id).merge("values" => points.map(&:first), "errors" => points.map { |p| p[1].round(1) })
        end
        out
      end

      def snapshot_json(snap)
        sum = snap.summary
        {
          "id" => snap.id, "time" => sum.time, "iso" => Time.at(sum.time).utc.iso8601(3),
          "file" => snap.path && File.basename(snap.path), "total" => sum.total, "total_error" => sum.total_error.round(1),
          "memory" => sum.memory, "whole" => !snap.path.nil? || !snap.profile.nil?,
        }
      end

      # The filtered series: values and 1σ errors per snapshot, and per snapshot the most the label sets
      # a summary left out could add ("rest", 0 when it kept them all: the value is then complete).
      def selected(sums, filters)
        points = sums.map { |sum| sum.labelled(filters) }
        {
          "filter" => Report::Labels.filter_text(filters), "values" => points.map(&:first),
          "errors" => points.map { |p| p[1].round(1) }, "rest" => points.map(&:last),
        }
      end

      def site_json(site, id)
        { "id" => id, "name" => site.name, "function" => site.function, "file" => site.file, "line" => site.line }
      end

      # The DRAWN sites with the highest peak among the snapshots' top lists.
      def largest(sums)
        peak = Hash.new(0)
        sums.each do |sum|
          sum.top.each do |id|
            v = sum.at(id)[0]
            peak[id] = v if v > peak[id]
          end
        end
        peak.max_by(DRAWN) { |id, v| [v, -id] }.map(&:first)
      end

      # The slope's variance of site id when the summaries are of one run, say what it needs and the
      # site's samples live on (as `heapscope leaks` computes it: Report::Persistence), else nil (the
      # points' own errors). A site below a snapshot's kept largest has no parts there: nil too.
      def one_run_variance(sums, id, times, values, errors)
        run = sums.first.run
        return nil unless run && sums.all? { |s| s.run == run && s.persist }

        facts = sums.map(&:persist)
        extras = sums.map { |s| s.extra(id) }
        return nil if extras.include?(:unknown) || !Report::Persistence.gc_series?(facts)

        windowed = sums.all?(&:design)
        return nil unless windowed || sums.none?(&:design)

        designs = windowed ? sums.map(&:design) : nil
        return nil if windowed && designs.map { |d| d[:allocations].size }.uniq.size != 1

        Report::Persistence.series_variance(times, values, errors, extras.map(&:last), facts, parts: extras.map(&:first),
                                            designs: designs, fpc: windowed ? designs.last[:fpc] : 1.0)
      end

      # Leaks.rank over the sites that grew most from the first snapshot to the last, each row with its
      # site id (the page draws a leak on click).
      def leak_rows(sums, table)
        first = sums.first
        last = sums.last
        growth = last.ids.each_with_index.map { |id, i| [id, last.values[i] - first.at(id)[0]] }
        candidates = growth.select { |_, g| g.positive? }.max_by(LEAK_CANDIDATES) { |_, g| g }.map(&:first)
        times = sums.map { |s| (s.time - first.time) / 60.0 }
        sites = candidates.to_h do |id|
          points = sums.map { |sum| sum.at(id) }
          values = points.map(&:first)
          errors = points.map(&:last)
          [id, { entry: table[id], values: values, errors: errors,
                 slope_variance: one_run_variance(sums, id, times, values, errors) }]
        end
        every = last.every
        rows = Report::Leaks.rank(sites, times, every: every, unit: last.unit)
        ids = sites.to_h { |id, s| [s[:entry].name, id] }
        rows.each do |r|
          r["id"] = ids[r["name"]]
          r.delete("values") # the chart has them for drawn sites
          r["verdict_text"] = Report::Leaks.verdict_text(r)
        end
      end
    end
  end
end
