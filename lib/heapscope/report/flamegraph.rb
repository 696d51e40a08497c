# frozen_string_literal: true

require "heapscope/report/command"
require "heapscope/report/flamegraph_page"

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
      USAGE = "usage: heapscope flamegraph FILE [-o out.html] [--sample TYPE] [--icicle]"
      PRUNE = 1e-4

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
        prof = Sites.load(path)
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
                      "#{PRUNE * 100}% of the total are folded into their caller."
        )
      end

      # Writes html to output ("-" is out) and says where on out. Returns the exit status.
      def self.write(html, output, out)
        if output == "-"
          out.write(html)
        else
          begin
            File.write(output, html)
          rescue SystemCallError => e
            raise Error, "cannot write #{output}: #{e.message.sub(/ @ .*/, "")}"
          end
          out.puts "wrote #{output} (#{html.bytesize / 1024} KiB)"
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

      # Aggregates the call trees of profiles (one, or [new, base] for a diff, whose sample types are
      # matched to the first one's by name) into node arrays:
      #   {"frames" => [[function, file, line]], "parent" => [..], "frame" => [..],
      #    "values" => [per type: [cumulative value per node]], "base" => same for profiles[1] or nil}
      def self.tree(profiles)
        first = profiles.first
        ntypes = first.sample_types.size
        frames = [["all", "", 0]]
        frame_ids = {}
        parent = [0]
        frame = [0]
        vals = profiles.map { [Array.new(ntypes, 0)] } # vals[profile][node] = values vector
        child = {} # (parent << 32 | frame id) -> node
        profiles.each_with_index do |prof, pi|
          map = first.sample_type_names.map { |name| prof.sample_index(name) }
          loc_paths = {} # location id -> frame ids, leaf first
          mine = vals[pi]
          prof.samples.each do |s|
            values = map.map { |i| i ? s.values[i] : 0 }
            next if values.all?(&:zero?)

            path = s.location_ids.flat_map do |id|
              loc_paths[id] ||= prof.frames_for([id]).map do |f|
                key = [f.function, f.file, f.line]
                frame_ids[key] ||= (frames << key).size - 1
              end
            end
            add(mine[0], values)
            node = 0
            path.reverse_each do |fid|
              node = child[(node << 32) | fid] ||= begin
                parent << node
                frame << fid
                vals.each { |v| v << Array.new(ntypes, 0) }
                parent.size - 1
              end
              add(mine[node], values)
            end
          end
        end
        prune(frames, parent, frame, vals, ntypes)
      end

      def self.add(into, values)
        values.each_with_index { |v, i| into[i] += v }
      end

      # Keeps the root and every node at least PRUNE of the total in some type of some profile (and whose
      # parent is kept), renumbered so parents still come first; transposes values to one array per type.
      def self.prune(frames, parent, frame, vals, ntypes)
        limits = vals.map { |v| Array.new(ntypes) { |t| [v[0][t].abs * PRUNE, 1].max } }
        keep = Array.new(parent.size)
        keep[0] = 0
        kept = [0]
        (1...parent.size).each do |n|
          next unless keep[parent[n]]
          next unless vals.each_with_index.any? { |v, pi| v[n].each_with_index.any? { |x, t| x.abs >= limits[pi][t] } }

          keep[n] = kept.size
          kept << n
        end
        used = {}
        kept.each { |n| used[frame[n]] ||= used.size }
        out_frames = Array.new(used.size)
        used.each { |fid, i| out_frames[i] = frames[fid] }
        {
          "frames" => out_frames,
          "parent" => kept.map { |n| keep[parent[n]] },
          "frame" => kept.map { |n| used[frame[n]] },
          "values" => (0...ntypes).map { |t| kept.map { |n| vals[0][n][t] } },
          "base" => vals[1] && (0...ntypes).map { |t| kept.map { |n| vals[1][n][t] } },
        }
      end
    end
  end
end
