# frozen_string_literal: true

require "uri"
require "heapscope/report/top"
require "heapscope/report/diff"
require "heapscope/report/flamegraph"
require "heapscope/report/retainers"
require "heapscope/surfaces/http_server"
require "heapscope/ui/sources"
require "heapscope/ui/timeline"
require "heapscope/ui/page"

module Heapscope
  module UI
    # App answers the ui's requests (a Rack app, served by the listener's hardened HttpServer: its caps
    # on request size, its timeouts, worker pool and token check):
    #
    #   GET /                          the page (timeline, top table, diff, leaks)
    #   GET /api/timeline              every series' timeline (UI::Timeline), and how many files wait
    #   GET /api/top?snap=ID           one snapshot's top table with errors (Report::Top)
    #   GET /api/diff?base=ID&new=ID   what changed between two snapshots (Report::Diff)
    #   GET /flame?snap=ID             the snapshot's flame graph page (Report::Flamegraph)
    #   GET /diff?base=ID&new=ID       the diff's flame graph page
    #   GET /api/labels?snap=ID        the snapshot's user labels and their values (for the filters)
    #   GET /api/retainers?snap=ID&site=FILE:LINE   who holds the site, asked of a live snapshot's process
    #
    # /api/top, /api/diff, /flame and /diff take label=KEY=VALUE, repeatable: only the samples with
    # every label given (Report::Labels, as --label). /api/timeline with labels adds each series' live
    # bytes carrying them ("selected", from the summaries' label sets) beside the whole heap's.
    #
    # Snapshots are named by the ids /api/timeline gives, never by a path (Sources). An unknown
    # path is 404, an unknown or missing parameter 400, an unknown snapshot 404, a profile that cannot be
    # read (gone, or an older live snapshot) 404 with the reason.
    class App
      ROUTES = {
        "/" => [:page, []], "/api/timeline" => [:timeline, []], "/api/top" => [:top, %w[snap]],
        "/api/diff" => [:diff, %w[base new]], "/flame" => [:flame, %w[snap]], "/diff" => [:diff_page, %w[base new]],
        "/api/labels" => [:labels, %w[snap]], "/api/retainers" => [:retainers, %w[snap site]],
      }.freeze
      # Parameters any page may carry besides its own: the token (checked by the server) and label filters.
      OPTIONAL = %w[token label].freeze
      LABEL_VALUES = 100 # values listed per label key
      # Every answer: never cached, never framed by another site, no script or request but the page's own.
      HEADERS = {
        "cache-control" => "no-store", "x-content-type-options" => "nosniff", "x-frame-options" => "DENY",
        "content-security-policy" => "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; " \
                                     "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'",
      }.freeze
      TOP_ROWS = 30
      # How long a timeline request waits for profiles still being read before answering with what is ready.
      WAIT_SECONDS = 1.0

      # A request the ui refuses: status and message, as the listener's own (Http::RequestError).
      BadRequest = Http::RequestError

      def initialize(sources, refresh:)
        @sources = sources
        @refresh = refresh
        @timelines = {} # [series name, filters] => [version, json, built at]: rebuilt only when the series changed
        @lock = Mutex.new
      end

      def call(env)
        method = env["REQUEST_METHOD"]
        raise BadRequest.new(405, "only GET and HEAD") unless %w[GET HEAD].include?(method)

        action, wanted = ROUTES[env["PATH_INFO"]]
        raise BadRequest.new(404, "no such page: #{env["PATH_INFO"]}") unless action

        send(action, params(env["QUERY_STRING"], wanted))
      rescue BadRequest => e
        text(e.status, e.message)
      rescue Report::Error => e
        text(404, e.message)
      end

      private

      # The query's parameters: exactly the wanted ones (and the token the server checked already).
      # "label" is a list of Report::Labels::Filter, possibly empty.
      def params(query, wanted)
        given = URI.decode_www_form(query.to_s)
        given.each do |key, _|
          raise BadRequest.new(400, "unknown parameter #{key}") unless wanted.include?(key) || OPTIONAL.include?(key)
        end
        labels = given.select { |key, _| key == "label" }.map { |_, v| Report::Labels.parse_filter(v) }
        given = given.to_h.merge("label" => labels)
        wanted.each { |key| raise BadRequest.new(400, "missing parameter #{key}") if given[key].to_s.empty? }
        given
      rescue ArgumentError
        raise BadRequest.new(400, "malformed query")
      rescue Report::Error => e
        raise BadRequest.new(400, e.message)
      end

      def snapshot(id)
        raise BadRequest.new(400, "a snapshot id is a number, got #{id.inspect[0, 40]}") unless id.match?(/\A\d{1,18}\z/)

        @sources.snapshot(id) or raise BadRequest.new(404, "no snapshot #{id} (the page may be out of date: reload it)")
      end

      def page(_)
        html(Page.render)
      end

      def timeline(query)
        filters = query["label"]
        if (own = filters.find { |f| f.key.match?(Report::Labels::RESERVED) })
          raise BadRequest.new(400, "the timeline follows user labels (Heapscope.with_labels); #{own.key} is heapscope's own " \
                                    "(the top table and diff take label=#{own.key}=VALUE)")
        end
        # While profiles are being read, wait a moment for the rest: the page then gets the whole
        # timeline as soon as it is ready rather than at its next poll.
        deadline = clock + WAIT_SECONDS
        sleep 0.02 while @sources.pending.positive? && clock < deadline
        # Read before the series: a summary finished in between must not make a partial timeline
        # look complete (the page polls again while something is pending).
        pending = @sources.pending
        series = @sources.series.map do |s|
          @lock.synchronize do
            cached = @timelines[[s.name, filters.map(&:to_s)]]
            # A partial timeline is rebuilt at most once a second: each summary changes the series, and
            # rebuilding at every poll would take the time the summaries need.
            fresh = cached && (cached[0] == s.version || (pending.positive? && clock - cached[2] < 1))
            next cached[1] if fresh

            built = Timeline.build(s, @sources.table, filters)
            # One filtered timeline kept besides the whole one: the page asks for the filter it shows.
            @timelines.delete_if { |(name, f), _| name == s.name && !f.empty? } unless filters.empty?
            @timelines[[s.name, filters.map(&:to_s)]] = [s.version, built, clock]
            built
          end
        end
        json("series" => series, "pending" => pending, "refresh" => @refresh)
      end

      def top(query)
        snap = snapshot(query["snap"])
        prof = @sources.profile(snap)
        data = Report::Top.report(prof, path: label(snap), sample: "inuse_space", n: TOP_ROWS, labels: query["label"])
        json(data.merge("snapshot" => snap.id, "live" => !@sources.url_of(snap).nil?))
      end

      def diff(query)
        base, newer, opts = pair(query)
        json(Report::Diff.report(base, newer, **opts))
      end

      def flame(query)
        snap = snapshot(query["snap"])
        html(Report::Flamegraph.html(@sources.profile(snap), path: label(snap), sample: "inuse_space", labels: query["label"]))
      end

      def diff_page(query)
        base, newer, opts = pair(query)
        html(Report::Diff.html(base, newer, **opts))
      end

      # {"labels" => [{"key", "values" => [[value, samples]...]}]}, most frequent values first.
      def labels(query)
        snap = snapshot(query["snap"])
        found = Report::Labels.values([@sources.profile(snap)])
        json("labels" => found.sort.map do |key, values|
          { "key" => key, "values" => values.sort_by { |v, n| [-n, v] }.first(LABEL_VALUES), "more" => values.size > LABEL_VALUES }
        end)
      end

      # The retainers of a site, as `heapscope retainers URL FILE:LINE` prints them (text), from the
      # process a live snapshot came from (the walk runs there, bounded by its own limits).
      def retainers(query)
        snap = snapshot(query["snap"])
        url = @sources.url_of(snap) or raise BadRequest.new(400, "retainers are asked of a live process: this snapshot is a file's")
        site = query["site"]
        raise BadRequest.new(400, "site must be FILE:LINE") unless site.match?(/\A[^\x00-\x1f]{1,4096}:\d{1,9}\z/)

        process = Report::ProfileUrl.parse(url)
        process.path = process.path.delete_suffix("/heap") # Retainers adds /retainers to the prefix
        process.query = nil
        uri, response = Report::Retainers.new([process.to_s, site, "--timeout", "30"]).answer
        body = Report::Escape.scrub(response.body)
        if response.code == 200
          lines = body.lines.map { |line| Report::Escape.terminal(line.chomp) }
          return [200, HEADERS.merge("content-type" => "text/plain; charset=utf-8"), ["#{lines.join("\n")}\n"]]
        end

        text(response.code == 404 ? 404 : 400, "#{uri.host}:#{uri.port} answered #{response.code}: #{body.lines.first.to_s.chomp[0, 200]}")
      end

      # [base profile, new profile, the keywords Diff.report and Diff.html take] of a diff's query.
      def pair(query)
        base = snapshot(query["base"])
        newer = snapshot(query["new"])
        raise BadRequest.new(400, "base and new are the same snapshot") if base.equal?(newer)

        [@sources.profile(base), @sources.profile(newer),
         { base_path: label(base), new_path: label(newer), sample: "inuse_space", labels: query["label"] }]
      end

      # How reports name a snapshot: its file, or its series and fetch time for a live one.
      def label(snap)
        snap.path || "#{snap.series} at #{Time.at(snap.fetched_at).utc.strftime("%H:%M:%S")}"
      end

      def clock
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end

      def html(body)
        [200, HEADERS.merge("content-type" => "text/html; charset=utf-8"), [body]]
      end

      def json(data)
        [200, HEADERS.merge("content-type" => "application/json"), [Report::Escape.script_json(data)]]
      end

      def text(status, message)
        [status, HEADERS.merge("content-type" => "text/plain; charset=utf-8"), ["#{Report::Escape.terminal(message)}\n"]]
      end
    end

    # Server is the running ui: the sources, polled and summarized in the background, behind an
    # HttpServer (loopback only unless a token is given, as the profile listener).
    class Server
      attr_reader :sources, :http

      def initialize(sources, host: "127.0.0.1", port: 0, token: nil, refresh: 10)
        @sources = sources
        @http = HttpServer.new(host: host, port: port, token: token, app: App.new(sources, refresh: refresh),
                               # 4 workers: a retainers walk (up to 30 s) or a timeline waiting for
                               # summaries must not hold up the page's other requests.
                               fork_mode: :off, query_token: true, workers: 4, max_requests: 8)
      end

      # Binds first (a port in use fails before any helper is forked or URL fetched), then starts the
      # sources; if they fail (a URL that does not answer), stops serving again.
      def start
        @http.start
        begin
          @sources.start
        rescue StandardError
          @http.stop
          raise
        end
        self
      end

      def url
        @http.url.sub(%r{#{Heapscope::Rack::PREFIX}/\z}o, "/")
      end

      def stop
        @http.stop
        @sources.stop
      end
    end
  end
end
