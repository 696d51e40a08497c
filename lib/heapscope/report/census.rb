# frozen_string_literal: true

require "heapscope/report/units"
require "heapscope/report/sampling"
require "heapscope/report/sites"

module Heapscope
  module Report
    # Census reads the exact count of the live heap that heapscope takes at every snapshot (comment lines
    # "heapscope census...", written by ext/heapscope/census.c) and sets the profile's estimates beside
    # it. A profile knows only its samples; the census knows what is alive, so together they say how much
    # of each class no sampled site accounts for ("not seen at any site"), and bound a site's estimate by
    # its class's exact total, so a sampled 1 MiB Thread never reads as 1000 MiB beside a 114 MiB RSS.
    #
    #   heapscope census: seconds=0.004210 objects=123456 bytes=9876543 classes=812 classes_listed=40 bounded_samples=2 min_age=0
    #   heapscope census type: objects=45678 bytes=3456789 name=T_STRING
    #   heapscope census class: objects=45000 bytes=3400000 type=T_STRING name=String
    #
    # A class line's name is last and runs to the end of the line: it is the samples' class label,
    # spaces and all. The lines come from a profile, which may be anyone's: at most MAX_LINES census
    # lines are read, a number has at most 20 digits, and a line that does not parse is counted and
    # ignored. Profiles without a census (older ones, Go's, deltas) give nil and every report reads as before.
    class Census
      PREFIX = "heapscope census"
      # The sum of the objects' sizes squared (census.h), "%.6e": absent from the first census lines.
      SQ = "(?: sq_bytes=(\\d\\.\\d{1,6}e[+-]\\d{2,3}))?"
      HEADER = /\Aheapscope census: seconds=(\d{1,20}(?:\.\d{1,20})?) objects=(\d{1,20}) bytes=(\d{1,20}) classes=(\d{1,20}) classes_listed=(\d{1,20}) bounded_samples=(\d{1,20})(?: min_age=(\d{1,20}))?#{SQ}\z/.freeze
      TYPE = /\Aheapscope census type: objects=(\d{1,20}) bytes=(\d{1,20})#{SQ} name=(T_[A-Z_]{1,24})\z/.freeze
      CLASS = /\Aheapscope census class: objects=(\d{1,20}) bytes=(\d{1,20})#{SQ} type=(T_[A-Z_]{1,24}) name=(.+)\z/.freeze
      # The profile's own min_age, in its settings line ("... max_frames=N min_age=N ..."), not the census's.
      MIN_AGE = /\bmin_age=(\d{1,20})(?!\d)/.freeze
      # The writer lists every sampled class plus 40 others; a profile with more census lines than this
      # is not one heapscope wrote, and reading it further would only cost time.
      MAX_LINES = 100_000
      MAX_LINE = 8192 # characters: a class name longer than this is no name a program gave
      SHOWN = 10 # class (and type) rows shown, the largest by exact value, besides the bounded ones
      OTHER = "other classes"

      attr_reader :seconds, :objects, :bytes, :classes, :classes_listed, :bounded_samples, :min_age,
                  :profile_min_age, :types, :class_totals, :ignored

      # The census of a decoded profile, or nil when it has none (or one that does not add up).
      def self.of(prof)
        parse(prof.comments)
      end

      # Parses comment lines; nil without a valid header line. types: {name => [objects, bytes]};
      # class_totals: {name => [type, objects, bytes]} (a name listed twice is summed: samples with one
      # label cannot be told apart anyway).
      def self.parse(comments)
        census = new
        census.read(comments) ? census : nil
      end

      def initialize
        @types = {}
        @class_totals = {}
        @ignored = 0
        @profile_min_age = 0
      end

      # Reads the lines; false when there is no usable header.
      def read(comments)
        header = nil
        seen = 0
        comments.each do |c|
          unless c.start_with?(PREFIX)
            # The settings line says the profile's min_age (a profile without one is taken as 0).
            m = c.match(MIN_AGE) and @profile_min_age = m[1].to_i
            next
          end
          seen += 1
          if seen > MAX_LINES || c.size > MAX_LINE
            @ignored += 1
            next
          end
          if (m = HEADER.match(c))
            header ||= m
          elsif (m = CLASS.match(c))
            t = @class_totals[m[5]] ||= [m[4], 0, 0, 0.0]
            t[1] += m[1].to_i
            t[2] += m[2].to_i
            t[3] = m[3] && t[3] ? t[3] + m[3].to_f : nil
          elsif (m = TYPE.match(c))
            t = @types[m[4]] ||= [0, 0, 0.0]
            t[0] += m[1].to_i
            t[1] += m[2].to_i
            t[2] = m[3] && t[2] ? t[2] + m[3].to_f : nil
          else
            @ignored += 1
          end
        end
        return false unless header

        @seconds = header[1].to_f
        @objects, @bytes, @classes, @classes_listed, @bounded_samples = header[2..6].map(&:to_i)
        @min_age = header[7].to_i
        @sq_bytes = header[8]&.to_f
        # Listed classes beyond the totals: the lines contradict each other and no row could add up.
        @class_totals.values.sum { |t| t[1] } <= @objects && @class_totals.values.sum { |t| t[2] } <= @bytes
      end

      # Which exact figure a sample type compares with: 1 for inuse_objects, 2 for inuse_space, nil for
      # any other type (allocations are not what is alive).
      def self.column(type_name)
        { "inuse_objects" => 1, "inuse_space" => 2 }[type_name]
      end

      # The exact total of a class for a type name, or nil (not listed, or not an inuse type).
      def exact(class_name, type_name)
        col = Census.column(type_name) or return nil
        @class_totals[class_name]&.at(col)
      end

      def total(type_name)
        col = Census.column(type_name) or return nil
        col == 1 ? @objects : @bytes
      end

      # The excess of sites over their classes' exact totals, for bounding a report's rows: the classes
      # whose sampled sum exceeds its exact total are the only ones that can make a site exceed it, so
      # only their samples are grouped again by the report's grouping (by). Returns {row key =>
      # {flat:, cum:, classes: [names]}} (excess in the unit of type ti), empty when nothing exceeds.
      def excess(prof, by, ti, at_sites: Census.at_sites(prof))
        name = prof.sample_types[ti][0]
        over = at_sites.filter_map { |c, e| c.is_a?(String) && (x = exact(c, name)) && e.flat[ti] > x ? [c, x] : nil }.to_h
        return {} if over.empty?

        samples = Hash.new { |h, k| h[k] = [] }
        prof.samples.each do |s|
          c = s.labels["class"]
          samples[c] << s if c.is_a?(String) && over.key?(c)
        end
        out = {}
        over.each do |c, x|
          Sites.aggregate(prof, by, samples: samples[c], cum: [ti]).each do |key, e|
            flat = [e.flat[ti] - x, 0].max
            cum = [e.cum[ti] - x, 0].max
            next if flat.zero? && cum.zero?

            row = out[key] ||= { flat: 0, cum: 0, classes: [] }
            row[:flat] += flat
            row[:cum] += cum
            row[:classes] << c
          end
        end
        out
      end

      # The profile's samples summed per class label, with their variance columns (Sites' --by class).
      def self.at_sites(prof)
        Sites.aggregate(prof, "class", cum: [])
      end

      # The rows for the type at index ti, as a Hash for JSON and text; nil when the type is not an inuse
      # one. Every class of class C counts as one site, so its error is a site's (Sampling).
      def report(prof, ti, sampling: Sampling.new(prof), at_sites: Census.at_sites(prof))
        name, unit = prof.sample_types[ti]
        col = Census.column(name) or return nil

        data = {
          "seconds" => @seconds, "objects" => @objects, "bytes" => @bytes, "classes" => @classes,
          "classes_listed" => @classes_listed, "bounded_samples" => @bounded_samples, "min_age" => @profile_min_age,
          "ignored_lines" => @ignored, "sample_type" => name, "unit" => unit, "total" => total(name),
        }
        # The default min_age is 1: sites leave out objects younger than that, the census counts every
        # age, so the young ones are part of what no site shows (exact, not an error: the row's ± is the
        # sites' sampling error alone).
        if @profile_min_age.positive?
          data["note"] = "sites leave out objects younger than min_age=#{@profile_min_age} GC#{@profile_min_age == 1 ? "" : "s"}; " \
                         "the census counts every age, so \"not seen at any site\" includes them"
        end

        row = row_maker(ti, col, sampling, at_sites)
        listed = @class_totals.map do |c, (type, *totals)|
          e = at_sites[c]
          row.call(c, totals, e ? [e.flat] : []).merge("type" => type)
        end
        listed.sort_by! { |r| [-r["exact"], r["name"]] }
        shown = listed.first(SHOWN) + listed.drop(SHOWN).select { |r| r["not_seen"].negative? }
        rest = listed - shown
        # Samples of classes the census does not list (a label-less sample, a list cut short) are sites
        # of "other classes" too: the rows then add up to the totals, exact and sampled alike.
        unlisted = at_sites.reject { |k, _| k.is_a?(String) && @class_totals.key?(k) }.values.map(&:flat)
        rest_vectors = rest.filter_map { |r| at_sites[r["name"]]&.flat } + unlisted
        shown_totals = shown.map { |r| @class_totals[r["name"]].drop(1) }
        other_sq = @sq_bytes && shown_totals.all? { |t| t[2] } ? [@sq_bytes - shown_totals.sum { |t| t[2] }, 0.0].max : nil
        other_sq = [other_sq - exact_sq(sampling, rest.map { |r| r["name"] }), 0.0].max if other_sq
        other = row.call(OTHER, [@objects - shown_totals.sum { |t| t[0] }, @bytes - shown_totals.sum { |t| t[1] }, other_sq],
                         rest_vectors)
        other["count"] = @classes - shown.size if @classes >= shown.size
        data["rows"] = shown
        data["other"] = other
        data["types"] = type_rows(at_sites, col, row, sampling)
        data
      end

      # One class's row for the type at index ti, as in report's rows (nil when the census does not list
      # the class or the type is not an inuse one): what the accuracy suite checks a site's class by.
      def class_row(prof, ti, name, sampling: Sampling.new(prof), at_sites: Census.at_sites(prof))
        col = Census.column(prof.sample_types[ti][0]) or return nil
        entry = @class_totals[name] or return nil
        type, *totals = entry
        e = at_sites[name]
        row_maker(ti, col, sampling, at_sites).call(name, totals, e ? [e.flat] : []).merge("type" => type)
      end

      # One builtin type's row (T_STRING...) for the type at index ti, or nil; as report's "types" rows.
      def type_row(prof, ti, type, sampling: Sampling.new(prof), at_sites: Census.at_sites(prof))
        col = Census.column(prof.sample_types[ti][0]) or return nil
        @types.key?(type) or return nil
        type_rows(at_sites, col, row_maker(ti, col, sampling, at_sites), sampling, only: type).first
      end

      # A callable (label, [objects, bytes, sq_bytes] exact, the sites' value vectors) -> a row: the exact
      # value, the sites' sum, the remainder "not seen at any site" and its error.
      def row_maker(ti, col, sampling, at_sites)
        width = at_sites.empty? ? 0 : at_sites.first[1].flat.size
        zero = Array.new(width, 0)
        floor = census_error(sampling, col)
        lambda do |label, totals, vectors|
          sum = zero.dup
          vectors.each { |v| Sites.add(sum, v) }
          at = sum[ti] || 0
          exact = totals[col - 1]
          # No vectors (a profile without samples): nothing sampled, no sampling error.
          sampled = vectors.empty? ? 0.0 : sampling.absolute_error(sum, ti)
          { "name" => label, "exact" => exact, "at_sites" => at, "not_seen" => exact - at,
            "error" => [sampled, floor.call(*totals, label)].compact.max }
        end
      end
      private :row_maker

      # The squared bytes of the listed classes among names that are recorded whole: nothing of them is
      # unseen by chance, so they take no part in a row's census error (a Thread's 1 MiB stack squared
      # made the T_DATA row's error 90 MiB).
      def exact_sq(sampling, names)
        names.sum { |c| sampling.exact_classes.include?(c) && (t = @class_totals[c]) ? t[3].to_f : 0.0 }
      end

      # The error the census alone gives what no site saw, as a callable of a row's exact [objects, bytes,
      # sq_bytes] (nil where unknown or not needed). Sampling each object with probability 1/w, the sites'
      # sum of a class's bytes has variance (w - 1) x sq_bytes: exact for sampling: always, a lower bound
      # for windowed sampling (windows add their clustering), and too wide by what objects from before
      # Heapscope.start add (never sampled, but in the census). The samples' own error misses what the
      # samples never saw: 100 unsampled 40 KiB Strings beside 150,000 sampled small ones gave +-0.5 MiB
      # for a remainder 3.4 MiB off (bench/census_coverage.rb). Bytes rows take the larger of the two;
      # objects rows keep the samples' own (every object counts 1: no unseen giant among them). A focused
      # class's row takes its own rate (a class sampled 1 in 1 leaves nothing unseen); other rows the
      # profile's.
      def census_error(sampling, col)
        w = [sampling.sample_every, sampling.current_sample_every].compact.max
        lambda do |_objects, _bytes, sq = nil, label = nil|
          rate = sampling.exact_classes.include?(label) ? 1 : sampling.focus_rates[label] || w
          next nil unless col == 2 && sq && rate && rate > 1

          Math.sqrt((rate - 1) * sq)
        end
      end

      # One row per builtin type: a type's sites are those of the classes whose line names that type.
      def type_rows(at_sites, col, row, sampling, only: nil)
        by_type = Hash.new { |h, k| h[k] = [] }
        exact = Hash.new { |h, k| h[k] = [] }
        @class_totals.each do |c, (type, *)|
          e = at_sites[c] and by_type[type] << e.flat
          exact[type] << c if sampling.exact_classes.include?(c)
        end
        rows = (only ? @types.slice(only) : @types).map do |t, totals|
          totals = [*totals.first(2), [totals[2] - exact_sq(sampling, exact[t]), 0.0].max] if totals[2] && exact.key?(t)
          row.call(t, totals, by_type[t])
        end
        rows.sort_by! { |r| [-r["exact"], r["name"]] }
        rows.first(SHOWN)
      end

      # Text lines for a report's data (nil: none). Errors are one standard error, as every heapscope
      # report prints them.
      def self.text(data)
        return [] unless data

        unit = data["unit"]
        lines = ["exact totals (census, #{format("%.1f", data["seconds"] * 1000)} ms): #{delimit(data["objects"])} objects, " \
                 "#{Units.bytes(data["bytes"])} in #{delimit(data["classes"])} classes" \
                 "#{data["bounded_samples"].positive? ? "; #{plural(data["bounded_samples"], "sample")} capped at #{data["bounded_samples"] == 1 ? "its" : "their"} class's exact total when written (over 4x it)" : ""}" \
                 "#{data["ignored_lines"].positive? ? "; #{plural(data["ignored_lines"], "malformed census line")} ignored" : ""}"]
        lines << "  #{data["note"]}" if data["note"]

        rows = [[data["sample_type"], "exact", "at sites", "not seen at any site"]]
        data["rows"].each { |r| rows << cells(r, unit, r["name"]) }
        other = data["other"]
        rows << cells(other, unit, other["count"] ? "#{OTHER} (#{delimit(other["count"])})" : OTHER)
        rows << ["by type", "", "", ""]
        data["types"].each { |r| rows << cells(r, unit, r["name"]) }
        lines.concat(align(rows))
      end

      # Columns: the name left-aligned, the numbers right-aligned, the last (the remainder) as is.
      def self.align(rows)
        widths = rows.transpose.map { |col| col.map(&:size).max }
        rows.map do |r|
          "  #{r[0].ljust(widths[0])}  #{r[1].rjust(widths[1])}  #{r[2].rjust(widths[2])}  #{r[3]}".rstrip
        end
      end

      def self.cells(r, unit, name)
        not_seen =
          if r["not_seen"].negative?
            "sites' estimates exceed the exact total by #{Units.format(-r["not_seen"], unit)} " \
              "(#{Units.abs_error(r["error"], unit)}: sampling error)"
          elsif r["at_sites"].zero? && r["error"]&.zero?
            Units.format(r["not_seen"], unit) # no site: nothing sampled, nothing uncertain
          else
            "#{Units.format(r["not_seen"], unit)} #{Units.abs_error(r["error"], unit)}"
          end
        [name, Units.format(r["exact"], unit), Units.format(r["at_sites"], unit), not_seen]
      end

      def self.plural(n, word)
        "#{delimit(n)} #{word}#{n == 1 ? "" : "s"}"
      end

      # 123456 -> "123,456".
      def self.delimit(n)
        n.to_s.reverse.scan(/\d{1,3}/).join(",").reverse
      end
    end
  end
end
