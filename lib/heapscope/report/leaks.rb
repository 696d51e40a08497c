# frozen_string_literal: true

require "time"
require "heapscope/report/command"
require "heapscope/report/verdict"
require "heapscope/report/persistence"

module Heapscope
  module Report
    # Leaks reads a series of heap profiles of one process (files, or a directory of periodic profiles)
    # and ranks the sites whose live bytes keep growing.
    #
    #   heapscope leaks /var/tmp/heapscope/        # every *.pb.gz in it, ordered by profile time
    #
    # For each site (grouped as in top), over time:
    #   rate     the least-squares slope of its live value, per minute, with its standard error (each
    #            point's sampling error propagated, widened by the scatter when that exceeds them).
    #   verdict  leak, churn, noise or not enough evidence, with its confidence (the slope in standard
    #            errors; for churn the scatter in errors), and for the undecided what would decide them:
    #            how many more snapshots, or which sample_every (Report::Verdict has the statistics).
    #   steady   the share of intervals in which it grew (shown, not judged by: with few samples a real
    #            leak's points go down now and then).
    #   age      its live bytes by gc_age label (GCs survived) in the newest profile. Old and growing is the
    #            signature of a leak; young and growing is a backlog or churn.
    # Leaks come first, by rate, then the undecided by how close they are to a verdict, then churn and
    # noise. So a steady leak ranks above a bigger one-off step and above churn.
    class Leaks < Command
      DESCRIPTION = "Follows a live value (default inuse_space) through a series of profiles of one process and lists the sites that keep growing."
      USAGE = "usage: heapscope leaks FILE... | DIR [--sample TYPE] [--by line|function|class|file|gem|label:KEY] " \
              "[--label KEY=VALUE]... [-n 20] [--json] [--max-size SIZE]"
      # Matched against file names as bytes (/n): a name that is not UTF-8 must not stop the match.
      PROFILE_FILE = /\.(pb\.gz|pb|pprof|prof)\z/n.freeze
      # Objects that survived this many GCs count as old (Ruby promotes objects to the old generation
      # after 3).
      OLD_AGE = 4
      YOUNG = "mostly young objects (under #{OLD_AGE} GCs): a backlog that drains grows like this too"
      # The order of the verdicts in the table.
      ORDER = { Verdict::LEAK => 0, Verdict::UNCLEAR => 1, Verdict::CHURN => 2, Verdict::NOISE => 3 }.freeze

      def defaults
        { n: 20, by: "line", sample: "inuse_space" }
      end

      def options(parser, opts)
        parser.on("--sample TYPE", "the live value to follow (default: inuse_space)") { |v| opts[:sample] = v }
        by_flag(parser, opts)
        label_flag(parser, opts)
        limit_flag(parser, opts)
        parser.on("--json", "print JSON for machines") { opts[:json] = true }
      end

      def check_args(args)
        super(args, min: 1, max: nil, what: "profiles (FILE... or DIR)")
      end

      def run(out)
        paths, note = self.class.expand(@args)
        series = paths.map { |p| [p, load_profile(p)] }
        data = self.class.report(series, **@opts.slice(:sample, :by, :n, :labels))
        data["note"] = note if note
        out.puts(@opts[:json] ? Escape.json(data) : self.class.text(data))
        0
      end

      # The periodic writer's file names: APP-PID-YYYYMMDDTHHMMSS.mmmZ.heap.pb.gz (or -final.heap.pb.gz).
      PERIODIC_NAME = /\A(?<process>.+-\d+)-\d{8}T\d{6}(\.\d+)?Z(-final)?\.heap\.pb\.gz\z/n.freeze

      # Turns the arguments into profile paths: a directory contributes its profile files, those of one
      # process (the one with the newest profile) if the periodic writer's names show several. Returns
      # [paths, note or nil].
      def self.expand(args)
        note = nil
        paths = args.flat_map do |a|
          if ProfileUrl.url?(a)
            [a] # fetched in the order given (Command#load_profile): the same URL twice is two snapshots
          elsif File.directory?(a)
            found = begin
              Dir.children(a)
            rescue SystemCallError => e
              raise Error, "#{a}: #{e.message.sub(/ @ .*/, "")}"
            end
            # Regular files only: a FIFO named like a profile would block the open forever, and a
            # device could be endless (a path given by name may still be a pipe, as /dev/stdin).
            found = found.reject { |f| f.start_with?(".") }.select { |f| f.b.match?(PROFILE_FILE) }
            found = found.select { |f| File.file?(File.join(a, f)) }.sort
            raise Error, "#{a}: no profiles (*.pb.gz, *.pb, *.pprof) in this directory" if found.empty?

            found, note = one_process(a, found)
            found.map { |f| File.join(a, f) }
          elsif File.exist?(a)
            [a]
          else
            raise Error, "#{a}: no such file"
          end
        end
        raise Error, "need at least 2 profiles to see growth, got #{paths.size}" if paths.size < 2

        [paths, note]
      end

      def self.one_process(dir, names)
        groups = names.group_by { |f| f.b[PERIODIC_NAME, :process] }
        return [names, nil] if groups.size < 2 || groups.key?(nil)

        newest = groups.max_by { |_, files| files.map { |f| mtime(File.join(dir, f)) }.max }
        [newest[1], "#{dir} holds profiles of #{groups.size} processes; using #{newest[0]}'s (the newest). " \
                    "Pass files to choose another."]
      end

      # series: [[path, Profile]]. Returns the ranking as a Hash (what --json prints).
      #
      # labels: [Labels::Filter]; each profile is then read as its matching samples only (a profile where
      # none match counts as zero for every site: the endpoint had not run yet). Error when no profile
      # of the series has a matching sample.
      def self.report(series, sample: "inuse_space", by: "line", n: 20, labels: [])
        wholes = series.map { |_, prof| prof }
        Labels.check_by(wholes, by, "the series")
        points = series.map do |path, prof|
          ti = Sites.sample_index(prof, sample, path)
          t = prof.time_nanos.to_i.positive? ? prof.time_nanos / 1e9 : mtime(path)
          { path: path, prof: Labels.select(prof, labels), ti: ti, time: t, by: by }
        end
        if !labels.to_a.empty? && points.all? { |p| p[:prof].samples.empty? }
          raise Labels.no_match(wholes, labels, "the series (#{points.size} profiles)")
        end
        points.sort_by! { |p| [p[:time], p[:path]] }
        if points.map { |p| p[:time] }.uniq.size < 2
          raise Error, "the profiles all have the same time; cannot compute a growth rate"
        end

        name, unit = points.last[:prof].sample_types[points.last[:ti]]
        times = points.map { |p| (p[:time] - points.first[:time]) / 60.0 } # minutes since the first
        sites = {}
        points.each_with_index do |p, k|
          site_values(p[:prof], by, p[:ti]) do |key, e, value, error, parts|
            s = sites[key] ||= { key: key, entry: e, values: Array.new(points.size, 0), errors: Array.new(points.size, 0.0),
                                 parts: Array.new(points.size) }
            s[:values][k] = value
            s[:errors][k] = error
            s[:parts][k] = parts
          end
        end
        ages = age_distribution(points.last, by)
        one_run = Persistence.fill(points, times, sites)

        last_sampling = Sampling.new(points.last[:prof])
        every = last_sampling.rate_lowered? ? last_sampling.current_sample_every : last_sampling.sample_every
        rows = rank(sites, times, every: every, unit: unit, ages: ages)
        {
          "profiles" => points.map { |p| { "file" => p[:path], "time" => Time.at(p[:time]).utc.iso8601 } },
          "minutes" => times.last.round(3), "sample_type" => name, "unit" => unit, "by" => by,
          "sampling" => Sampling.new(points.last[:prof]).describe, "old_age" => OLD_AGE,
          "growing_total" => rows.size, "sites" => rows.first(n), "one_run" => one_run,
          "labels" => Labels.summary(wholes), "label_filter" => Labels.filter_json(labels || []),
        }
      end

      # Yields key, entry, value, its 1σ error (nil when unknown) and its parts by variance group (nil
      # without them) for every site of prof grouped by by, of sample type index ti: one point of a
      # site's series (here, and in `heapscope ui`'s summaries).
      #
      # ages: a Persistence::AgeColumns, whose split of each site's value and variance by gc_age is then
      # yielded too, from the same aggregation (`heapscope ui`'s summaries).
      def self.site_values(prof, by, ti, sampling: Sampling.new(prof), ages: nil)
        groups = sampling.live_design ? sampling.variance_columns(ti).drop(1) : []
        Sites.aggregate(prof, by, cum: [], columns: ages&.columns).each do |key, e|
          parts = groups.empty? ? nil : e.flat.values_at(*groups).map(&:to_f)
          yield key, e, e.flat[ti], sampling.absolute_error(e.flat, ti), parts, ages&.of(e.flat)
        end
      end

      # The growing sites of a series, leaks first (the table's rows, as Hashes). sites: {key => {entry:
      # (name, function, file, line), values: [live value per point], errors: [its 1σ error per point]}};
      # times: minutes since the first point; every: the sample_every of the newest point; ages: {key =>
      # {gc_age bucket => value}} (may be empty). `heapscope ui` ranks its summaries of a folder with it.
      def self.rank(sites, times, every:, unit:, ages: {})
        intervals = times.size - 1
        rows = sites.map do |key, s|
          growth = s[:values].last - s[:values].first
          next if growth <= 0 # cheap, and such a site is left out below anyway: no trend to fit

          trend = Verdict.trend(times, s[:values], s[:errors], every: every, unit: unit, slope_variance: s[:slope_variance])
          rises = s[:values].each_cons(2).count { |a, b| b > a }
          steady = rises.to_f / intervals
          next if trend[:rate] <= 0

          age = ages[key] || {}
          old = age.sum { |bucket, v| bucket >= OLD_AGE ? v : 0 }
          age_total = age.values.sum
          old_share = age_total.positive? ? old.to_f / age_total : nil
          last_err = s[:errors].last
          e = s[:entry]
          {
            "name" => e.name, "function" => e.function, "file" => e.file, "line" => e.line,
            "rate_per_minute" => trend[:rate].round(3), "rate_error" => trend[:rate_error]&.round(3),
            "r_squared" => r_squared(times, s[:values], trend[:rate]), "rises" => rises, "intervals" => intervals,
            "steady" => steady.round(4), "score" => (trend[:rate] * steady).round(3),
            "first" => s[:values].first, "last" => s[:values].last, "growth" => growth,
            "last_relative_error" => last_err && s[:values].last.positive? ? Units.significant(last_err / s[:values].last) : nil,
            "values" => s[:values],
            "gc_age" => age.sort.to_h { |b, v| [b.to_s, v] }, "old_share" => old_share&.round(4),
            "verdict" => trend[:verdict], "trend_sigmas" => Verdict.sigmas(trend[:z]),
            "scatter" => trend[:scatter]&.finite? ? Units.significant(trend[:scatter]) : nil, "shape" => trend[:shape],
            "objects" => age_note(trend[:verdict], old_share), "advice" => trend[:advice],
            "more_snapshots" => trend[:more_snapshots], "advice_sample_every" => trend[:sample_every],
          }
        end.compact
        # Leaks first (by rate), then the undecided (by their trend's strength), churn, noise: a big
        # one-off step must not hide a slow leak, and the next snapshots should go to the undecided.
        rows.sort_by! { |r| [ORDER.fetch(r["verdict"]), r["verdict"] == Verdict::UNCLEAR ? -(r["trend_sigmas"] || 0) : -r["rate_per_minute"], r["name"]] }
      end

      # {site key => {gc_age bucket => value}} of the newest profile (empty without gc_age labels): its
      # ages as Persistence splits them (power-of-two buckets, which heapscope's labels already are; no
      # GC age is negative, such a label counts as 0), in one aggregation, shared with Persistence.fill.
      def self.age_distribution(point, by)
        point[:by] ||= by
        Persistence.point_ages(point).transform_values { |parts| parts.transform_values(&:first) }
      end

      # R² of the least-squares line through (t, y) with slope rate; nil for a constant series.
      def self.r_squared(t, y, rate)
        tm = t.sum / t.size
        ym = y.sum.to_f / y.size
        ss_tot = y.sum { |v| (v - ym)**2 }
        return nil if ss_tot.zero?

        ss_res = t.each_index.sum { |i| (y[i] - ym - rate * (t[i] - tm))**2 }
        (1 - ss_res / ss_tot).round(4)
      end

      # What the ages add to a verdict: a leak of young objects may be a backlog that drains (a queue,
      # requests in flight); nil without gc_age labels (Go profiles) or for a site that is not growing.
      def self.age_note(verdict, old_share)
        return nil if old_share.nil? || ![Verdict::LEAK, Verdict::UNCLEAR].include?(verdict)

        old_share >= 0.5 ? "old" : "young"
      end

      def self.mtime(path)
        File.mtime(path).to_f
      rescue SystemCallError
        0.0
      end

      # Renders report's Hash as text.
      def self.text(data)
        unit = data["unit"]
        first = data["profiles"].first
        last = data["profiles"].last
        lines = ["Profiles: #{data["profiles"].size} from #{first["time"]} to #{last["time"]} " \
                 "(#{duration(data["minutes"])}); #{data["sample_type"]} by #{data["by"]}; #{data["sampling"]}"]
        lines << "Note: #{data["note"]}" if data["note"]
        keys = Labels.summary_text(data["labels"])
        lines << "Labels: #{keys}" if keys
        if (filter = data["label_filter"]) && !filter.empty?
          lines << "Selected: samples with #{Labels.filter_text(filter)} in every profile"
        end
        if data["sites"].empty?
          lines << "No site grew across the series."
          return lines.map { |l| Escape.terminal(l) }.join("\n")
        end
        lines << "Growing sites: #{data["growing_total"]}; leaks first, by rate"
        table = [["rate/min", "error", "steady", "live now", "error", "age (GCs: share)", "verdict", "site"]]
        data["sites"].each do |r|
          rate_err = r["rate_error"] && r["rate_per_minute"].positive? ? r["rate_error"] / r["rate_per_minute"] : nil
          table << [Units.signed(r["rate_per_minute"].round, unit), Units.error(rate_err),
                    "#{r["rises"]}/#{r["intervals"]}", Units.format(r["last"], unit), Units.error(r["last_relative_error"]),
                    age_text(r["gc_age"]), verdict_text(r), r["name"]]
        end
        lines.concat(Report.table(table))
        advised = data["sites"].select { |r| r["advice"] || r["objects"] == "young" }
        unless advised.empty?
          lines << ""
          lines << "To decide:"
          advised.each do |r|
            said = [r["advice"], r["objects"] == "young" ? YOUNG : nil]
            lines << "  #{r["name"]}: #{said.compact.join("; ")}"
          end
        end
        lines << ""
        lines << "verdict: leak = grows beyond its error (the slope in standard errors, 2σ or more); churn = moves " \
                 "beyond its error without a trend; noise = within its error; not enough evidence = neither yet."
        lines << "steady: intervals in which the site grew. age: share of its live #{data["sample_type"]} by GCs " \
                 "survived (old = #{data["old_age"]}+). error: sampling (and fit) error."
        lines.map { |l| Escape.terminal(l) }.join("\n")
      end

      # "leak 8.1σ", "churn 5.2x error" (up and down), "churn (grew once)", "noise 0.4σ", "not enough evidence 1.3σ".
      def self.verdict_text(row)
        z = row["trend_sigmas"]
        z_text = z.nil? && row["rate_error"]&.zero? ? "exact" : Verdict.sigma_text(z)
        case row["verdict"]
        when Verdict::CHURN
          if row["shape"] == "grew once" then "churn (grew once)"
          else row["scatter"] ? "churn #{format("%.1f", row["scatter"])}x error" : "churn"
          end
        else "#{row["verdict"]} #{z_text}"
        end
      end

      def self.duration(minutes)
        minutes < 1 ? format("%.1f s", minutes * 60) : format("%.1f min", minutes)
      end

      def self.age_text(ages)
        total = ages.values.sum
        return "-" if total <= 0

        ages.map { |b, v| "#{b}:#{(100.0 * v / total).round}%" }.join(" ")
      end
    end
  end
end
