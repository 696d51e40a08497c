# frozen_string_literal: true

# Loaded here, not when the first request needs them: a require after Heapscope.start would put
# heapscope's own objects in the user's profile.
require "heapscope/internal"
require "heapscope/pprof"
require "heapscope/report/sampling"
require "heapscope/report/sites"
require "heapscope/report/census"
require "heapscope/memory"
require "heapscope/surfaces/rack_labels"
require "heapscope/surfaces/rack_prefix"

module Heapscope
  # Heapscope::Rack serves profiles over HTTP with Go's net/http/pprof conventions, so
  # `go tool pprof http://HOST/debug/pprof/heap`, Grafana Alloy and Parca read them unchanged.
  #
  #   # config.ru, as middleware (everything outside /debug/pprof goes to the app):
  #   use Heapscope::Rack
  #   # or as an app of its own, at any mount point:
  #   map("/debug/pprof") { run Heapscope::Rack.app }
  #   # in Rails routes (lib/heapscope/surfaces/rails.rb), behind a constraint the app chooses:
  #   mount Heapscope::Rack.app, at: "/debug/pprof", constraints: ->(req) { req.local? }
  #
  # Endpoints: /debug/pprof/ (index), /debug/pprof/heap, /debug/pprof/allocs.
  # Query: gc=1 runs a full GC first (at most one forced GC per Rack.gc_interval seconds in the
  # process, 10 by default: otherwise the profile is served without one and X-Heapscope-Gc says
  # so); seconds=N returns the change over the next N seconds (1..300, waited on a heapscope thread
  # when the server offers a full rack.hijack, else on the request's thread and at most 30: see
  # rack_delta.rb); debug=1 returns a text top list. Statuses: 200, 400 bad or conflicting parameters, 404 unknown path, 405 not GET/HEAD,
  # 429 a delta is already being computed, or a debug=1 text (see TextLimiter), 503 not running.
  #
  # The rack gem is never required: this is a plain object with #call(env). The standalone
  # listener (lib/heapscope/surfaces/http_server.rb) serves through the same object. Requests for
  # /debug/pprof are heapscope's work on the server's thread, so they run in Heapscope.internal:
  # decoding and ranking a profile never lands in the profiles it serves.
  class Rack
    extend InternalNew

    PREFIX_SLASH = "#{PREFIX}/".freeze
    MAX_SECONDS = 300
    PROFILES = {
      "heap" => "live objects by allocation site: inuse_space/inuse_objects (and alloc_* since start)",
      "allocs" => "the same profile with alloc_space as the default sample type: all sampled allocations",
      "memstats" => "where RSS went, as JSON: Ruby object heap, malloc, the profiled objects, the unexplained rest",
      "retainers" => "who keeps a site's objects alive: ask for a site, retainers?site=FILE:LINE, or run " \
                     "heapscope retainers URL FILE:LINE (paths from a GC root; pauses the application)",
      "examples" => "what a site's live objects hold: ask for a site, examples?site=FILE:LINE, or run heapscope " \
                    "examples URL FILE:LINE (class, size, age and a bounded preview)",
    }.freeze
    # What the index links each profile to: a page that answers as it is (200), so the text top lists
    # for heap and allocs, memstats' JSON, and no link for retainers and examples, which need a site
    # (400 without).
    INDEX_LINKS = { "heap" => "?debug=1", "allocs" => "?debug=1", "memstats" => "" }.freeze

    # GcLimiter bounds the full GCs that HTTP clients can force: one per interval seconds, counted
    # from the end of the previous forced GC. A GC stops the whole process (0.2-1.4 s at 3M objects),
    # so a client looping on ?gc=1 would otherwise stall the application at will. One limiter serves
    # the whole process (GC_LIMITER: every middleware and the standalone listener share it); a
    # forked child starts with a fresh allowance, since it has a heap (and GCs) of its own.
    class GcLimiter
      attr_reader :interval

      def initialize(interval: 10, clock: nil)
        self.interval = interval
        @clock = clock || -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
        @lock = Mutex.new
        @last = nil
        @pid = Process.pid
      end

      # seconds >= 0; 0 turns the limit off.
      def interval=(seconds)
        raise ArgumentError, "gc interval must be a number of seconds >= 0, got #{seconds.inspect}" unless seconds.is_a?(Numeric) && seconds >= 0

        @interval = seconds
      end

      # Books a forced GC. Returns 0 when the caller may force one now (and must call #release after
      # it), or the whole seconds until the next one is allowed.
      def acquire
        @lock.synchronize do
          reset_after_fork
          now = @clock.call
          wait = @last.nil? ? 0 : @last + @interval - now
          next [wait.ceil, 1].max if wait.positive?

          @last = now
          0
        end
      end

      # After the forced GC: the interval counts from its end, so a long GC is not followed at once by the next.
      def release
        @lock.synchronize { @last = @clock.call }
      end

      # Forgets the last forced GC: the next request may force one at once.
      def reset
        @lock.synchronize { @last = nil }
      end

      private

      def reset_after_fork
        return if @pid == Process.pid

        @pid = Process.pid
        @last = nil
      end
    end

    GC_LIMITER = GcLimiter.new

    # The process-wide least number of seconds between two forced GCs (?gc=1), 10 by default.
    def self.gc_interval
      GC_LIMITER.interval
    end

    def self.gc_interval=(seconds)
      GC_LIMITER.interval = seconds
    end

    # A standalone app (no next app): for `run` under map, or `mount` in Rails routes. Its index page
    # links below wherever it is mounted.
    def self.app(source: nil, gc_limiter: nil, text_limiter: nil)
      new(nil, source: source, gc_limiter: gc_limiter, text_limiter: text_limiter)
    end

    # app:        the next Rack app (middleware) or nil (a standalone app: other paths are 404).
    # source:     what profiles come from; anything answering running? and profile(gc:, type:).
    # gc_limiter: the GcLimiter for ?gc=1 (default: the process-wide GC_LIMITER).
    # text_limiter: the TextLimiter for ?debug=1 (default: the process-wide TEXT_LIMITER).
    # labels:     as middleware, label the app's requests with their endpoint (RackLabels); default true.
    def initialize(app = nil, source: nil, gc_limiter: nil, text_limiter: nil, labels: true)
      @app = app
      @labels = app && labels ? RackLabels.new(app) : app
      @source = source || (require "heapscope"; Heapscope)
      @gc_limiter = gc_limiter || GC_LIMITER
      @text_limiter = text_limiter || TEXT_LIMITER
    end

    # A request for the application passes through without allocating (unless the middleware sits
    # under a mount point, which needs the joined path); one for heapscope is answered in
    # Heapscope.internal, so none of its work reaches the profiles it serves.
    def call(env)
      script_name = env["SCRIPT_NAME"].to_s
      path_info = env["PATH_INFO"].to_s
      full = script_name.empty? ? path_info : "#{script_name}#{path_info}"
      ours = full == PREFIX || full.start_with?(PREFIX_SLASH)
      # A standalone app mounted with map("/somewhere"): everything below the mount point is its own.
      # At the root (the standalone listener, or `run` without map) only /debug/pprof is.
      mounted = @app.nil? && !script_name.empty?
      return @labels.call(env) if @app && !ours

      # Where this app's index links point: /debug/pprof, or the mount point it was given.
      base = ours ? PREFIX : script_name
      Heapscope.internal { answer(env, ours ? full[PREFIX.length..] : (path_info if mounted), base) }
    end

    private

    def answer(env, rest, base)
      if rest.nil?
        status, headers, body = text(404, "no such path #{env["PATH_INFO"].to_s.inspect}: heapscope serves #{PREFIX}/, " \
                                          "#{listing(PROFILES.keys.map { |name| "#{PREFIX}/#{name}" })}\n")
      else
        status, headers, body = route(env["REQUEST_METHOD"], rest, env["QUERY_STRING"].to_s,
                                      inline: env["heapscope.inline"], base: base, env: env)
      end
      headers["x-heapscope-pid"] = Process.pid.to_s
      body = [] if env["REQUEST_METHOD"] == "HEAD"
      [status, headers, body]
    end

    # inline: the standalone listener could not start a thread and serves this request on its event
    # loop, which a delta (seconds=N) would hold for N seconds. env: the request's (a delta may take
    # over its socket: rack_delta.rb).
    def route(method, rest, query, inline: false, base: PREFIX, env: {})
      name = rest.delete_prefix("/")
      unless name.empty? || PROFILES.key?(name)
        return text(404, "unknown profile #{name.inspect}: heapscope serves #{listing(PROFILES.keys)}\n")
      end
      unless %w[GET HEAD].include?(method)
        status, headers, body = text(405, "method #{method} not allowed: use GET\n")
        headers["allow"] = "GET, HEAD"
        return [status, headers, body]
      end
      return index(base) if name.empty?

      params = parse_params(query)
      return text(400, "#{params}\n") if params.is_a?(String)
      return memstats(params) if name == "memstats"
      return RetainersEndpoint.call(self, @source, params[:query]) if name == "retainers"
      return ExamplesEndpoint.call(self, @source, params[:query]) if name == "examples"
      return not_running unless @source.running?

      type = name.to_sym
      if params[:seconds]
        if inline
          return text(503, "the listener cannot start a thread to wait #{params[:seconds]}s for a delta profile " \
                           "(thread limit reached?); retry later\n", "retry-after" => "5")
        end

        delta(type, params, env)
      else
        return debug_text(type, params) if params[:debug]

        gc_note = nil
        bytes = with_gc(params[:gc]) do |forced, note|
          gc_note = note
          @source.profile(gc: forced, type: type)
        end
        status, headers, body = binary("#{name}.pb.gz", bytes)
        headers["x-heapscope-gc"] = gc_note if gc_note
        [status, headers, body]
      end
    rescue StandardError => e
      # Heapscope::Error means the profiler stopped between the check and the call.
      return not_running(e.message) if defined?(Heapscope::Error) && e.is_a?(Heapscope::Error)

      text(500, "heapscope: #{e.class}: #{e.message}\n")
    end

    # ?debug=1: the text top list, built under the text limiter (one at a time, a bounded share of a
    # core, yielding the GVL every 0.2 ms: see TextLimiter), else 429 with the reason.
    def debug_text(type, params)
      gc_note = nil
      outcome, value, wait = @text_limiter.run do
        bytes = with_gc(params[:gc]) do |forced, note|
          gc_note = note
          @source.profile(gc: forced, type: type)
        end
        TextReport.render(bytes, type: type, note: gc_comment(gc_note), pace: Pacer.new)
      end
      if outcome == :refused
        return text(429, "#{value}; retry in #{wait}s (the pprof profile, without debug=1, is not limited)\n",
                    "retry-after" => wait.to_s)
      end

      status, headers, body = text(200, value)
      headers["x-heapscope-gc"] = gc_note if gc_note
      [status, headers, body]
    end

    # Parses the query into {gc:, debug:, seconds:}, or returns the reason it is bad (a String).
    # Unknown parameters are ignored, as Go's handler does, so scrapers that add their own work.
    def parse_params(query)
      pairs = query.split("&").reject(&:empty?).map do |pair|
        key, value = pair.split("=", 2)
        [unescape(key), unescape(value.to_s)]
      end
      seen = Hash.new(0)
      pairs.each { |key, _| seen[key] += 1 }
      twice = seen.find { |key, count| count > 1 && %w[gc debug seconds site limit time_limit format keys max].include?(key) }
      return "parameter #{twice[0]} given more than once" if twice

      given = pairs.to_h
      params = { query: given }
      %w[gc debug].each do |key|
        next unless given.key?(key)
        return "#{key} must be 0 or 1, got #{given[key].inspect}" unless %w[0 1].include?(given[key])

        params[key.to_sym] = given[key] == "1"
      end
      params[:gc] ||= false
      if given.key?("seconds")
        value = given["seconds"]
        unless value.match?(/\A\d{1,9}\z/) && Integer(value, 10).between?(1, MAX_SECONDS)
          return "seconds must be an integer from 1 to #{MAX_SECONDS}, got #{value.inspect}"
        end
        return "seconds and debug=1 cannot be combined: a delta profile is only served as pprof" if params[:debug]

        params[:seconds] = Integer(value, 10)
      end
      params
    rescue ArgumentError, EncodingError
      "the query string is not valid percent-encoding"
    end

    # Decodes application/x-www-form-urlencoded text as bytes: every % must start a two-digit hex
    # escape (so "%25" is a literal "%", and "%zz" or a trailing "%" is an error).
    def unescape(text)
      raw = text.b
      raise ArgumentError, "bad escape" if raw.match?(/%(?![0-9A-Fa-f]{2})/n)

      raw.tr("+", " ").gsub(/%([0-9A-Fa-f]{2})/n) { Regexp.last_match(1).hex.chr }
    end

    # Yields (gc?, note) under the rate limit and returns the block's value: gc? is whether to force a
    # GC, note the X-Heapscope-Gc header value ("forced", "skipped; retry-after=N"), nil when no GC
    # was asked for.
    def with_gc(wanted)
      return yield(false, nil) unless wanted

      wait = @gc_limiter.acquire
      return yield(false, "skipped; retry-after=#{wait}") if wait.positive?

      begin
        yield(true, "forced")
      ensure
        @gc_limiter.release
      end
    end

    def gc_comment(note)
      return nil unless note&.start_with?("skipped")

      "gc=1 skipped: at most one forced GC per #{@gc_limiter.interval}s in this process; the next is allowed in " \
        "#{note[/\d+\z/]}s; objects that died since the last GC still count as live"
    end

    HTML_ESCAPES = { "&" => "&amp;", "<" => "&lt;", ">" => "&gt;", '"' => "&quot;", "'" => "&#39;" }.freeze

    def index(base)
      base = base.gsub(/[&<>"']/, HTML_ESCAPES)
      rows = PROFILES.map do |name, what|
        query = INDEX_LINKS[name]
        cell = query ? "<a href=\"#{base}/#{name}#{query}\">#{name}</a>" : name
        "<tr><td>#{cell}</td><td>#{what.gsub(/[&<>"']/, HTML_ESCAPES)}</td></tr>"
      end
      html = <<~HTML
        <!DOCTYPE html>
        <html><head><meta charset="utf-8"><title>heapscope /debug/pprof/</title></head>
        <body><h1>heapscope /debug/pprof/</h1>
        <p>pid #{Process.pid}, profiler #{@source.running? ? "running" : "not running"}.</p>
        <table>#{rows.join}</table>
        <p>Parameters: <code>gc=1</code> runs a full GC first (at most one every #{@gc_limiter.interval} s in this
        process; otherwise the profile is served without one); <code>seconds=N</code> (1..#{MAX_SECONDS})
        returns the change over the next N seconds; <code>debug=1</code> returns a text top list.
        Without <code>debug</code> the response is a gzipped pprof profile:
        <code>go tool pprof http://HOST:PORT#{base}/heap</code> or
        <code>heapscope top http://HOST:PORT#{base}/heap</code>.</p>
        </body></html>
      HTML
      [200, { "content-type" => "text/html; charset=utf-8", "content-length" => html.bytesize.to_s,
              "cache-control" => "no-store" }, [html]]
    end

    # /debug/pprof/memstats: the memory breakdown (memory.rb) as JSON. While the profiler runs, a
    # heap profile is taken (after a GC with gc=1, rate-limited as for /heap) for the profiled objects'
    # bytes; otherwise those are null and the rest is still measured.
    def memstats(params)
      return text(400, "memstats takes no seconds= (it is a snapshot)\n") if params[:seconds]

      parts = nil
      gc_note = nil
      if @source.running?
        bytes = with_gc(params[:gc]) do |forced, note|
          gc_note = note
          @source.profile(gc: forced, type: :heap)
        end
        # The profile's own figures when it has them (heapscope's do), so all of them are one moment's.
        prof = Heapscope::Pprof.decode(bytes)
        parts = Heapscope::Memory.of_profile(prof, Heapscope::Memory.from_comments(prof.comments) || Heapscope::Memory.measure)
      end
      parts ||= Heapscope::Memory.breakdown(Heapscope::Memory.measure)
      body = Heapscope::Memory.to_json(parts, pid: Process.pid)
      headers = { "content-type" => "application/json", "content-length" => body.bytesize.to_s, "cache-control" => "no-store" }
      headers["x-heapscope-gc"] = gc_note if gc_note
      [200, headers, [body]]
    end

    # "a, b and c"
    def listing(names)
      names.size > 1 ? "#{names[0..-2].join(", ")} and #{names[-1]}" : names.join
    end

    def not_running(reason = nil)
      reason ||= switched_off || "heapscope is not running: start it with Heapscope.start or RUBYOPT=-rheapscope/auto"
      text(503, "#{reason}\n")
    end

    # Why heapscope switched itself off (a Ractor started), where it did: "start it" would mislead.
    def switched_off
      why = Heapscope.stats[:off_reason] if defined?(Heapscope::Native)
      why && "heapscope switched itself off: #{why}; this process is not profiled any more"
    end

    def binary(filename, data)
      [200, {
        "content-type" => "application/octet-stream",
        "content-disposition" => "attachment; filename=\"#{filename}\"",
        "content-length" => data.bytesize.to_s,
        "cache-control" => "no-store",
      }, [data]]
    end

    def text(status, message, extra = {})
      message = message.b
      [status, {
        "content-type" => "text/plain; charset=utf-8",
        "content-length" => message.bytesize.to_s,
        "cache-control" => "no-store",
      }.merge(extra), [message]]
    end
  end
end

# seconds=N deltas, ?debug=1's text and its limiter, /debug/pprof/retainers and /debug/pprof/examples
# (after Rack and its GcLimiter are defined).
require "heapscope/surfaces/rack_delta"
require "heapscope/surfaces/rack_text"
require "heapscope/surfaces/rack_retainers"
require "heapscope/surfaces/rack_examples"
