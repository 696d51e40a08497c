# frozen_string_literal: true

require "heapscope/atomic_write"

require "heapscope/report/command"
require "heapscope/report/flamegraph_page"
require "heapscope/report/flame_tree"

module Heapscope
  module Report
    # Flamegraph writes one self-contained HTML file drawing the call tree of a profile: hover for
    # details, click to zoom, search to highlight, a switch between the sample types in the file.
    #
    #   heapscope flamegraph heap.pb.gz -o heap.html
    #
    # The tree is aggregated here, not in the browser: one node per distinct call path (frames are
    # function + file + line), values summed for every sample type at once, and nodes smaller than
    # PRUNE of the total in every type dropped (their values stay in their parent), so a profile of 50k
    # samples becomes a page that draws instantly.
    #
    # User labels (Labels): the page has a selector per label key, and choosing a value draws the tree
    # of the samples with that value. Each value's tree is aggregated here like the main one (its own
    # pruning, so a small endpoint keeps its detail, and its own errors, from its samples' variance
    # labels): errors of a selection cannot be added up from the whole tree's, so the browser only
    # swaps trees. One key at a time on the page; --label KEY=VALUE at generation narrows the whole
    # page first, which is how two keys combine.
    class Flamegraph < Command
      DESCRIPTION = "Writes a self-contained HTML flame graph of a profile, with errors on every node."
      USAGE = "usage: heapscope flamegraph FILE [-o out.html] [--sample TYPE] [--label KEY=VALUE]... [--icicle] " \
              "[--max-size SIZE]"
      PRUNE = 1e-4
      # At most this many frames (nodes) on a page, the largest: a browser draws 100k boxes quickly, and
      # anything beyond is far below a pixel wide at any zoom a person uses.
      MAX_NODES = 100_000
      # ... and at most this many values (nodes x sample types x profiles).
      MAX_VALUES = 2_000_000
      # A label key's values that get a view (a tree) of their own, the largest; the others are named
      # in the selector as a count, for --label.
      MAX_LABEL_VALUES = 50
      # Label keys that get a selector, those on the most samples: each key's views together cost about
      # one tree (they partition the samples), so a profile crafted with thousands of keys must not
      # make thousands of near-whole trees.
      MAX_LABEL_KEYS = 8
      # The values all views share, split evenly between keys and, within a key, by each view's share
      # of its samples. Half of MAX_VALUES: a view prunes against its own total, so a small endpoint
      # keeps nearly all its frames, and views would otherwise make most of the page.
      MAX_VIEW_VALUES = 1_000_000

      def defaults
        {}
      end

      def options(parser, opts)
        parser.on("-o", "--output PATH", "where to write the HTML (default: FILE with .html, HOST_PORT-heap.html for a URL; - for stdout)") do |v|
          opts[:output] = v
        end
        sample_flag(parser, opts)
        label_flag(parser, opts)
        parser.on("--icicle", "draw callers on top (default: flame, roots at the bottom)") { opts[:icicle] = true }
      end

      def run(out)
        path = @args.first
        prof = load_profile(path)
        html = self.class.html(prof, path: path, sample: @opts[:sample], icicle: @opts[:icicle], labels: @opts[:labels] || [])
        Flamegraph.write(html, @opts[:output] || "#{output_stem(path)}.html", out)
      end

      # Returns the page for one profile (with labels, of its matching samples only).
      def self.html(prof, path:, sample: nil, icicle: false, labels: [])
        ti = Sites.sample_index(prof, sample, path)
        whole = prof
        prof = Labels.select(whole, labels)
        raise Labels.no_match([whole], labels, path) if !labels.empty? && prof.samples.empty?

        data = tree([prof])
        data.merge!("types" => types(prof), "type" => ti, "icicle" => icicle ? true : false)
        add_label_views(data, [prof], labels, ti)
        sampling = Sampling.new(prof)
        FlamegraphPage.render(
          data, census: census_data(whole, ti), title: "heapscope flame graph: #{File.basename(path)}",
                meta: "#{path}; #{prof.samples.size} samples; #{sampling.describe}#{time_note(prof)}" \
                      "#{labels_note(data, labels)}",
                help: "Width is the value of the chosen sample type for a call path (a frame and everything it " \
                      "called). Hover for details, click a frame to zoom, Escape to reset. Frames under " \
                      "#{PRUNE * 100}% of the total are folded into their caller.#{capped_note(data)}"
        )
      end

      # The census rows for the page (of the whole profile, whatever --label selects): of the type shown
      # when it is an inuse one, else of inuse_space; nil without a census.
      def self.census_data(prof, ti)
        census = Census.of(prof) or return nil
        ti = prof.sample_index("inuse_space") || prof.sample_index("inuse_objects") unless Census.column(prof.sample_types[ti][0])
        ti && census.report(prof, ti)
      end

      # The help's note when MAX_NODES cut the tree.
      def self.capped_note(data)
        data["capped"] ? " Only the #{MAX_NODES} largest frames are drawn; the others are folded into their callers." : ""
      end

      # Writes html to output ("-" is out) and says where on out. Returns the exit status.
      def self.write(html, output, out)
        if output == "-"
          out.write(html)
        else
          begin
            # Atomically, never through a planted symlink (docs/robustness.md); but a device or fifo
            # the user named (-o /dev/stdout) is written in place: rename would replace the node.
            if File.exist?(output) && !File.symlink?(output) && !File.file?(output)
              File.write(output, html)
            else
              Heapscope.write_atomically(output, html)
            end
          rescue SystemCallError, Heapscope::UnsafeDirectoryError => e
            raise Error, "cannot write #{output}: #{e.message.sub(/ @ .*/, "")}"
          end
          out.puts Escape.terminal("wrote #{output} (#{html.bytesize / 1024} KiB)")
        end
        0
      end

      def self.types(prof)
        prof.sample_types.map { |name, unit| { "name" => name, "unit" => unit } }
      end

      def self.time_note(prof)
        prof.time_nanos.to_i.positive? ? "; taken #{Time.at(prof.time_nanos / 1e9).utc.strftime("%Y-%m-%d %H:%M:%S UTC")}" : ""
      end

      # The call tree of profiles as node arrays (FlameTree): one profile, or [new, base] for a diff.
      def self.tree(profiles, max_values: MAX_VALUES)
        FlameTree.new(profiles, prune: PRUNE, max_nodes: MAX_NODES, max_values: max_values).build
      end

      # Adds the label selectors' data to a page's data (profiles: as for tree):
      #   "labels" => [{"key", "values" => [{"name", "view"}], "missing" => view or nil, "more" => count}]
      #   "views"  => [a tree like the main one, its frames in the main "frames"]
      # per user label key (those --label fixed are left out: they have one value), values largest first
      # in the first profile's type ti; "missing" is the view of the samples without the key.
      def self.add_label_views(data, profiles, filters, ti)
        fixed = filters.map(&:key)
        found = Labels.values(profiles).reject { |k, _| fixed.include?(k) }
        keys = found.sort_by { |k, vs| [-vs.values.sum, k] }.first(MAX_LABEL_KEYS).map(&:first).sort
        data["labels"] = []
        data["views"] = []
        data["labels_more"] = found.size - keys.size
        return data if keys.empty?

        # key -> value (nil: without the key) -> per profile its samples
        groups = keys.to_h { |k| [k, {}] }
        profiles.each_with_index do |prof, pi|
          prof.samples.each do |s|
            keys.each do |k|
              v = s.labels[k]
              v = v.to_s unless v.nil? # as --by label:KEY groups a number label
              ((groups[k][v] ||= Array.new(profiles.size) { [] })[pi]) << s
            end
          end
        end
        chosen = keys.to_h do |k|
          ranked = groups[k].keys.compact.sort_by do |v|
            parts = groups[k][v]
            [-parts[0].sum { |s| s.values[ti].abs }, -parts.sum(&:size), v]
          end
          [k, [ranked.first(MAX_LABEL_VALUES), ranked.size - [ranked.size, MAX_LABEL_VALUES].min]]
        end
        frame_index = {}
        data["frames"].each_with_index { |f, i| frame_index[f] ||= i }
        # A key's views share its budget by samples (+1: a view of a few samples still gets a few nodes).
        weight = keys.to_h do |k|
          views = chosen[k][0].map { |v| groups[k][v] } + (groups[k].key?(nil) ? [groups[k][nil]] : [])
          [k, views.sum { |parts| parts.sum(&:size) + 1 }]
        end
        view = lambda do |k, parts|
          share = MAX_VIEW_VALUES / keys.size * (parts.sum(&:size) + 1) / weight[k]
          subsets = profiles.each_with_index.map { |prof, pi| Labels.subset(prof, parts[pi]) }
          t = tree(subsets, max_values: share)
          # One frames table for the page: a view's frames are the main tree's, or added after them.
          t["frame"] = t.delete("frames").then do |own|
            ids = own.map { |f| frame_index[f] ||= (data["frames"] << f).size - 1 }
            t["frame"].map { |i| ids[i] }
          end
          (data["views"] << t).size - 1
        end
        keys.each do |k|
          values, more = chosen[k]
          data["labels"] << {
            "key" => k, "values" => values.map { |v| { "name" => v, "view" => view.call(k, groups[k][v]) } },
            "missing" => groups[k].key?(nil) ? view.call(k, groups[k][nil]) : nil, "missing_name" => Labels.missing_name(k),
            "more" => more
          }
        end
        data
      end

      # The page's meta note on labels: the --label selection, and the keys the selectors offer.
      def self.labels_note(data, filters)
        note = +""
        note << "; only samples with #{Labels.filter_text(filters)}" unless filters.empty?
        keys = Labels.summary_text(data["labels"].map { |l| { "key" => l["key"], "values" => l["values"].size + l["more"] } })
        note << "; labels: #{keys} (choose one above)" if keys
        more = data["labels_more"].to_i
        note << "; #{more} more label key#{more == 1 ? "" : "s"} without a selector (--label KEY=VALUE selects)" if more.positive?
        note
      end
    end
  end
end
