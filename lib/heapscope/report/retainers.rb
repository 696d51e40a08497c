# frozen_string_literal: true

require "uri"
require "heapscope/report/command"
require "heapscope/report/http_fetch"
require "heapscope/surfaces/rack"

module Heapscope
  module Report
    # `heapscope retainers URL SITE`: asks a live process's /debug/pprof/retainers endpoint (either HTTP
    # surface) who keeps SITE's sampled objects alive, and prints the answer.
    #
    #   heapscope retainers http://127.0.0.1:6060 app/cache.rb:12 --limit 5
    class Retainers < Command
      DESCRIPTION = "Shows who keeps a site's live objects alive in a running process: paths from a GC root, " \
                    "from its /debug/pprof/retainers endpoint (the walk pauses that process for up to --time-limit)."
      USAGE = "usage: heapscope retainers URL FILE:LINE [--limit 3] [--time-limit SECONDS] [--keys] [--json] " \
              "[--timeout SECONDS] (token: HEAPSCOPE_HTTP_TOKEN)"
      # The largest answer read: a walk's report is a few KiB (--limit paths of bounded length).
      MAX_ANSWER = 16 << 20

      def defaults
        { limit: 3, time_limit: "1" } # --timeout: Command's
      end

      def options(parser, opts)
        parser.on("--limit N", Integer, "path shapes to show (default 3)") { |v| opts[:limit] = v }
        parser.on("--time-limit SECONDS", "longest walk, at most 5 (default 1)") { |v| opts[:time_limit] = v }
        parser.on("--json", "print the endpoint's JSON") { opts[:json] = true }
        parser.on("--keys", "show Hash keys (default: their class only, as keys may be data)") { opts[:keys] = true }
      end

      def check_args(args)
        super(args, min: 2, max: 2, what: "URL and FILE:LINE")
      end

      # Its URL is an endpoint to ask, not a profile (Command#profile_urls?).
      def profile_urls?
        false
      end

      def run(out)
        uri, response = answer
        body = response.body.force_encoding(Encoding::UTF_8)
        unless response.code == 200
          raise Error, "#{uri.host}:#{uri.port} answered #{response.code}: " \
                       "#{Escape.terminal(body.lines.first.to_s.chomp[0, 200])}"
        end

        # Names come from the process (classes, keys): no control character of theirs reaches the terminal.
        body.each_line { |line| out.puts(Escape.terminal(line.chomp)) }
        0
      end

      # [the endpoint's URI, its answer (HttpFetch's response)] for the arguments given (`heapscope ui`
      # shows it for a live snapshot's site).
      def answer
        url, site = @args
        uri = endpoint(url)
        uri.query = URI.encode_www_form(query(site))
        [uri, fetch(uri)]
      end

      private

      def query(site)
        { site: site, limit: @opts[:limit], time_limit: @opts[:time_limit], format: @opts[:json] ? "json" : "text",
          keys: @opts[:keys] ? 1 : 0 }
      end

      # The endpoint's name under /debug/pprof (Examples asks its own).
      ENDPOINT = "retainers"

      # http://HOST:PORT, .../debug/pprof or .../debug/pprof/retainers -> the endpoint's URI.
      def endpoint(url)
        uri = URI.parse(url)
        raise Error, "URL must be http:// or https://, got #{url.inspect}" unless uri.is_a?(URI::HTTP) && uri.host

        name = "/#{self.class::ENDPOINT}"
        path = uri.path.to_s.chomp("/")
        path = "#{path.empty? ? Heapscope::Rack::PREFIX : path}#{name}" unless path.end_with?(name)
        uri.path = path
        uri
      rescue URI::InvalidURIError => e
        raise Error, "URL is not valid: #{e.message}"
      end

      # The answer, bounded in time and size (HttpFetch): a server that never finishes costs --timeout
      # seconds and at most MAX_ANSWER bytes.
      def fetch(uri)
        token = ENV["HEAPSCOPE_HTTP_TOKEN"]
        headers = token && !token.empty? ? { "Authorization" => "Bearer #{token}" } : {}
        HttpFetch.new(uri, timeout: @opts[:timeout], max_body: MAX_ANSWER, timeout_flag: "--timeout").get(headers)
      end
    end
  end
end
