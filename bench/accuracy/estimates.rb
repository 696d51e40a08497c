# frozen_string_literal: true

require "heapscope/report/top"
require "heapscope/report/census"

module Accuracy
  # A profile's estimates per site, read the way `heapscope top --json --by line --sample TYPE` reads
  # them: the same loader (Report::Sites.load) and the same rows (Report::Top.report), so the error
  # checked is the one top prints. A site is a row's file:line (the leaf frame's line; heapscope gives a
  # C function its Ruby caller's line). A site read by its class (Thread.new's line also allocates VM
  # internals) is read as `top --label class=NAME` reads it.
  module Estimates
    ALL_ROWS = Heapscope::Report::Command::MAX_ROWS
    INUSE = %w[inuse_objects inuse_space].freeze

    module_function

    # Returns [{site key => {type => [estimate, relative error or nil, value top shows]}}, top's sampling
    # description, census], keeping the sites in files (a path, or a directory ending in "/").
    # label_sites: {site key => class name}; classes: the class names whose census rows to keep.
    def read(path, files, label_sites: {}, classes: [])
      prof = Heapscope::Report::Sites.load(path)
      sites = {}
      describe = nil
      # A class with no sample is in no row (and top raises on a filter that matches nothing): asked once.
      filters = label_sites.transform_values { |klass| [Heapscope::Report::Labels::Filter.new("class", klass)] }
      present = filters.reject { |_, filter| Heapscope::Report::Labels.select(prof, filter).samples.empty? }
      TYPES.each do |type|
        data = Heapscope::Report::Top.report(prof, path: path, sample: type, by: "line", n: ALL_ROWS, all: true)
        describe ||= data["sampling"]
        data["entries"].each do |row|
          file = row["file"].to_s
          next unless files.any? { |f| f.end_with?("/") ? file.start_with?(f) : file == f }

          key = Accuracy.site_key(file, row["line"])
          next if label_sites.key?(key)

          (sites[key] ||= {})[type] = entry(row)
        end
        present.each do |key, filter|
          data = Heapscope::Report::Top.report(prof, path: path, sample: type, by: "line", n: ALL_ROWS, all: true, labels: filter)
          row = data["entries"].find { |r| Accuracy.site_key(r["file"].to_s, r["line"]) == key } or next
          (sites[key] ||= {})[type] = entry(row)
        end
      end
      [sites, describe, census(prof, classes)]
    end

    # The estimate itself, not top's display bounded at its class's exact total (flat_estimate is set
    # only where top bounded it): the bound trades bias for error, and this suite judges bias. The
    # bounded value is kept beside it (no site may read above its class's exact total).
    def entry(row)
      [row["flat_estimate"] || row["flat"], row["relative_error"], row["flat"]]
    end

    # The census rows the suite checks (Report::Census#class_row and #type_row), for the inuse types:
    # {"classes" => {name => {type => row}}, "types" => {T_NAME => {type => row}}}, or nil without a census.
    def census(prof, classes)
      census = Heapscope::Report::Census.of(prof) or return nil
      sampling = Heapscope::Report::Sampling.new(prof)
      at_sites = Heapscope::Report::Census.at_sites(prof)
      out = { "classes" => {}, "types" => {}, "seconds" => census.seconds }
      INUSE.each do |type|
        ti = prof.sample_index(type) or next
        classes.each do |c|
          row = census.class_row(prof, ti, c, sampling: sampling, at_sites: at_sites) and (out["classes"][c] ||= {})[type] = slim(row)
        end
        census.types.each_key do |t|
          row = census.type_row(prof, ti, t, sampling: sampling, at_sites: at_sites) and (out["types"][t] ||= {})[type] = slim(row)
        end
      end
      out
    end

    def slim(row)
      row.slice("exact", "at_sites", "not_seen", "error")
    end
  end
end
