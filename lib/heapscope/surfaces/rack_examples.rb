# frozen_string_literal: true

require "heapscope/examples"
require "heapscope/surfaces/rack_site_endpoint"

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

      # given: the query's parameters (decoded). Returns [status, headers, body].
      def self.call(rack, source, given)
        options = parse(given)
        return rack.send(:text, 400, "#{options}\n") if options.is_a?(String)
        return rack.send(:text, 404, "this profile source cannot show examples of objects\n") unless source.respond_to?(:examples)
        return rack.send(:not_running) unless source.running?

        SiteEndpoint.answer(rack, LIMITER, "examples were read less than #{LIMITER.interval}s ago", options[:format],
                            Heapscope::Examples.method(:text)) do
          source.examples(options[:site], max: options[:max])
        end
      end

      # {site:, max:, format:} or the reason the query is bad.
      def self.parse(given)
        site, problem = SiteEndpoint.site(given)
        return problem if problem

        max = given.fetch("max", Heapscope::Examples::DEFAULT_MAX.to_s)
        unless max.match?(/\A\d{1,3}\z/) && Integer(max, 10).between?(1, MAX_OBJECTS)
          return "max must be an integer from 1 to #{MAX_OBJECTS}, got #{max[0, 40].inspect}"
        end

        format, problem = SiteEndpoint.format(given)
        return problem if problem

        { site: site, max: Integer(max, 10), format: format }
      end
    end
  end
end
