# frozen_string_literal: true

require "heapscope/retainers"
require "heapscope/surfaces/rack_site_endpoint"

module Heapscope
  class Rack
    # /debug/pprof/retainers?site=FILE:LINE[&limit=3][&time_limit=1][&format=json][&keys=1]: who keeps
    # the site's sampled live objects alive (lib/heapscope/retainers.rb), as text or JSON. Hash keys are
    # named by class; keys=1 shows their contents only where the operator allowed it (show_contents):
    # they may be data (session ids, tokens), and whoever reaches the listener is not the operator
    # (403 otherwise). The walk pauses
    # the application for up to time_limit seconds (at most MAX_TIME_LIMIT here), so requests share a
    # process-wide allowance, one walk per LIMITER interval (10 s); others get 429 with Retry-After.
    module RetainersEndpoint
      MAX_TIME_LIMIT = 5.0
      LIMITER = GcLimiter.new(interval: 10)
      NO_CONSENT = "keys=1 shows Hash keys' contents, which may be data (session ids, tokens): the operator has not " \
                   "allowed it. Leave keys out to see keys by class, or start heapscope with show_contents: true " \
                   "(HEAPSCOPE_SHOW_CONTENTS=1, config.heapscope.show_contents = true)\n"

      def self.consented?(source)
        source.respond_to?(:show_contents?) && source.show_contents? == true
      end

      # given: the query's parameters (decoded). Returns [status, headers, body].
      def self.call(rack, source, given)
        options = parse(given)
        return rack.send(:text, 400, "#{options}\n") if options.is_a?(String)
        return rack.send(:text, 404, "this profile source cannot walk the heap for retainers\n") unless source.respond_to?(:retainers)
        return rack.send(:not_running) unless source.running?
        return rack.send(:text, 403, NO_CONSENT) if options[:keys] && !consented?(source)

        busy = "a retainers walk ran less than #{LIMITER.interval}s ago (it pauses the application)"
        SiteEndpoint.answer(rack, LIMITER, busy, options[:format], Heapscope::Retainers.method(:text)) do
          source.retainers(options[:site], limit: options[:limit], time_limit: options[:time_limit], keys: options[:keys])
        end
      end

      # {site:, limit:, time_limit:, format:} or the reason the query is bad.
      def self.parse(given)
        site, problem = SiteEndpoint.site(given)
        return problem if problem

        limit = given.fetch("limit", "3")
        return "limit must be an integer from 1 to 100, got #{limit[0, 40].inspect}" unless limit.match?(/\A\d{1,3}\z/) && Integer(limit, 10).between?(1, 100)

        time_limit = given.fetch("time_limit", "1")
        unless time_limit.match?(/\A\d{1,2}(\.\d{1,3})?\z/) && Float(time_limit).positive? && Float(time_limit) <= MAX_TIME_LIMIT
          return "time_limit must be seconds above 0 and at most #{MAX_TIME_LIMIT}, got #{time_limit[0, 40].inspect}"
        end

        format, problem = SiteEndpoint.format(given)
        return problem if problem

        keys = given.fetch("keys", "0")
        return "keys must be 0 or 1, got #{keys[0, 40].inspect}" unless %w[0 1].include?(keys)

        { site: site, limit: Integer(limit, 10), time_limit: Float(time_limit), format: format, keys: keys == "1" }
      end
    end
  end
end
