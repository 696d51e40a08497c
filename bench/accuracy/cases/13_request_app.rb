# frozen_string_literal: true

module Accuracy
  module Cases
    # A request-serving app: a Rack app under Puma (in this process, 4 threads), four endpoints, two
    # client threads on keep-alive connections. Orders are kept for good (a store that grows), sessions
    # in a bounded ring (churn with a live tail), report pages in a short ring, search hits are garbage.
    # The app's site lines run on Puma's threads at once, so the sites are shared (make takes a lock).
    class RequestApp < SyntheticCase
      register "request_app", "a Rack app under Puma: four endpoints, two clients, kept and churned data"

      REQUESTS = 4_000
      PER_ORDER = 12   # order records (and their notes) per /order request
      HITS = 40        # garbage strings per /search request
      PER_SESSION = 10 # session entries per /session request
      SESSIONS = 3_000 # the session ring
      PAGES = 50       # the report ring
      PATHS = %w[/order /search /session /report].freeze

      def setup
        Accuracy.require_group(:surfaces, %w[puma puma/server net/http])
        @fill = Array.new(129) { |n| ("r" * n).freeze }
        @page_text = ("<tr><td>row</td></tr>" * 400).freeze
        @order = site(:order_record, Hash, shared: true) { |k, n| k.new.merge!(n) }
        @note = site(:order_note, String, shared: true) { |k, n| k.new << @fill[n] }
        @hit = site(:search_hit, String, shared: true) { |k, n| k.new << @fill[n] }
        @session = site(:session_entry, Array, shared: true) { |k, n| k.new(n) }
        @page = site(:report_page, String, shared: true) { |k, s| k.new << s }
        @template = { status: :new, total: 0 }.freeze
        @orders = []
        @sessions = Array.new(SESSIONS)
        @pages = Array.new(PAGES)
        @served = Hash.new(0)
        start_server
      end

      def start_server
        app = lambda do |env|
          i = @served[env["PATH_INFO"]] += 1
          case env["PATH_INFO"]
          when "/order" then PER_ORDER.times { |j| @orders << [@order.make(@template), @note.make((i + j) & 127)] }
          when "/search" then HITS.times { |j| @hit.make((i * j) & 127) }
          when "/session" then PER_SESSION.times { |j| @sessions[(i * PER_SESSION + j) % SESSIONS] = @session.make(j & 3) }
          when "/report" then @pages[i % PAGES] = @page.make(@page_text)
          end
          [200, { "content-type" => "text/plain", "content-length" => "2" }, ["ok"]] # Puma may change what it gets
        end
        @server = Puma::Server.new(app, nil, min_threads: 4, max_threads: 4, log_writer: Puma::LogWriter.null)
        @server.add_tcp_listener("127.0.0.1", 0)
        @port = @server.connected_ports.first
        @server.run
      end

      def work
        errors = 0
        clients = Array.new(2) do |c|
          Thread.new do
            http = Net::HTTP.start("127.0.0.1", @port)
            (REQUESTS / 2 * @scale).round.times do |i|
              http.get(PATHS[(i + c) % PATHS.size]).value
            rescue Net::HTTPBadResponse, EOFError, Errno::ECONNRESET
              # Now and then Net::HTTP reads a keep-alive response out of step with Puma's. The request
              # was served (the sites counted what it made), so the client only reconnects; the notes
              # count these.
              errors += 1
              http.finish if http.started?
              http.start
            end
            http.finish
          end
        end
        clients.each(&:join)
        @notes["requests"] = @served.values.sum
        @notes["client_reconnects"] = errors
        @server.stop(true)
      end
    end
  end
end
