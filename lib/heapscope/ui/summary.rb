# frozen_string_literal: true

require "heapscope/report/command"
require "heapscope/report/leaks"
require "heapscope/report/persistence"

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
        @keys = []
        @lock = Mutex.new
      end

      # The id of the site key (Report::Sites' row key) named by entry (name, function, file, line: a
      # Report::Sites::Entry or a Site), numbering it on first sight.
      def id(key, entry)
        @ids[key] || @lock.synchronize do
          @ids[key] ||= begin
            @sites << Site.new(entry.name, entry.function, entry.file, entry.line).freeze
            @keys << key
            @sites.size - 1
          end
        end
      end

      def [](id)
        @sites[id]
      end

      def key(id)
        @keys[id]
      end
    end

    # Summary is what the timeline keeps of one snapshot: its time, the total live bytes and its error,
    # the sampling rate, the memory breakdown (Heapscope::Memory), and the KEPT largest sites' live
    # bytes with their 1σ errors (parallel arrays, ids sorted so that a site is a binary search away).
    # Whole profiles are read again only when a page needs one (top table, flame graph, diff).
    #
    # Why only the largest: a summary is read back from the cache at every start (SummaryCache), and
    # 5,000 sites a snapshot made that 15 ms a file, half a minute for a folder of 500. A site below a
    # snapshot's KEPT largest held at most floor bytes there (the largest value left out), so it reads
    # as floor / 2 ± floor / √12 (uniform on [0, floor]): small against the sites drawn, and wide enough
    # that a leak's trend through such points is not overstated. top holds the TOP largest ids: the
    # sites the chart may draw are the union of the snapshots' top lists.
    #
    # label_sets: the live bytes of each set of user labels (Heapscope.with_labels) the samples carry,
    # [[[key, value]...] sorted, value, 1σ error, parts by variance group (windowed) or nil], the
    # LABEL_SETS largest; label_rest: the bytes of the sets left out. A label filter on the timeline
    # (Timeline.build) sums the sets that carry it. design: the live samples' variance design with its
    # fpc ({allocations:, total:, groups:, fpc:}, windowed; else nil), which the sets' parts are read by.
    #
    # run, persist and extras let the leak verdicts judge snapshots of one run by what changed between
    # them, as `heapscope leaks` does (Report::Persistence): run is the profile's run id (nil without
    # one); persist what the run's errors need beside the design, {gc:, min_age:} (nil: the profile
    # has neither a design nor variance labels); extras, parallel to ids, each kept site's [its parts by
    # variance group (windowed, else nil), its {gc_age bucket => [value, T_var]}].
    Summary = Struct.new(:time, :total, :total_error, :unit, :every, :memory, :ids, :values, :errors, :top, :floor,
                         :label_sets, :label_rest, :run, :persist, :extras, :design, keyword_init: true) do
      # [value, 1σ error] of site id in this snapshot.
      def at(id)
        i = ids.bsearch_index { |x| x >= id }
        return [values[i], errors[i]] if i && ids[i] == id

        floor.to_i.positive? ? [floor / 2.0, floor / Math.sqrt(12)] : [0, 0.0]
      end

      # Site id's extra (see persist): [parts, ages] where kept; [nil, {}] where the snapshot had no
      # sample of it; :unknown where it was below the KEPT largest.
      def extra(id)
        i = ids.bsearch_index { |x| x >= id }
        return (extras && extras[i]) || [nil, {}] if i && ids[i] == id

        floor.to_i.positive? ? :unknown : [nil, {}]
      end

      # [value, 1σ error, rest] of the samples carrying every label of filters (Report::Labels::Filter):
      # the label sets that match. Windowed, their parts are summed and read by the design, as
      # `--label` reads the whole selection (sets that share windows are correlated: their errors in
      # quadrature read narrow); else (drawn one by one, sampling: :always) their errors add in
      # quadrature, which is then exact. rest is label_rest, the most the sets left out of this summary
      # could add.
      def labelled(filters)
        value = 0
        variance = 0.0
        parts = design && Array.new(design[:allocations].size, 0.0)
        (label_sets || []).each do |pairs, v, e, ys|
          next unless filters.all? { |f| pairs.include?([f.key, f.value]) }

          value += v
          variance += e.to_f**2
          if ys && parts
            ys.each_with_index { |y, g| parts[g] += y }
          else
            parts = nil # a set without parts: the quadrature for all
          end
        end
        variance = Report::Sampling.parts_variance(parts, design, design[:fpc]) if parts
        [value, Math.sqrt(variance), label_rest.to_i]
      end
    end

    module Summarize
      SAMPLE = "inuse_space"
      # Sites per snapshot that may be drawn (the chart shows about 10 of their union).
      TOP = 20
      # Sites per snapshot whose values are kept (see Summary).
      KEPT = 300
      # Label sets per snapshot whose values are kept (see Summary).
      LABEL_SETS = 200

      module_function

      # Summarizes a decoded profile. fallback_time: seconds, used when the profile has no time of its own
      # (the file's mtime, or when a URL was fetched). Raises Report::Error for a profile without live
      # bytes (an alloc-only or CPU profile: nothing to follow over time).
      def call(prof, table, name:, fallback_time:)
        ti = Report::Sites.sample_index(prof, SAMPLE, name)
        unit = prof.sample_types[ti][1]
        sampling = Report::Sampling.new(prof)
        persist, ages = one_run(prof, ti, sampling)
        rows = []
        Report::Leaks.site_values(prof, "line", ti, sampling: sampling, ages: ages) do |key, entry, value, error, parts, aged|
          rows << [table.id(key, entry), value, (error || 0.0).to_f, persist && [parts, aged || {}]] unless value.zero?
        end
        sets, whole = label_sets(prof, ti, sampling)
        # The whole heap's error from its own columns (windowed: its parts by group, so sites that share
        # windows count together); without variance labels, the sites' errors in quadrature.
        total_error = (whole && sampling.absolute_error(whole, ti)) || Math.sqrt(rows.sum { |r| r[2]**2 })
        rows.sort_by! { |r| [-r[1], r[0]] }
        floor = rows.size > KEPT ? rows[KEPT][1] : 0
        top = rows.first(TOP).map(&:first)
        rows = rows.first(KEPT).sort_by!(&:first)
        Summary.new(
          time: prof.time_nanos.to_i.positive? ? prof.time_nanos / 1e9 : fallback_time,
          total: prof.samples.sum { |s| s.values[ti] }, unit: unit,
          total_error: total_error, floor: floor,
          every: sampling.rate_lowered? ? sampling.current_sample_every : sampling.sample_every,
          memory: Memory.of_profile(prof)&.transform_keys(&:to_s),
          ids: rows.map(&:first), values: rows.map { |r| r[1] }, errors: rows.map { |r| r[2] },
          top: top, label_sets: sets.first(LABEL_SETS), label_rest: sets.drop(LABEL_SETS).sum { |r| r[1] },
          run: persist && Report::Persistence.run_id(prof), persist: persist, extras: persist && rows.map { |r| r[3] },
          design: (design = sampling.live_design) && design.merge(fpc: sampling.fpc)
        )
      end

      # [persist, a Persistence::AgeColumns (each site's value and variance by gc_age)] for Summary (see
      # there), or nil when the profile does not say its run.
      def one_run(prof, ti, sampling)
        return nil unless Report::Persistence.run_id(prof) && prof.sample_types[ti][0].start_with?("inuse_")

        facts = Report::Persistence.gc_facts(prof) or return nil
        [facts, Report::Persistence::AgeColumns.new(prof, ti, sampling)] if sampling.live_design || sampling.variance?
      end

      # [sets, whole]: sets are [[pairs, value, 1σ error, parts]...] of the samples carrying user labels,
      # grouped by their whole set of user labels (sorted [key, value] pairs), largest first; whole is
      # every sample's values and variance columns summed (nil without variance labels). Values and
      # variance columns add up per set as Report::Sites adds them per site, so each set's error is the
      # one `--label` would print; parts are the set's parts by variance group (windowed; else nil), so
      # that sets summed on the timeline are read together (Summary#labelled).
      def label_sets(prof, ti, sampling)
        var = Report::Sampling.variance_labels(prof)
        reserved = {} # key -> reserved?, so each distinct key meets the regexp once
        sets = {}
        whole = nil
        Report::Sites.each_counted(prof.samples) do |s, times|
          next if s.values[ti].zero?

          values = Report::Sites.times(var ? Report::Sampling.with_variances(s, var) : s.values, times)
          whole ? Report::Sites.add(whole, values) : (whole = values.dup) if var
          pairs = s.labels.select do |k, v|
            v.is_a?(String) && !reserved.fetch(k) { reserved[k] = k.match?(Report::Labels::RESERVED) }
          end
          next if pairs.empty?

          key = pairs.sort
          if (acc = sets[key])
            Report::Sites.add(acc, values)
          else
            sets[key] = values.dup
          end
        end
        columns = sampling.live_design && sampling.variance_columns(ti).drop(1) # the groups, not T_var
        rows = sets.map do |pairs, values|
          [pairs, values[ti], (sampling.absolute_error(values, ti) || 0.0).to_f, columns && values.values_at(*columns).map(&:to_f)]
        end
        [rows.sort_by! { |r| [-r[1], r[0]] }, whole]
      end
    end
  end
end
