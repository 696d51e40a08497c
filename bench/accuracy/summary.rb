# frozen_string_literal: true

# Reads a work directory of bench/accuracy/run (plan.json, runs/, truth/), prints a table per case and a
# summary, writes the results JSON and exits 1 if a criterion failed (0 with --no-fail). README.md says
# what each column means.
#
#   ruby -Ilib bench/accuracy/summary.rb tmp/accuracy/STAMP     (run does this; again by hand is fine)
require "json"
require "fileutils"
require "heapscope/report/units"
require_relative "case"
require_relative "stats"
require_relative "census_checks"

module Accuracy
  # The library cases' sites: the biggest live sites by bytes, and the biggest allocation sites by bytes
  # among the others (README.md).
  LIVE_SITES = 10
  ALLOC_SITES = 5
  MODES = %w[default always].freeze
  # Heapscope.stats counters shown in a case's notes (averaged per mode), where the sampler has them.
  STATS_SHOWN = %w[samples_taken windows_opened hook_on_share mean_window_share weight_scale rate_adjustments current_sample_every].freeze
  UNITS = { "alloc_objects" => "count", "alloc_space" => "bytes", "inuse_objects" => "count", "inuse_space" => "bytes" }.freeze

  # Builds one case's results from its runs (and its traced truth).
  class CaseResult
    attr_reader :name, :rows, :errors, :runs, :pooled, :notes, :census

    def initialize(name, runs, traced, plan)
      @name = name
      @plan = plan
      @errors = runs.select { |r| r["error"] }.map { |r| "#{r["mode"]} run #{r["run"]}: #{r["error"]}" }
      @errors << "trace: #{traced["error"]}" if traced&.dig("error")
      @runs = MODES.to_h { |m| [m, runs.select { |r| r["mode"] == m && !r["error"] }.sort_by { |r| r["run"] }] }
      @notes = notes_of(traced)
      @rows = []
      short = @runs.select { |_, rs| rs.size < 2 }.keys
      @errors << "fewer than 2 runs finished in mode #{short.join(" and ")}" if short.any?
      return if short.any? || (traced && traced["error"])

      truth = traced && traced["truth"]
      names = @runs["default"].first["names"] || {}
      keys = truth ? library_sites(truth) : @runs["default"].first["truth"].keys
      keys.each do |key|
        TYPES.each { |type| @rows << row(key, names[key], type, truth) }
      end
      # The census checks (census_checks.rb): a synthetic site's class and type from the run, a library
      # site's types from its trace.
      @census = MODES.to_h do |m|
        [m, CensusChecks.new(@runs[m], keys, truth_of: ->(r, key) { (truth || r["truth"]).fetch(key) },
                                             info_of: ->(r, key) { truth ? { "types" => truth[key]["types"] } : r.dig("site_info", key) })]
      end
      @pooled = MODES.to_h do |m|
        judged = @rows.select { |r| r["judged"] }
        total = judged.sum { |r| r[m]["runs"] }
        [m, total.zero? ? nil : judged.sum { |r| r[m]["covered"] }.fdiv(total)]
      end
    end

    def library_sites(truth)
      live = truth.sort_by { |k, v| [-v["inuse_space"], k] }.first(LIVE_SITES).map(&:first)
      alloc = truth.reject { |k, _| live.include?(k) }.sort_by { |k, v| [-v["alloc_space"], k] }.first(ALLOC_SITES).map(&:first)
      live + alloc
    end

    def row(key, name, type, traced_truth)
      row = { "site" => key, "name" => name, "type" => type }
      objects = nil
      MODES.each do |m|
        values = @runs[m].map do |r|
          truth = (traced_truth || r["truth"]).fetch(key)
          objects = (objects || 0) + truth[OBJECTS_OF[type]]
          est, rel = r.dig("estimates", key, type) || [0, nil]
          [est, rel, truth[type]]
        end
        row[m] = Stats.summarize(values)
        row["#{m}_values"] = values
      end
      # Judged when a run expects at least min_samples samples of the site's objects; a library case's
      # alloc_space is not (its truth is each object's size when its step ends, trace.rb).
      row["samples"] = objects.fdiv(@runs.values.sum(&:size) * @plan["sample_every"])
      row["why_not_judged"] = if traced_truth && type == "alloc_space" then "size at first GC unknown"
                              elsif row["samples"] < @plan["min_samples"] || row["default"]["truth"].zero?
                                format("%.3g samples", row["samples"])
                              end
      row["judged"] = row["why_not_judged"].nil?
      row["ratio"] = Stats.ratio(row["default"], row["always"])
      row["fails"] = row["judged"] ? fails(row) : []
      row
    end

    def fails(row)
      out = []
      MODES.each { |m| out << "z(#{m})" unless Stats.z_ok?(row[m]) }
      out << "ratio" unless Stats.ratio_ok?(row["ratio"]) || !Accuracy.fetch_case(@name).judge_ratio
      MODES.each { |m| out << "cover(#{m})" unless Stats.coverage_ok?(row[m], strict: @plan["strict_coverage"]) }
      out
    end

    # Numeric notes averaged over each mode's runs, the others from the first run, and the trace's.
    def notes_of(traced)
      out = {}
      @runs.each do |m, rs|
        next if rs.empty?

        numeric = rs.flat_map { |r| r["notes"].select { |_, v| v.is_a?(Numeric) }.keys }.uniq
        numeric.each { |k| (out[k] ||= {})[m] = Stats.mean(rs.map { |r| r["notes"][k] || 0 }).round(2) }
        rs.first["notes"].each { |k, v| out[k] ||= v unless v.is_a?(Numeric) || k == "truth_problems" }
        STATS_SHOWN.each do |k|
          next unless rs.any? { |r| r["stats"][k].is_a?(Numeric) }

          (out[k] ||= {})[m] = Stats.mean(rs.map { |r| r["stats"][k].to_f }).round(4)
        end
        (out["sampling"] ||= {})[m] = rs.map { |r| r["stats"]["sampling"] }.uniq.join(",")
        (out["seconds_per_process"] ||= {})[m] = Stats.mean(rs.map { |r| r["seconds"] }).round(2)
      end
      out["trace"] = traced["notes"] if traced&.dig("notes")
      out
    end

    def judged
      @rows.select { |r| r["judged"] }
    end

    def failed_rows
      @rows.reject { |r| r["fails"].empty? }
    end

    def pooled_ok?(mode)
      @pooled.nil? || @pooled[mode].nil? || Stats::COVERAGE.cover?(@pooled[mode])
    end

    def truth_problems
      @runs.values.flatten.flat_map { |r| r["notes"]["truth_problems"] || [] }.uniq
    end

    # The census criteria are the default mode's (issue 31's acceptance); :always's are shown beside them.
    def census_fails
      @census ? @census["default"].fails : []
    end

    def ok?
      @errors.empty? && !@rows.empty? && failed_rows.empty? && MODES.all? { |m| pooled_ok?(m) } && truth_problems.empty? &&
        census_fails.empty?
    end

    def to_h
      { "case" => @name, "ok" => ok?, "errors" => @errors, "notes" => @notes, "pooled_coverage" => @pooled,
        "census" => @census&.transform_values(&:to_h), "rows" => @rows }
    end
  end

  # Text output.
  module Table
    module_function

    def value(v, type)
      Heapscope::Report::Units.format(v.round, UNITS.fetch(type))
    end

    def site_name(row)
      file, line = row["site"].match(/\A(.*):(\d+)\z/).captures
      short = file.sub(%r{\A.*/gems/[^/]+/lib/}, "").sub(%r{\A.*/bench/accuracy/cases/\d+_}, "")
      row["name"] ? "#{row["name"]} #{short}:#{line}" : "#{short}:#{line}"
    end

    def note_value(v)
      return "-" if v.nil?
      return v unless v.is_a?(Numeric)

      v.abs >= 10_000 ? Heapscope::Report::Units.count(v.round) : v.round(v.abs >= 10 ? 0 : 3)
    end

    def z(m)
      m["z"].nil? ? "inf" : format("%+.1f", m["z"])
    end

    def pct(x)
      x.nil? ? "-" : format("%.0f%%", 100 * x)
    end

    def render(rows)
      widths = rows.transpose.map { |col| col.map { |c| c.to_s.size }.max }
      rows.map do |r|
        r.each_with_index.map { |c, i| i.zero? || i == r.size - 1 ? c.to_s.ljust(widths[i]) : c.to_s.rjust(widths[i]) }.join("  ").rstrip
      end
    end

    def case_table(res, kase)
      lines = ["", "== #{res.name}: #{kase.summary}"]
      per_mode, other = res.notes.partition { |_, v| v.is_a?(Hash) && v.keys.all? { |k| MODES.include?(k) } }
      per_mode.map { |k, v| "#{k} #{MODES.map { |m| note_value(v[m]) }.join("/")}" }.each_slice(6) do |slice|
        lines << "   per run (default/always): #{slice.join(", ")}"
      end
      other.each { |k, v| lines << "   #{k}: #{v.is_a?(Hash) ? v.map { |a, b| "#{a} #{b}" }.join(", ") : v}" }
      if res.notes.dig("sampling", "default") == "always"
        lines << "   WARNING the default mode sampled with sampling: always here, so default and always are the same sampler"
      end
      res.errors.first(5).each { |e| lines << "   ERROR #{e}" }
      res.truth_problems.each { |e| lines << "   TRUTH PROBLEM #{e}" }
      return lines if res.rows.empty?

      head = ["site", "type", "truth", "default: mean", "se", "z", "spread", "cover", "always: mean", "se", "z", "spread", "cover", "ratio", "verdict"]
      body = res.rows.map do |r|
        d = r["default"]
        a = r["always"]
        verdict = if !r["judged"] then "- (#{r["why_not_judged"]})"
                  elsif r["fails"].empty? then "ok"
                  else "FAIL #{r["fails"].join(" ")}"
                  end
        [site_name(r), r["type"], value(d["truth"], r["type"]),
         value(d["mean"], r["type"]), value(d["se"], r["type"]), z(d), pct(d["spread"]), pct(d["coverage"]),
         value(a["mean"], r["type"]), value(a["se"], r["type"]), z(a), pct(a["spread"]), pct(a["coverage"]),
         r["ratio"] ? format("%.2f", r["ratio"]) : "-", verdict]
      end
      lines.concat(render([head] + body).map { |l| "   #{l}" })
      lines << "   pooled coverage of the judged rows: default #{pct(res.pooled["default"])}, always #{pct(res.pooled["always"])}" \
               " (pass #{pct(Stats::COVERAGE.begin)}-#{pct(Stats::COVERAGE.end)})"
      lines.concat(census_lines(res))
    end

    # The census checks, one line per mode (census_checks.rb; the default mode's are judged).
    def census_lines(res)
      res.census.map do |m, c|
        h = c.to_h
        verdict = m == "default" ? (h["fails"].empty? ? "ok" : "FAIL #{h["fails"].join(", ")}") : "(not judged)"
        line = "   census #{m}: exact #{h["mismatch_count"].zero? ? "equal" : "#{h["mismatch_count"]} MISMATCHES"}" \
               "#{h["unlisted"].positive? ? " (#{h["unlisted"]} class rows unlisted)" : ""}, " \
               "unsampled cover #{pct(h["unsampled_coverage"])} of #{h["unsampled_pairs"]}, " \
               "sites+unsampled cover #{pct(h["combined_coverage"])} of #{h["combined_pairs"]}, " \
               "#{h["exact_pairs"]} exact pairs, above exact #{h["above_count"]}" \
               "#{h["exact_max"] ? format(", exact sites max %.2fx", h["exact_max"]) : ""}, census #{h["census_ms"] || "-"} ms: #{verdict}"
        [line, *h["mismatches"].first(3).map { |x| "     mismatch #{x}" }, *h["above"].first(3).map { |x| "     above #{x}" }]
      end.flatten
    end

    def summary(results, plan)
      head = ["case", "runs", "judged", "z fails (def/alw)", "ratio fails", "cover fails (def/alw)", "pooled cover (def/alw)",
              "census", "combined cover", "s/process", "verdict"]
      body = results.map do |res|
        count = ->(tag) { res.failed_rows.count { |r| r["fails"].include?(tag) } }
        secs = res.notes["seconds_per_process"] || {}
        [res.name, MODES.map { |m| res.runs[m].size }.join("/"), res.judged.size,
         "#{count.("z(default)")}/#{count.("z(always)")}", count.("ratio"),
         "#{count.("cover(default)")}/#{count.("cover(always)")}",
         res.pooled ? "#{pct(res.pooled["default"])}/#{pct(res.pooled["always"])}" : "-",
         res.census ? (res.census_fails.empty? ? "ok" : "FAIL") : "-",
         res.census ? pct(res.census["default"].to_h["combined_coverage"]) : "-",
         MODES.map { |m| secs[m] || "-" }.join("/"), res.ok? ? "pass" : "FAIL"]
      end
      ["", "== summary: #{plan["runs"]} runs per mode, sample_every #{plan["sample_every"]}" \
           "#{plan["max_overhead"] ? ", max_overhead #{plan["max_overhead"]}" : ""}#{plan["window_share"] ? ", window_share #{plan["window_share"]}" : ""}#{plan["focus"] ? ", focus #{plan["focus"]}" : ""}#{plan["quick"] ? ", --quick" : ""}; #{plan["ruby"]}", *render([head] + body).map { |l| "   #{l}" }]
    end
  end
end

workdir = ARGV.first or abort "usage: summary.rb WORKDIR"
plan = JSON.parse(File.read(File.join(workdir, "plan.json")))
Accuracy.load_cases
load_json = ->(path) { JSON.parse(File.read(path)) }
runs = Dir[File.join(workdir, "runs", "*.json")].map(&load_json).group_by { |r| r["case"] }
results = plan["cases"].map do |name|
  truth_path = File.join(workdir, "truth", "#{name}.json")
  traced = File.exist?(truth_path) ? load_json.(truth_path) : nil
  traced ||= { "error" => "no truth (the trace job did not finish)" } if Accuracy.fetch_case(name) <= Accuracy::LibraryCase
  Accuracy::CaseResult.new(name, runs.fetch(name, []), traced, plan)
end
results.each { |res| puts Accuracy::Table.case_table(res, Accuracy.fetch_case(res.name)) }
puts Accuracy::Table.summary(results, plan)
elapsed = File.exist?(File.join(workdir, "elapsed")) ? File.read(File.join(workdir, "elapsed")).to_i : nil
all_runs = runs.values.flatten + Dir[File.join(workdir, "truth", "*.json")].map(&load_json)
cpu = all_runs.sum { |r| r["cpu_s"].to_f }
puts format("   jobs: %<wall>s s of wall time, %<cpu>.0f s of CPU (%<per>.1f s per process); on %<j>d idle cores: ~%<idle>.0f s",
            wall: elapsed || "?", cpu: cpu, per: cpu / [all_runs.size, 1].max, j: plan["jobs"], idle: cpu / plan["jobs"])
FileUtils.mkdir_p(File.dirname(plan["json"]))
File.write(plan["json"], JSON.generate("plan" => plan, "elapsed_s" => elapsed, "cpu_s" => cpu.round(1), "ok" => results.all?(&:ok?),
                                       "cases" => results.map(&:to_h)))
puts "   results: #{plan["json"]}"
ok = results.all?(&:ok?)
puts "   #{ok ? "every criterion passed" : "some criteria FAILED"}#{plan["fail"] ? "" : " (--no-fail: exit 0)"}"
exit(ok || !plan["fail"] ? 0 : 1)
