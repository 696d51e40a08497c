# frozen_string_literal: true

require "heapscope/report/retainers"

module Heapscope
  module Report
    # `heapscope examples URL SITE`: asks a live process's /debug/pprof/examples endpoint (either HTTP
    # surface) what SITE's sampled live objects hold, and prints the answer. The fetch is the one
    # retainers uses (bounded in time and size, the same token).
    #
    #   heapscope examples http://127.0.0.1:6060 app/cache.rb:12 --max 3
    class Examples < Retainers
      DESCRIPTION = "Shows what a site's live objects hold in a running process: the oldest sampled ones with their " \
                    "class, size, age and a bounded preview, from its /debug/pprof/examples endpoint. String bytes and " \
                    "Hash keys appear only if that process was started with show_contents."
      USAGE = "usage: heapscope examples URL FILE:LINE [--max 5] [--json] [--timeout SECONDS] (token: HEAPSCOPE_HTTP_TOKEN)"
      ENDPOINT = "examples"
      # The endpoint's own bound (Rack::ExamplesEndpoint::MAX_OBJECTS) and default (Heapscope::Examples).
      MAX_OBJECTS = 20
      DEFAULT_MAX = 5

      def defaults
        { max: DEFAULT_MAX } # --timeout: Command's
      end

      def options(parser, opts)
        parser.on("--max N", Integer, "objects to show, 1 to #{MAX_OBJECTS} (default #{DEFAULT_MAX})") do |v|
          raise Error, "--max must be from 1 to #{MAX_OBJECTS}, got #{v}" unless v.between?(1, MAX_OBJECTS)

          opts[:max] = v
        end
        parser.on("--json", "print the endpoint's JSON") { opts[:json] = true }
      end

      private

      def query(site)
        { site: site, max: @opts[:max], format: @opts[:json] ? "json" : "text" }
      end
    end
  end
end
