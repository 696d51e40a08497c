# frozen_string_literal: true

require "heapscope/report/top"

module Accuracy
  # A profile's estimates per site, read the way `heapscope top --json --by line --sample TYPE` reads
  # them: the same loader (Report::Sites.load) and the same rows (Report::Top.report), so the error
  # checked is the one top prints. A site is a row's file:line (the leaf frame's line; heapscope gives a
  # C function its Ruby caller's line).
  module Estimates
    ALL_ROWS = Heapscope::Report::Command::MAX_ROWS

    module_function

    # Returns [{site key => {type => [estimate, relative error or nil]}}, top's sampling description],
    # keeping the sites in files (a path, or a directory ending in "/").
    def read(path, files)
      prof = Heapscope::Report::Sites.load(path)
      sites = {}
      describe = nil
      TYPES.each do |type|
        data = Heapscope::Report::Top.report(prof, path: path, sample: type, by: "line", n: ALL_ROWS, all: true)
        describe ||= data["sampling"]
        data["entries"].each do |row|
          file = row["file"].to_s
          next unless files.any? { |f| f.end_with?("/") ? file.start_with?(f) : file == f }

          # The estimate itself, not top's display bounded at its class's exact total (flat_estimate
          # is set only where top bounded it): the bound trades bias for error, and this suite judges bias.
          (sites[Accuracy.site_key(file, row["line"])] ||= {})[type] = [row["flat_estimate"] || row["flat"], row["relative_error"]]
        end
      end
      [sites, describe]
    end
  end
end
