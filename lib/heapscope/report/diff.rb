# frozen_string_literal: true

require "heapscope/report/command"
require "heapscope/report/flamegraph"
require "heapscope/report/verdict"
require "heapscope/report/persistence"

module Heapscope
  module Report
    # Diff compares two profiles site by site: what grew and what shrank from BASE to NEW, sorted by
    # growth, each change with its standard error sqrt(err_new² + err_base²) (the two profiles are
    # independent samples; each err is Sampling#absolute_error, the sampler's variance when the
    # profiles carry it). A change is "noise" unless it exceeds twice that error. Each row's verdict
    # (Report::Verdict.change) says more: grew or shrank beyond 2σ, noise, or not enough evidence with the
    # sample_every that would tell; z is the change over its error.
    #
    #   heapscope diff before.pb.gz after.pb.gz
    #   heapscope diff before.pb.gz after.pb.gz --html -o growth.html   # a flame graph coloured by growth
    class Diff < Command
      DESCRIPTION = "Compares two profiles site by site and marks a change as noise unless it exceeds twice its combined error."
      USAGE = "usage: heapscope diff BASE NEW [--sample TYPE] [--by line|function|class|file|gem|label:KEY] " \
              "[--label KEY=VALUE]... [-n 20] [--json] [--html [-o out.html]] [--max-size SIZE]"

      def defaults
        { n: 20, by: "line" }
      end

      def options(parser, opts)
        sample_flag(parser, opts)
        by_flag(parser, opts)
        label_flag(parser, opts)
        limit_flag(parser, opts)
        parser.on("--json", "print JSON for machines") { opts[:json] = true }
        parser.on("--html", "write a flame graph coloured by growth instead of text") { opts[:html] = true }
        parser.on("-o", "--output PATH", "where --html writes (default: NEW with -diff.html; - for stdout)") do |v|
          opts[:output] = v
        end
      end

      def check_args(args)
        super(args, min: 2, max: 2, what: "BASE and NEW profiles")
        raise Error, "-o needs --html" if @opts[:output] && !@opts[:html]
      end

      def run(out)
        base_path, new_path = @args
        base = load_profile(base_path)
        newer = load_profile(new_path)
        if @opts[:html]
          return Flamegraph.write(self.class.html(base, newer, base_path: base_path, new_path: new_path,
                                                  sample: @opts[:sample], labels: @opts[:labels] || []),
                                  @opts[:output] || "#{output_stem(new_path)}-diff.html", out)
        end
        data = self.class.report(base, newer, base_path: base_path, new_path: new_path,
                                              **@opts.slice(:sample, :by, :n, :labels))
        out.puts(@opts[:json] ? Escape.json(data) : self.class.text(data))
        0
      end

      # Computes the comparison as a Hash (what --json prints): "grew" largest growth first, "shrank"
      # largest shrink first, at most n each.
      #
      # labels: [Labels::Filter], applied to both profiles: the change of what the matching samples hold
      # (a value new in NEW has no samples in BASE, which is fine; matching nothing in either is an
      # error). total_base and total_new stay the whole profiles'; selected_base and selected_new are
      # the selection's.
      def self.report(base, newer, base_path: "base", new_path: "new", sample: nil, by: "line", n: 20, labels: [])
        ti = Sites.sample_index(newer, sample, new_path)
        name, unit = newer.sample_types[ti]
        bi = Sites.sample_index(base, name, base_path)
        Labels.check_by([base, newer], by, "#{base_path} and #{new_path}")
        whole_base = base
        whole_new = newer
        base, newer = select_both(base, newer, labels, base_path, new_path)
        s_new = Sampling.new(newer)
        s_base = Sampling.new(base)
        every = s_new.rate_lowered? ? s_new.current_sample_every : s_new.sample_every
        new_sites = Sites.aggregate(newer, by, cum: [])
        base_sites = Sites.aggregate(base, by, cum: [])
        pair = Persistence.one_run?([base, newer]) && live?(base, newer, bi, ti) &&
               Persistence.pair(base, newer, s_base, s_new, bi, ti, by)
        one_run = pair && one_run_columns(s_base, s_new, bi, ti)
        always = pair && !one_run && s_base.variance? && s_new.variance? && !s_base.live_design && !s_new.live_design
        rows = (new_sites.keys | base_sites.keys).map do |key|
          e_new = new_sites[key]
          e_base = base_sites[key]
          v_new = e_new ? e_new.flat[ti] : 0
          v_base = e_base ? e_base.flat[bi] : 0
          # Independent samples: the errors of the two estimates add in quadrature (a side without the
          # site is 0 ± 0; an unknown error makes the change's unknown).
          err_new = e_new ? s_new.absolute_error(e_new.flat, ti) : 0.0
          err_base = e_base ? s_base.absolute_error(e_base.flat, bi) : 0.0
          err = err_new && err_base ? Math.sqrt(err_new**2 + err_base**2) : nil
          if err && (one_run || always) && pair.lives_on?(key, v_base, v_new)
            err = one_run ? one_run_error(one_run, e_base, e_new, s_base, s_new) : Math.sqrt(pair.always_variance(key, err_base**2, err_new**2))
          end
          e = e_new || e_base
          change = v_new - v_base
          call = Verdict.change(change, err, v_base, v_new, every: every)
          {
            "name" => e.name, "function" => e.function, "file" => e.file, "line" => e.line,
            "base" => v_base, "new" => v_new, "change" => change,
            "change_percent" => v_base.zero? ? nil : (100.0 * change / v_base.abs).round(2),
            "error" => err && (err >= 1 ? err.round(1) : Units.significant(err)), "noise" => err ? Diff.noise?(change, err) : nil,
            "verdict" => call[:verdict], "sigmas" => Verdict.sigmas(call[:z]), "advice" => call[:advice],
            "advice_sample_every" => call[:sample_every],
          }
        end
        rows.reject! { |r| r["change"].zero? }
        {
          "base_file" => base_path, "new_file" => new_path, "sample_type" => name, "unit" => unit, "by" => by,
          "total_base" => whole_base.samples.sum { |s| s.values[bi] },
          "total_new" => whole_new.samples.sum { |s| s.values[ti] }, "sampling_base" => s_base.describe,
          "sampling_new" => s_new.describe, "one_run" => !!(one_run || always),
          "labels" => Labels.summary([whole_base, whole_new]), "label_filter" => Labels.filter_json(labels || []),
          "selected_base" => base.samples.sum { |s| s.values[bi] }, "selected_new" => newer.samples.sum { |s| s.values[ti] },
          "grew" => rows.select { |r| r["change"].positive? }.sort_by { |r| [-r["change"], r["name"]] }.first(n),
          "shrank" => rows.select { |r| r["change"].negative? }.sort_by { |r| [r["change"], r["name"]] }.first(n),
          "grew_total" => rows.count { |r| r["change"].positive? },
          "shrank_total" => rows.count { |r| r["change"].negative? },
        }
      end

      # Two snapshots of one run (Report::Persistence) share the samples of every object alive in both,
      # so those cancel out of a change: windowed, its error is the random-groups error of the change's
      # own parts (each profile's linearized by its own design); sampling always, the Bernoulli variance
      # of what was sampled or lost between them (Persistence::Pair). Not the two errors in quadrature,
      # which count the shared samples' luck twice (7.5x the real spread of a steady leak's change on
      # Ruby 3.3: bench/same_run_diff.rb). Only for a site whose samples mostly lived on from one to the
      # other; one whose samples came and went keeps the two errors, which are right for it.
      # Returns [base's group columns, new's] when the profiles are windowed, else nil.
      def self.one_run_columns(s_base, s_new, bi, ti)
        return nil unless s_base.live_design && s_new.live_design

        cols = [s_base.variance_columns(bi).drop(1), s_new.variance_columns(ti).drop(1)]
        return nil unless cols.map(&:size).uniq == [s_new.live_design[:allocations].size]

        cols
      end

      # True when both types compared are live values (the allocation counters follow another design).
      def self.live?(base, newer, bi, ti)
        [base.sample_types[bi][0], newer.sample_types[ti][0]].all? { |t| t.start_with?("inuse_") }
      end

      # The change's error for one run: see one_run_columns.
      def self.one_run_error(cols, e_base, e_new, s_base, s_new)
        parts = [[e_base, cols[0]], [e_new, cols[1]]].map { |e, c| e ? e.flat.values_at(*c).map(&:to_f) : nil }
        design = s_new.live_design
        Math.sqrt(Persistence.slope_variance([-1.0, 1.0], parts, [s_base.live_design, design], s_new.fpc, design[:groups]))
      end

      # Renders report's Hash as text.
      def self.text(data)
        unit = data["unit"]
        change = data["total_new"] - data["total_base"]
        pct = data["total_base"].zero? ? "" : format(", %+.1f%%", 100.0 * change / data["total_base"].abs)
        lines = ["Base: #{data["base_file"]} (#{data["sampling_base"]})",
                 "New:  #{data["new_file"]} (#{data["sampling_new"]})",
                 "Type: #{data["sample_type"]}, by #{data["by"]}",
                 "Total: #{Units.format(data["total_base"], unit)} -> #{Units.format(data["total_new"], unit)} " \
                 "(#{Units.signed(change, unit)}#{pct})"]
        keys = Labels.summary_text(data["labels"])
        lines.insert(3, "Labels: #{keys}") if keys
        if (filter = data["label_filter"]) && !filter.empty?
          sel = data["selected_new"] - data["selected_base"]
          lines << "Selected: samples with #{Labels.filter_text(filter)}: " \
                   "#{Units.format(data["selected_base"], unit)} -> #{Units.format(data["selected_new"], unit)} " \
                   "(#{Units.signed(sel, unit)})"
        end
        [["Grew", "grew"], ["Shrank", "shrank"]].each do |title, key|
          rows = data[key]
          lines << ""
          lines << "#{title}: #{data["#{key}_total"]} site#{data["#{key}_total"] == 1 ? "" : "s"}#{rows.size < data["#{key}_total"] ? " (showing #{rows.size})" : ""}"
          next if rows.empty?

          table = [%w[base new change change% error verdict site]]
          rows.each do |r|
            table << [Units.format(r["base"], unit), Units.format(r["new"], unit), Units.signed(r["change"], unit),
                      r["change_percent"].nil? ? "new" : format("%+.1f%%", r["change_percent"]),
                      Units.abs_error(r["error"], unit), verdict_text(r), r["name"]]
          end
          lines.concat(Report.table(table))
        end
        advised = (data["grew"] + data["shrank"]).select { |r| r["advice"] }
        unless advised.empty?
          lines << ""
          lines << "To decide:"
          advised.each { |r| lines << "  #{r["name"]}: #{Units.signed(r["change"], unit)} #{Units.abs_error(r["error"], unit)}: #{r["advice"]}" }
        end
        lines << ""
        if data["one_run"]
          lines << "(both profiles are of one run: the samples alive in both cancel out of a change, so its error " \
                   "counts only what was sampled or lost between them)"
        end
        lines << "(error: standard error of the change; verdict: the change in errors, 2σ or more is real; " \
                 "\"noise\": within twice its error; \"not enough evidence\": within it, but near it or with too few samples " \
                 "to tell. Whether a growth is a leak or churn takes more snapshots: heapscope leaks)"
        lines.map { |l| Escape.terminal(l) }.join("\n")
      end

      # "grew 5.1σ", "noise 0.4σ", "not enough evidence 1.5σ", "grew exact" (no sampling error), "?".
      def self.verdict_text(row)
        return "?" if row["verdict"].nil?

        z = row["sigmas"]
        "#{row["verdict"]} #{z.nil? ? "exact" : format("%.1fσ", z.abs)}"
      end

      # A change is noise unless |change| > 2 * its standard error (about 95% of pure sampling
      # differences stay within that).
      def self.noise?(change, err)
        change.abs <= 2 * err
      end

      # The profiles' selections by labels ([base, newer] themselves without filters); Error when neither
      # has a matching sample.
      def self.select_both(base, newer, labels, base_path, new_path)
        picked = [Labels.select(base, labels), Labels.select(newer, labels)]
        if !labels.to_a.empty? && picked.all? { |p| p.samples.empty? }
          raise Labels.no_match([base, newer], labels, "#{base_path} and #{new_path}")
        end

        picked
      end

      # The flame graph of NEW coloured by growth since BASE (red grew, blue shrank); with labels, of
      # the matching samples only. Its label selectors (Flamegraph.add_label_views) show one value's diff.
      def self.html(base, newer, base_path:, new_path:, sample: nil, labels: [])
        ti = Sites.sample_index(newer, sample, new_path)
        Sites.sample_index(base, newer.sample_types[ti][0], base_path)
        base, newer = select_both(base, newer, labels, base_path, new_path)
        data = Flamegraph.tree([newer, base])
        data.merge!("types" => Flamegraph.types(newer), "type" => ti, "icicle" => false)
        Flamegraph.add_label_views(data, [newer, base], labels, ti)
        FlamegraphPage.render(
          data, title: "heapscope diff: #{File.basename(base_path)} -> #{File.basename(new_path)}",
                meta: "base #{base_path} (#{base.samples.size} samples), new #{new_path} (#{newer.samples.size} samples)" \
                      "#{Flamegraph.labels_note(data, labels)}",
                help: "Width is the new profile's value (switch to base with Width). Red frames grew since the " \
                      "base, blue ones shrank; the deeper the colour, the larger the change. Hover for base, new " \
                      "and change; click to zoom, Escape to reset.#{Flamegraph.capped_note(data)}"
        )
      end
    end
  end
end
