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
    class Flamegraph < Command
      DESCRIPTION = "Writes a self-contained HTML flame graph of a profile, with errors on every node."
      USAGE = "usage: heapscope flamegraph FILE [-o out.html] [--sample TYPE] [--icicle] [--max-size SIZE]"
      PRUNE = 1e-4
      # At most this many frames (nodes) on a page, the largest: a browser draws 100k boxes quickly, and
      # anything beyond is far below a pixel wide at any zoom a person uses.
      MAX_NODES = 100_000
      # ... and at most this many values (nodes x sample types x profiles).
      MAX_VALUES = 2_000_000

      def defaults
        {}
      end

      def options(parser, opts)
        parser.on("-o", "--output PATH", "where to write the HTML (default: FILE with .html; - for stdout)") do |v|
          opts[:output] = v
        end
        sample_flag(parser, opts)
        parser.on("--icicle", "draw callers on top (default: flame, roots at the bottom)") { opts[:icicle] = true }
      end

      def run(out)
        path = @args.first
        prof = load_profile(path)
        html = self.class.html(prof, path: path, sample: @opts[:sample], icicle: @opts[:icicle])
        Flamegraph.write(html, @opts[:output] || Flamegraph.default_output(path), out)
      end

      # Returns the page for one profile.
      def self.html(prof, path:, sample: nil, icicle: false)
        ti = Sites.sample_index(prof, sample, path)
        data = tree([prof])
        data.merge!("types" => types(prof), "type" => ti, "icicle" => icicle ? true : false)
        sampling = Sampling.new(prof)
        FlamegraphPage.render(
          data, title: "heapscope flame graph: #{File.basename(path)}",
                meta: "#{path}; #{prof.samples.size} samples; #{sampling.describe}#{time_note(prof)}",
                help: "Width is the value of the chosen sample type for a call path (a frame and everything it " \
                      "called). Hover for details, click a frame to zoom, Escape to reset. Frames under " \
                      "#{PRUNE * 100}% of the total are folded into their caller.#{capped_note(data)}"
        )
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

      # heap.pb.gz -> heap.html, next to the profile.
      def self.default_output(path)
        path.sub(/(\.pb)?(\.gz)?\z/, "").sub(/\.(pprof|prof)\z/, "") + ".html"
      end

      def self.types(prof)
        prof.sample_types.map { |name, unit| { "name" => name, "unit" => unit } }
      end

      def self.time_note(prof)
        prof.time_nanos.to_i.positive? ? "; taken #{Time.at(prof.time_nanos / 1e9).utc.strftime("%Y-%m-%d %H:%M:%S UTC")}" : ""
      end

      # The call tree of profiles as node arrays (FlameTree): one profile, or [new, base] for a diff.
      def self.tree(profiles)
        FlameTree.new(profiles, prune: PRUNE, max_nodes: MAX_NODES, max_values: MAX_VALUES).build
      end
    end
  end
end
