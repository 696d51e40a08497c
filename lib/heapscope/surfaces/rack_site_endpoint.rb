# frozen_string_literal: true

require "json"
require "heapscope/retainers"
require "heapscope/report/escape"

module Heapscope
  class Rack
    # What the endpoints about one site (retainers, examples) share: reading ?site= and ?format=, one
    # request at a time under a process-wide limiter (429 with Retry-After), and the answer as text or
    # as JSON whose strings (names and contents from the application's objects) are made valid UTF-8.
    module SiteEndpoint
      FORMATS = %w[text json].freeze

      # The site (FILE:LINE) of the query, or the reason it is bad (a String starting "site").
      def self.site(given)
        site = given["site"]
        return [nil, "site is required: ?site=FILE:LINE as heapscope top prints it"] if site.nil? || site.strip.empty?
        return [nil, "site must be FILE:LINE, got #{site[0, 200].inspect}"] unless site.match?(Heapscope::Retainers::SITE)

        [site, nil]
      end

      # [format, nil] or [nil, the reason it is bad].
      def self.format(given)
        format = given.fetch("format", "text")
        return [nil, "format must be text or json, got #{format[0, 40].inspect}"] unless FORMATS.include?(format)

        [format, nil]
      end

      # Runs the block (which builds the report) under limiter, then answers: text(report) or JSON.
      # busy: the 429 message's start, before "; retry in Ns".
      def self.answer(rack, limiter, busy, format, text)
        wait = limiter.acquire
        return rack.send(:text, 429, "#{busy}; retry in #{wait}s\n", "retry-after" => wait.to_s) if wait.positive?

        begin
          report = yield
        ensure
          limiter.release
        end
        return rack.send(:text, 200, text.call(report)) unless format == "json"

        body = "#{JSON.generate(Heapscope::Report::Escape.deep_scrub(report))}\n"
        [200, { "content-type" => "application/json", "content-length" => body.bytesize.to_s, "cache-control" => "no-store" }, [body]]
      rescue ArgumentError => e
        rack.send(:text, 400, "#{e.message}\n")
      end
    end
  end
end
