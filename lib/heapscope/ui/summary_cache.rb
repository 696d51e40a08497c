# frozen_string_literal: true

require "digest"
require "json"
require "heapscope/atomic_write"
require "heapscope/surfaces/output_dir"
require "heapscope/ui/summary"

module Heapscope
  module UI
    # SummaryCache keeps each profile file's Summary on disk, so that a folder is decoded once, not
    # at every start of `heapscope ui`: decoding is most of the cost (a 5,000-site profile takes a
    # few hundred ms in Ruby; 500 of them minutes), reading a summary back about a millisecond.
    #
    # Where: HEAPSCOPE_UI_CACHE, else $XDG_CACHE_HOME/heapscope/ui, else ~/.cache/heapscope/ui; "off"
    # disables it. One file per profile, named by a digest of the profile's real path, mtime and size
    # (a changed or replaced file misses). JSON with the numbers packed, never Marshal: a cache file is
    # input, and someone else's file there could at worst show wrong numbers. The directory is opened
    # once (OutputDir: created where missing, every ancestor checked) and every read and write goes
    # through that descriptor (Native::DirHandle#read, write_replace), never the path again; files are
    # written atomically and read only if regular and at most MAX_FILE bytes. A failure to read or
    # write the cache only costs the decode.
    class SummaryCache
      FORMAT = 6 # 3: label sets; 4: one run (run, persist, extras); 5: the live design, label sets' parts; 6: the design once
      VARIABLE = "HEAPSCOPE_UI_CACHE"
      # A summary keeps at most 300 sites (Summary): far below this.
      MAX_FILE = 16 * 1024 * 1024

      def self.default_dir(env = ENV)
        given = env[VARIABLE].to_s
        return nil if given == "off"
        return given unless given.empty?

        base = env["XDG_CACHE_HOME"].to_s
        base = File.join(Dir.home, ".cache") if base.empty?
        File.join(base, "heapscope", "ui")
      rescue ArgumentError # no home directory
        nil
      end

      def initialize(dir = self.class.default_dir)
        @dir = dir
        @out = dir && OutputDir.new(dir)
      end

      def enabled?
        !@dir.nil?
      end

      # The cached Summary of path (stamp: [mtime, size]), its sites numbered in table; nil on a miss.
      def read(path, stamp, table)
        return nil unless @dir

        data = JSON.parse(@out.use { |d| d.read(name_for(path, stamp), MAX_FILE) })
        return nil unless data["format"] == FORMAT

        ids = data["sites"].map do |key, name, function, file, line|
          table.id(key, SiteTable::Site.new(name, function, file, line))
        end
        values = data["values"].unpack1("m").unpack("q<*")
        errors = data["errors"].unpack1("m").unpack("E*")
        return nil unless ids.size == values.size && ids.size == errors.size

        design = design_of(data["design"])
        return nil if data["design"] && design.nil?

        persist = persist_of(data["persist"])
        extras = extras_of(data["extras"], persist, design, ids.size)
        # Malformed one-run data is a miss: read as none, this snapshot alone would turn the series'
        # leak verdicts back to the points' errors.
        return nil if (data["persist"] && persist.nil?) || (persist && extras.nil?)

        rows = ids.each_index.map { |i| [ids[i], values[i], errors[i], extras && extras[i]] }.sort_by!(&:first)
        sets = label_sets(data["label_sets"], design)
        return nil unless sets

        Summary.new(time: data["time"], total: data["total"], total_error: data["total_error"], unit: data["unit"],
                    every: data["every"], memory: data["memory"], ids: rows.map(&:first), values: rows.map { |r| r[1] },
                    errors: rows.map { |r| r[2] }, top: data["top"].map { |i| ids[i] }, floor: data["floor"],
                    label_sets: sets, label_rest: data["label_rest"].to_i,
                    run: persist && data["run"].is_a?(String) ? data["run"] : nil, persist: persist,
                    extras: persist && rows.map { |r| r[3] }, design: design)
      rescue SystemCallError, IOError, JSON::ParserError, ArgumentError, TypeError, NoMethodError, UnsafeDirectoryError, LoadError
        nil
      end

      # Stores summary (its sites named through table) for path; quietly does nothing when it cannot.
      def write(path, stamp, summary, table)
        return unless @dir

        at = summary.ids.each_with_index.to_h
        data = {
          "format" => FORMAT, "time" => summary.time, "total" => summary.total, "total_error" => summary.total_error,
          "unit" => summary.unit, "every" => summary.every, "memory" => summary.memory, "floor" => summary.floor,
          "sites" => summary.ids.map { |id| site = table[id]; [table.key(id), site.name, site.function, site.file, site.line] },
          "values" => [summary.values.pack("q<*")].pack("m0"), "errors" => [summary.errors.pack("E*")].pack("m0"),
          "top" => summary.top.map { |id| at[id] },
          "label_sets" => summary.label_sets || [], "label_rest" => summary.label_rest.to_i,
          "run" => summary.run, "persist" => summary.persist, "extras" => extras_json(summary), "design" => summary.design,
        }
        @out.write(name_for(path, stamp), JSON.generate(data))
      rescue StandardError, LoadError # LoadError: a build without the extension (AtomicWrite needs it)
        nil # a full disk or an unwritable cache costs the next start a decode, nothing more
      end

      private

      # Every site's [parts packed as doubles (windowed; nil parts as zeros), [[bucket, value, T_var]...]]
      # as {"parts" => base64 or nil, "ages" => [...]}.
      def extras_json(summary)
        return nil unless summary.persist

        packed = if summary.design
                   width = summary.design[:allocations].size
                   [summary.extras.flat_map { |p, _| p || Array.new(width, 0.0) }.pack("E*")].pack("m0")
                 end
        { "parts" => packed, "ages" => summary.extras.map { |_, a| (a || {}).map { |b, (v, var)| [b, v, var] } } }
      end

      # The cached persist, checked (a cache file is input): nil when absent or malformed.
      def persist_of(h)
        return nil unless h.is_a?(Hash) && h["gc"].is_a?(Integer) && h["min_age"].is_a?(Integer)

        { gc: h["gc"], min_age: h["min_age"] }
      end

      # The cached extras of n sites under persist and design (design_of), checked: nil when malformed.
      def extras_of(raw, persist, design, n)
        return nil unless persist && raw.is_a?(Hash) && raw["ages"].is_a?(Array) && raw["ages"].size == n

        parts = Array.new(n)
        if design
          width = design[:allocations].size
          flat = raw["parts"].is_a?(String) ? raw["parts"].unpack1("m").unpack("E*") : []
          return nil unless flat.size == n * width

          parts = flat.each_slice(width).to_a
        end
        ages = raw["ages"].map do |list|
          return nil unless list.is_a?(Array) && list.all? { |e| e.is_a?(Array) && e.size == 3 && e[0].is_a?(Integer) && e[1..].all?(Numeric) }

          list.to_h { |b, v, var| [b, [v.to_f, var.to_f]] }
        end
        parts.zip(ages)
      end

      # The cached live design ({allocations:, total:, groups:, fpc:}), checked: nil when absent or
      # malformed. A total of 0 would divide by zero (NaN, which the timeline's JSON cannot hold).
      def design_of(h)
        return nil unless h.is_a?(Hash)

        a = h["allocations"]
        ok = a.is_a?(Array) && !a.empty? && a.all? { |x| x.is_a?(Numeric) && x >= 0 } && h["total"].is_a?(Numeric) &&
             h["total"].positive? && h["groups"].is_a?(Integer) && h["groups"].between?(0, a.size) &&
             h["fpc"].is_a?(Numeric) && h["fpc"].between?(0, 1)
        ok ? { allocations: a.map(&:to_f), total: h["total"].to_f, groups: h["groups"], fpc: h["fpc"].to_f } : nil
      end

      # The label sets of a cache file, checked entry by entry (a cache file is input); nil when any
      # entry is not [[[key, value]...], Integer, Numeric, parts], parts nil or, under a design, one
      # number per group.
      def label_sets(list, design)
        return nil unless list.is_a?(Array)

        width = design && design[:allocations].size
        ok = list.all? do |pairs, value, error, parts, *rest|
          pairs.is_a?(Array) && pairs.all? { |p| p.is_a?(Array) && p.size == 2 && p.all?(String) } &&
            value.is_a?(Integer) && error.is_a?(Numeric) && rest.empty? &&
            (parts.nil? || (width && parts.is_a?(Array) && parts.size == width && parts.all?(Numeric)))
        end
        ok ? list : nil
      end

      def name_for(path, stamp)
        real = File.realpath(path)
        "#{Digest::SHA256.hexdigest([FORMAT, real, *stamp].join("\0"))}.json"
      end
    end
  end
end
