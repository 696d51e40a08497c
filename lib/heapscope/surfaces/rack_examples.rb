# frozen_string_literal: true

require "json"
require "heapscope/examples"
require "heapscope/report/escape"

module Heapscope
  class Rack
    # /debug/pprof/examples?site=FILE:LINE[&max=5][&format=json]: what the site's sampled live objects
    # hold, the oldest first (lib/heapscope/examples.rb), as text or JSON. String bytes and Hash keys
    # appear only where the operator allowed it (show_contents); otherwise classes and sizes only, and
    # no parameter asks for more. Reading the recorder's records holds the GVL for a few ms per
    # million records, so requests share a process-wide allowance, one per LIMITER interval (1 s);
    # others get 429 with Retry-After.
    module ExamplesEndpoint
      MAX_OBJECTS = 20
      LIMITER = GcLimiter.new(interval: 1)
      FORMATS = %w[text json].freeze

      # given: the query's parameters (decoded). Returns [status, headers, body].
      def self.call(rack, source, given)
        options = parse(given)
        return rack.send(:text, 400, "#{options}\n") if options.is_a?(String)
        return rack.send(:text, 404, "this profile source cannot show examples of objects\n") unless source.respond_to?(:examples)
        return rack.send(:not_running) unless source.running?

        wait = LIMITER.acquire
        if wait.positive?
          return rack.send(:text, 429, "examples were read less than #{LIMITER.interval}s ago; retry in #{wait}s\n",
                           "retry-after" => wait.to_s)
        end
        begin
          report = source.examples(options[:site], max: options[:max])
        ensure
          LIMITER.release
        end
        if options[:format] == "json"
          # Class names and (with consent) contents come from the application: invalid UTF-8 is escaped.
          body = "#{JSON.generate(Heapscope::Report::Escape.deep_scrub(report))}\n"
          [200, { "content-type" => "application/json", "content-length" => body.bytesize.to_s, "cache-control" => "no-store" }, [body]]
        else
          rack.send(:text, 200, Heapscope::Examples.text(report))
        end
      rescue ArgumentError => e
        rack.send(:text, 400, "#{e.message}\n")
      end

      # {site:, max:, format:} or the reason the query is bad.
      def self.parse(given)
        site = given["site"]
        return "site is required: ?site=FILE:LINE as heapscope top prints it" if site.nil? || site.strip.empty?
        return "site must be FILE:LINE, got #{site[0, 200].inspect}" unless site.match?(Heapscope::Retainers::SITE)

        max = given.fetch("max", Heapscope::Examples::DEFAULT_MAX.to_s)
        unless max.match?(/\A\d{1,3}\z/) && Integer(max, 10).between?(1, MAX_OBJECTS)
          return "max must be an integer from 1 to #{MAX_OBJECTS}, got #{max[0, 40].inspect}"
        end

        format = given.fetch("format", "text")
        return "format must be text or json, got #{format[0, 40].inspect}" unless FORMATS.include?(format)

        { site: site, max: Integer(max, 10), format: format }
      end
    end
  end
end
