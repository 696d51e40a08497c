# frozen_string_literal: true

require "heapscope/report/command"
require "heapscope/report/census"

module Heapscope
  module Report
    # Top prints the sites holding (or allocating) the most, like `go tool pprof -top`, with human units
    # and the sampling error of each estimate.
    #
    #   heapscope top heap.pb.gz -n 10 --by line
    #         flat  flat%   sum%       cum   cum%   error  site
    #     8.0 MiB  80.1%  80.1%   8.0 MiB  80.1%     ±2%  Cache#store app/cache.rb:12
    class Top < Command
      DESCRIPTION = "Lists the sites holding (or allocating) the most in a profile, with the sampling error of each."
      USAGE = "usage: heapscope top FILE [-n 20] [--sample TYPE] [--by line|function|class|file|gem|label:KEY] " \
              "[--label KEY=VALUE]... [--cum] [--json] [--all] [--max-size SIZE]"

      def defaults
        { n: 20, by: "line" }
      end

      def options(parser, opts)
        limit_flag(parser, opts)
        sample_flag(parser, opts)
        by_flag(parser, opts)
        label_flag(parser, opts)
        parser.on("--cum", "sort by cumulative value (default: flat)") { opts[:cum] = true }
        parser.on("--json", "print JSON for machines") { opts[:json] = true }
        parser.on("--all", "also list sites whose flat and cum are both zero (hidden by default)") { opts[:all] = true }
      end

      def run(out)
        path = @args.first
        data = self.class.report(load_profile(path), path: path, **@opts.slice(:sample, :by, :cum, :n, :all, :labels))
        if @opts[:json]
          out.puts Escape.json(data)
        else
          out.puts self.class.text(data)
        end
        0
      end

      # Computes the table as a Hash (what --json prints): entries sorted by flat (or cum), largest first.
      # Sites whose flat and cum values of the type shown are both zero (a line whose objects all died,
      # in an inuse view) are left out and counted as hidden, unless all: true.
      #
      # labels: [Labels::Filter]; the rows are then those of the matching samples only, and percentages
      # stay shares of the whole profile's total (as `go tool pprof -tagfocus` shows them), so a row says
      # how much of the heap that line holds for that endpoint; selected_total is the selection's sum.
      #
      # pace: called at each step of the work over samples (see Sites.aggregate), or nil.
      def self.report(prof, path: "profile", sample: nil, by: "line", cum: false, n: 20, all: false, labels: [], pace: nil)
        whole = prof
        ti = Sites.sample_index(prof, sample, path)
        Labels.check_by([whole], by, path)
        prof = Labels.select(whole, labels)
        raise Labels.no_match([whole], labels, path) if !labels.to_a.empty? && prof.samples.empty?

        name, unit = prof.sample_types[ti]
        sampling = Sampling.new(prof)
        # cum of the type shown and of the types its object count and error are read from (pairs like
        # inuse_space and inuse_objects; see Sampling), not of every type: it is most of the work.
        stem = name.sub(/_(space|objects)\z/, "")
        objects_i = prof.sample_index(name.sub(/_space\z/, "_objects"))
        wanted = [ti, objects_i, prof.sample_index("#{stem}_objects"), prof.sample_index("#{stem}_space")].compact.uniq
        wanted |= wanted.flat_map { |i| sampling.variance_columns(i) } # their variance labels (and groups)
        # Sorted by flat, the rows read their count and error from flat, and only the cum value itself
        # from cum: the other columns' cum sums would be work for nothing (?debug=1 runs this on the
        # application's own threads).
        wanted = [ti] unless cum
        entries = Sites.aggregate(prof, by, cum: wanted, pace: pace).values
        shown = all ? entries : entries.reject { |e| e.flat[ti].zero? && e.cum[ti].zero? }
        hidden = entries.size - shown.size
        entries = shown
        total = whole.samples.sum do |s|
          pace&.call
          s.values[ti]
        end
        sort = cum ? :cum : :flat
        # With a census, no site reads above its classes' exact totals (Census#excess): rows are bounded,
        # then ranked, so a phantom never leads the table.
        census = Census.of(whole)
        # The whole profile's sums per class, read once: they find the classes over their totals (a
        # selection's are no larger) and make the census rows.
        at_sites = census && Census.at_sites(whole)
        excess = census ? census.excess(prof, by, ti, at_sites: at_sites) : {}
        value = ->(e, kind) { e.send(kind)[ti] - (excess.dig(e.key, kind) || 0) }
        entries.sort_by! { |e| [-value.call(e, sort), e.name] }
        sum = 0
        rows = entries.first(n).map do |e|
          flat = value.call(e, :flat)
          sum += flat
          bound = excess[e.key]
          {
            "name" => e.name, "function" => e.function, "file" => e.file, "line" => e.line,
            "flat" => flat, "flat_percent" => pct(flat, total), "sum_percent" => pct(sum, total),
            "cum" => value.call(e, :cum), "cum_percent" => pct(value.call(e, :cum), total),
            # The classes that bounded the row, and the estimates before (nil where nothing was bounded).
            "bounded_by" => bound && bound[:classes],
            "flat_estimate" => bound && bound[:flat].positive? ? e.flat[ti] : nil,
            "cum_estimate" => bound && bound[:cum].positive? ? e.cum[ti] : nil,
            "objects" => objects_i && e.send(sort)[objects_i],
            "samples" => sampling.samples(e.send(sort), ti)&.round(1),
            "relative_error" => Units.significant(sampling.relative_error(e.send(sort), ti)),
          }
        end
        {
          "file" => path, "sample_type" => name, "unit" => unit, "by" => by, "sort" => sort.to_s,
          "total" => total, "sampling" => sampling.describe, "sample_every" => sampling.sample_every,
          "memory" => memory(whole), "entries_total" => entries.size, "hidden_zero" => hidden, "entries" => rows,
          "labels" => Labels.summary([whole]), "label_filter" => Labels.filter_json(labels || []),
          "selected_total" => prof.equal?(whole) ? total : prof.samples.sum { |s| s.values[ti] },
          "census" => census&.report(whole, ti, sampling: Sampling.new(whole), at_sites: at_sites),
        }
      end

      # The memory breakdown (Heapscope::Memory) of the profile's process when it was taken, with the
      # profile's inuse totals as the profiled objects; nil for a profile without one.
      def self.memory(prof)
        Memory.of_profile(prof)&.transform_keys(&:to_s)
      end

      # Renders report's Hash as the text table. title: its first lines (?debug=1 names the process
      # and adds the profile's comments there instead of a file name).
      def self.text(data, title: "File: #{data["file"]}")
        unit = data["unit"]
        lines = Array(title).dup
        lines << "Type: #{data["sample_type"]}, by #{data["by"]}, sorted by #{data["sort"]}; #{data["sampling"]}"
        hidden = data["hidden_zero"].to_i
        keys = Labels.summary_text(data["labels"])
        lines << "Labels: #{keys}" if keys
        if (filter = data["label_filter"]) && !filter.empty?
          text = Labels.filter_text(filter)
          lines << "Selected: samples with #{text}: #{Units.format(data["selected_total"], unit)} " \
                   "(#{fmt_pct(pct(data["selected_total"], data["total"]))} of the total; percentages are of the total)"
        end
        lines << "Total: #{Units.format(data["total"], unit)}; showing #{data["entries"].size} of " \
                 "#{data["entries_total"]} sites#{hidden.positive? ? ", #{hidden} more at zero hidden (--all lists them)" : ""} " \
                 "(error: sampling error of the #{data["sort"]} value)"
        if data["memory"]
          lines.concat(Memory.report_lines(data["memory"].transform_keys(&:to_sym), size: ->(bytes) { Units.bytes(bytes) }))
        end
        lines.concat(Census.text(data["census"]))
        rows = [%w[flat flat% sum% cum cum% error site]]
        notes = []
        data["entries"].each do |e|
          flat_mark = e["flat_estimate"] ? "≤" : ""
          cum_mark = e["cum_estimate"] ? "≤" : ""
          rows << ["#{flat_mark}#{Units.format(e["flat"], unit)}", fmt_pct(e["flat_percent"]), fmt_pct(e["sum_percent"]),
                   "#{cum_mark}#{Units.format(e["cum"], unit)}", fmt_pct(e["cum_percent"]), e[data["sort"]].zero? ? "-" : Units.error(e["relative_error"]), e["name"]]
          notes << bound_note(e, unit) if e["bounded_by"]
        end
        lines.concat(Report.table(rows))
        lines << "(no samples)" if data["entries"].empty?
        lines.concat(notes)
        # Names come from the profile: no control character of theirs reaches the terminal.
        lines.map { |l| Escape.terminal(l) }.join("\n")
      end

      # The footnote of a row bounded by its classes' exact totals (the error column is the estimate's).
      def self.bound_note(entry, unit)
        names = entry["bounded_by"]
        whose = names.size == 1 ? "#{names[0]}'s exact total" : "the exact totals of #{names.join(", ")}"
        was = %w[flat cum].filter_map { |k| "#{k} #{Units.format(entry["#{k}_estimate"], unit)}" if entry["#{k}_estimate"] }
        "≤ #{entry["name"]}: bounded by #{whose} (census); the estimate was #{was.join(", ")}"
      end

      def self.pct(part, total)
        total.zero? ? nil : (100.0 * part / total).round(2)
      end

      def self.fmt_pct(v)
        v.nil? ? "-" : format("%.1f%%", v)
      end
    end
  end
end
