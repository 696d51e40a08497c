# frozen_string_literal: true

require "heapscope/report/command"
require "heapscope/report/leaks"

module Heapscope
  module UI
    # SiteTable numbers the sites (by line) met in any profile, so that a summary holds small integers
    # instead of a key and four strings per site: 500 summaries of 5,000 sites are then three arrays of
    # numbers each, not 2.5 million hashes.
    class SiteTable
      Site = Struct.new(:name, :function, :file, :line)

      def initialize
        @ids = {}
        @sites = []
        @lock = Mutex.new
      end

      # The id of entry's site (a Report::Sites::Entry), numbering it on first sight.
      def id(key, entry)
        @ids[key] || @lock.synchronize do
          @ids[key] ||= begin
            @sites << Site.new(entry.name, entry.function, entry.file, entry.line).freeze
            @sites.size - 1
          end
        end
      end

      def [](id)
        @sites[id]
      end
    end

    # Summary is what the timeline keeps of one snapshot: its time, the total live bytes, the sampling
    # rate, the memory breakdown (Heapscope::Memory) and, for every site with live bytes, its value and
    # 1σ error (parallel arrays of site ids, values and errors). Whole profiles are read again only when
    # a page needs one (top table, flame graph, diff), so memory stays bounded by the summaries.
    #
    # ids are sorted, so a site's value is a binary search away; top holds the ids of the TOP largest
    # sites: the timeline draws the sites that are ever in a snapshot's top list, found without a pass
    # over every site of every snapshot.
    Summary = Struct.new(:time, :total, :total_error, :unit, :every, :memory, :ids, :values, :errors, :top,
                         keyword_init: true) do
      # [value, 1σ error] of site id in this snapshot; [0, 0.0] when it held nothing then.
      def at(id)
        i = ids.bsearch_index { |x| x >= id }
        i && ids[i] == id ? [values[i], errors[i]] : [0, 0.0]
      end
    end

    module Summarize
      SAMPLE = "inuse_space"
      # Sites per snapshot that may be drawn (the chart shows about 10 of their union).
      TOP = 20

      module_function

      # Summarizes a decoded profile. fallback_time: seconds, used when the profile has no time of its own
      # (the file's mtime, or when a URL was fetched). Raises Report::Error for a profile without live
      # bytes (an alloc-only or CPU profile: nothing to follow over time).
      def call(prof, table, name:, fallback_time:)
        ti = Report::Sites.sample_index(prof, SAMPLE, name)
        unit = prof.sample_types[ti][1]
        rows = []
        Report::Leaks.site_values(prof, "line", ti) do |key, entry, value, error|
          rows << [table.id(key, entry), value, (error || 0.0).to_f] unless value.zero?
        end
        rows.sort_by!(&:first)
        sampling = Report::Sampling.new(prof)
        Summary.new(
          time: prof.time_nanos.to_i.positive? ? prof.time_nanos / 1e9 : fallback_time,
          total: prof.samples.sum { |s| s.values[ti] }, unit: unit,
          # Sites are independent estimates: their errors add in quadrature.
          total_error: Math.sqrt(rows.sum { |r| r[2]**2 }),
          every: sampling.rate_lowered? ? sampling.current_sample_every : sampling.sample_every,
          memory: Memory.of_profile(prof)&.transform_keys(&:to_s),
          ids: rows.map(&:first), values: rows.map { |r| r[1] }, errors: rows.map(&:last),
          top: rows.max_by(TOP) { |r| r[1] }.map(&:first)
        )
      end
    end
  end
end
