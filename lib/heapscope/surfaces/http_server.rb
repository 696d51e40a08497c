# frozen_string_literal: true

require "socket"
require "uri"
require "heapscope/internal"
require "heapscope/env_config"
require "heapscope/surfaces/rack"
require "heapscope/surfaces/http/connection"
require "heapscope/surfaces/http/worker_pool"

module Heapscope
  # HttpServer is the standalone /debug/pprof/ listener for processes without a Rack server
  # (Sidekiq, scripts), stdlib sockets only. It serves through Heapscope::Rack, so both surfaces
  # answer alike.
  #
  #   server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 6060).start
  #   server.url  # => "http://127.0.0.1:6060/debug/pprof/"
  #
  # One thread runs an IO.select event loop over the listening socket and every client socket:
  # accepting, reading request heads, checking the token, writing answers and closing all happen
  # there without ever blocking on a client, so idle, trickling or garbage connections cost a slot
  # each and delay nobody. Only admitted requests reach the app, on a small pool of long-lived
  # worker threads (Http::WorkerPool; the loop serves a request itself when no thread can be
  # started). Defences, each answered with its own status before closing:
  #   - at most max_connections open client sockets (default 1024, or a quarter of the open-file
  #     limit if lower); at the limit a new connection evicts the oldest one that has no admitted
  #     request (idle, still sending, or being answered with an error): 503 to it, and a lingering
  #     close for up to GOODBYE_LINGERS such goodbyes at once,
  #   - the request line and headers must arrive within read_timeout seconds (408),
  #   - request line <= 8 KiB (414), headers <= 16 KiB and 100 lines (431), no body (413),
  #     bytes that cannot start a request line get 400 at once,
  #   - at most max_requests admitted requests at once, being computed or written (503 beyond),
  #   - an answer that the client does not read within write_timeout seconds is abandoned,
  #   - one request per connection (connection: close), so no idle keep-alive sockets.
  # A non-loopback host needs a token; with a token every request must carry
  # "Authorization: Bearer TOKEN" (401 otherwise; the scheme is case-insensitive). query_token: true
  # also accepts ?token=TOKEN in the target, for pages a browser opens (`heapscope ui`: a browser
  # cannot send a header when following a link); the profile listener keeps to the header.
  #
  # None of this shows in the application's profiles: the loop and worker threads exclude themselves
  # from sampling as they start (Heapscope.exclude_thread), and start and after_fork, which run on the
  # caller's thread (the socket, the thread objects), run in Heapscope.internal.
  class HttpServer
    extend InternalNew

    MAX_REQUEST_LINE = Http::Connection::MAX_REQUEST_LINE
    MAX_HEADER_BYTES = Http::Connection::MAX_HEADER_BYTES
    MAX_HEADER_LINES = Http::Connection::MAX_HEADER_LINES
    REASONS = Http::Response::REASONS
    RequestError = Http::RequestError

    # New connections accepted per loop turn, so a flood cannot starve the sockets already open.
    ACCEPT_BATCH = 64
    # The listener's own short replies (4xx, 503) get this long to be written.
    REPLY_TIMEOUT = 5
    # How long a closing connection drains what the client still sends (see Connection#drain).
    LINGER_SECONDS = 1
    # An app that has not answered after this long loses its connection (a delta waits up to 300 s).
    APP_TIMEOUT = Heapscope::Rack::MAX_SECONDS + 300
    # Connections over max_connections that may exist at once to be refused with a full 503.
    REFUSALS = 16
    # Evicted or refused connections that may linger at once after their one-write 503 (half-closed,
    # draining what the client still sends), so that a request still on its way when the 503 went out
    # does not reset the connection and destroy the 503 (CI saw a burst of clients get resets). Beyond
    # these, a goodbye closes at once. They hold a descriptor each for at most LINGER_SECONDS.
    GOODBYE_LINGERS = 64
    # Deadlines are checked at most this often: a scan of every connection per expiry would be
    # quadratic under a flood.
    SWEEP_EVERY = 0.05

    # The default cap on open client sockets: 1024, or a quarter of the soft open-file limit when that
    # is lower, so the listener alone can never exhaust the application's descriptors.
    def self.default_max_connections
      soft = Process.getrlimit(:NOFILE).first
      (soft / 4).clamp(16, 1024)
    rescue StandardError
      256
    end

    attr_reader :host, :token, :max_connections

    def initialize(host: "127.0.0.1", port: 6060, token: nil, app: nil, max_connections: nil, max_requests: 8,
                   workers: 2, read_timeout: 5, write_timeout: 30, fork_mode: :offset, query_token: false)
      if token.nil? && !EnvConfig::HttpAddress.loopback?(host)
        raise ArgumentError, "refusing to serve profiles on non-loopback address #{host} without a token " \
                             "(set HEAPSCOPE_HTTP_TOKEN or pass token:)"
      end
      unless %i[offset same off].include?(fork_mode)
        raise ArgumentError, "fork_mode must be :offset, :same or :off, got #{fork_mode.inspect}"
      end

      @host = host
      @base_port = port
      @token = token
      @app = app || Heapscope::Rack.new
      @max_connections = max_connections || self.class.default_max_connections
      @max_requests = max_requests
      @workers = workers
      @read_timeout = read_timeout
      @write_timeout = write_timeout
      @fork_mode = fork_mode
      @query_token = query_token
      @server = nil
      @thread = nil
      @conns = nil
    end

    # Binds and starts the loop thread. Raises SystemCallError (e.g. Errno::EADDRINUSE) if the
    # address cannot be bound, or Errno::EAGAIN if no thread can be started. Returns self.
    def start
      Heapscope.internal do
        @server ||= TCPServer.new(@host, @base_port)
        @port = @server.addr[1]
        reset_state
        begin
          @thread = Heapscope.start_internal_thread("heapscope-http") { run }
        rescue ThreadError => e
          # At the thread limit: fail like a bind failure, which callers already handle (autostart says
          # "cannot listen: ...; the listener is off" and the application runs on).
          close_own_ios
          @server.close
          @server = nil
          raise Errno::EAGAIN, "cannot start the listener thread (#{e.message})"
        end
        self
      end
    end

    def running?
      !@thread.nil? && @thread.alive?
    end

    # The bound port (useful with port 0); after stop, the port it had.
    def port
      @port || @base_port
    end

    def url
      shown = @host.include?(":") ? "[#{@host}]" : @host
      "http://#{shown}:#{port}#{Heapscope::Rack::PREFIX}/"
    end

    # Closes the listening socket and every connection (answers in flight are cut off); workers end
    # after their current job.
    def stop
      @stopping = true
      wake
      @thread&.join(2)
      @thread = nil
      close_own_ios
      server = @server
      @server = nil
      server&.close
      nil
    rescue IOError
      nil
    end

    # Called in a forked child (whose threads are gone). :offset binds the first free port above the
    # parent's, :same accepts on the inherited socket too (the kernel spreads connections), :off
    # closes the child's copy. Returns self, or nil when the child serves nothing.
    def after_fork
      Heapscope.internal { restart_after_fork }
    end

    private

    def restart_after_fork
      # The child's copies of the parent's client sockets would keep those connections open after
      # the parent closes them.
      @conns&.each_key { |sock| sock.close rescue nil } # rubocop:disable Style/RescueModifier
      @conns = nil
      close_own_ios
      @thread = nil
      case @fork_mode
      when :same
        start
      when :off
        @server&.close
        @server = nil
        nil
      else
        parent_port = port
        @server&.close
        @server = nil
        @server = bind_after(parent_port)
        start
      end
    end

    # The first free port after base (up to 100 tries); port 0 stays ephemeral.
    def bind_after(base)
      return TCPServer.new(@host, 0) if @base_port.zero?

      last_error = nil
      (base + 1..[base + 100, 65_535].min).each do |candidate|
        return TCPServer.new(@host, candidate)
      rescue Errno::EADDRINUSE, Errno::EACCES => e
        last_error = e
      end
      raise last_error || Errno::EADDRINUSE.new("no free port after #{base}")
    end

    def reset_state
      close_own_ios
      @conns = {}.compare_by_identity # insertion order is accept order: the oldest come first
      @goodbyes = 0 # of @conns: lingering after a goodbye, not counted against max_connections
      @in_flight = 0
      @stopping = false
      @wake_r, @wake_w = IO.pipe # workers write a byte here to wake the loop when an answer is ready
      @done = Thread::Queue.new
      @pool = Http::WorkerPool.new(size: @workers)
      @next_sweep = clock + 1
      @accept_after = nil
      @watch = nil
    end

    def close_own_ios
      [@wake_r, @wake_w].each { |io| io.close if io && !io.closed? }
      @wake_r = @wake_w = nil
      @pool&.shutdown
    end

    def run
      Thread.current.report_on_exception = false
      until @stopping
        begin
          step
        rescue IOError, Errno::EBADF
          break if @stopping || @server.nil? || @server.closed?

          recover
        rescue StandardError
          recover # a bug must not end the listener
        end
      end
    ensure
      @conns.each_value(&:close)
      @conns.clear
      @goodbyes = 0
      @pool.shutdown
    end

    # After an unexpected error: forget connections whose sockets got closed on the way, rebuild what
    # IO.select watches, and pause a moment so that an error that persists cannot spin.
    def recover
      @conns.each_value.select { |conn| conn.sock.closed? }.each { |conn| close(conn) }
      changed!
      sleep 0.01
    rescue StandardError
      nil
    end

    def step
      now = clock
      if @accept_after && now >= @accept_after
        @accept_after = nil
        changed!
      end
      readers, writers = (@watch ||= watch_lists)
      timeout = (@next_sweep - now).clamp(0, 1.0)
      timeout = [timeout, @accept_after - now].min if @accept_after
      ready = IO.select(readers, writers, nil, [timeout, 0].max)
      if ready
        # Sockets already open first: a complete request is admitted (and so protected from
        # eviction) before the new connections of this turn are accepted.
        ready[0].each do |io|
          next if io.equal?(@server)

          if io.equal?(@wake_r)
            @wake_r.read_nonblock(4096, exception: false)
          elsif (conn = @conns[io])
            on_readable(conn)
          end
        end
        ready[1].each { |io| (conn = @conns[io]) && on_writable(conn) }
        accept_some if ready[0].include?(@server)
      end
      finish_answers
      sweep if clock >= @next_sweep
    end

    # What IO.select watches, rebuilt only when a connection changes state or comes or goes: most
    # wake-ups (a trickled byte) change nothing, and rebuilding costs a pass over every connection.
    def watch_lists
      readers = [@wake_r]
      readers << @server unless @accept_after
      writers = []
      @conns.each_value do |conn|
        case conn.state
        when :reading, :lingering then readers << conn.sock
        when :writing then writers << conn.sock
        end
      end
      [readers, writers]
    end

    def changed!
      @watch = nil
    end

    def accept_some
      ACCEPT_BATCH.times do
        sock = @server.accept_nonblock(exception: false)
        break if sock == :wait_readable

        admit(sock)
      end
    rescue Errno::EMFILE, Errno::ENFILE, Errno::ENOBUFS, Errno::ENOMEM
      # Out of descriptors: give one of ours back and pause accepting a moment, instead of spinning
      # on a listening socket that stays readable.
      evict_oldest(linger: false)
      @accept_after = clock + 0.1
      changed!
    rescue Errno::ECONNABORTED, Errno::EPROTO, Errno::EINTR
      nil
    end

    def admit(sock)
      conn = Http::Connection.new(sock, nil)
      if open_count >= @max_connections && !evict_oldest
        # Every connection carries an admitted request. A few refusals at a time get a full reply
        # (written and lingered like any other); beyond those, one write and a goodbye.
        return goodbye(sock, 503, "too many connections", { "retry-after" => "1" }) if open_count >= @max_connections + REFUSALS

        @conns[sock] = conn
        changed!
        return reply(conn, 503, "too many connections", { "retry-after" => "1" })
      end
      set_deadline(conn, clock + @read_timeout)
      @conns[sock] = conn
      changed!
    end

    # Client connections that count against max_connections: all but the lingering goodbyes.
    def open_count
      @conns.size - @goodbyes
    end

    # Closes the oldest connection without an admitted request (idle, still sending its head, or
    # getting an error reply) that is not a goodbye already. Returns false when there is none.
    # linger: false when its descriptor is wanted back at once (the process is out of them).
    def evict_oldest(linger: true)
      victim = @conns.each_value.find { |conn| !conn.in_flight && !conn.goodbye }
      return false unless victim

      @conns.delete(victim.sock)
      changed!
      goodbye(victim.sock, 503, "closed: the listener is at its limit of #{@max_connections} open connections",
              { "retry-after" => "1" }, linger: linger)
      true
    end

    # A best-effort reply that costs the loop one non-blocking write, then a linger (up to
    # GOODBYE_LINGERS at once) or a close.
    def goodbye(sock, status, message, extra = {}, linger: true)
      sock.read_nonblock(65_536, exception: false) # what was sent already: unread input makes close reset
      sock.write_nonblock(Http::Response.text(status, message, extra), exception: false)
      return linger_goodbye(sock) if linger && @goodbyes < GOODBYE_LINGERS
    rescue IOError, SystemCallError
      nil
    ensure
      sock.close unless sock.closed? || @conns.key?(sock)
    end

    def linger_goodbye(sock)
      conn = Http::Connection.new(sock, nil)
      conn.goodbye = true
      conn.start_linger
      return if conn.drain # the client already closed: the ensure above closes

      @conns[sock] = conn
      @goodbyes += 1
      set_deadline(conn, clock + LINGER_SECONDS)
      changed!
    end

    def on_readable(conn)
      if conn.state == :lingering
        close(conn) if conn.drain
        return
      end
      request = conn.read_request
      if request == :eof
        close(conn)
      elsif request
        handle(conn, request)
      end
    rescue Http::RequestError => e
      reply(conn, e.status, e.message)
    rescue IOError, SystemCallError
      close(conn)
    end

    def handle(conn, request)
      head = request.method == "HEAD"
      if @token && !authorized?(request.headers["authorization"]) && !(@query_token && query_authorized?(request.target))
        return reply(conn, 401, @query_token ? "missing or wrong token (Authorization: Bearer TOKEN, or ?token=TOKEN)" : "missing or wrong Authorization: Bearer token",
                     { "www-authenticate" => "Bearer realm=\"heapscope\"" }, head: head)
      end
      if @in_flight >= @max_requests
        return reply(conn, 503, "too many requests at once (at most #{@max_requests}); retry", { "retry-after" => "1" }, head: head)
      end

      @in_flight += 1
      conn.in_flight = true
      conn.dispatch!
      changed!
      set_deadline(conn, clock + APP_TIMEOUT)
      path, query = request.target.split("?", 2)
      env = {
        "REQUEST_METHOD" => request.method, "SCRIPT_NAME" => "", "PATH_INFO" => path, "QUERY_STRING" => query.to_s,
        "SERVER_NAME" => @host, "SERVER_PORT" => port.to_s, "rack.url_scheme" => "http",
        "heapscope.listener" => true, # a delta waits on this worker, up to Rack::MAX_SECONDS
      }
      done = @done
      job = lambda do
        done << [conn, render(env, head)]
        wake
      end
      return if @pool.submit(job)

      # No worker thread and none can be started: answer from the loop itself. Heapscope::Rack then
      # refuses what would hold the loop (a seconds= delta) with 503.
      env["heapscope.inline"] = true
      job.call
    end

    def render(env, head)
      status, headers, body = @app.call(env)
      Http::Response.build(status, headers, body, head: head)
    rescue StandardError => e
      Http::Response.text(500, "heapscope: #{e.class}: #{e.message}")
    end

    # Answers computed by workers, handed over through @done.
    def finish_answers
      until @done.empty?
        conn, bytes = @done.pop
        next unless @conns[conn.sock].equal?(conn) # closed meanwhile (stop, timeout)

        conn.start_write(bytes)
        changed!
        set_deadline(conn, clock + @write_timeout)
        on_writable(conn) # most answers fit in the socket buffer at once
      end
    end

    # The listener's own reply; the connection stays evictable.
    def reply(conn, status, message, extra = {}, head: false)
      conn.start_write(Http::Response.text(status, message, extra, head: head))
      changed!
      set_deadline(conn, clock + REPLY_TIMEOUT)
      on_writable(conn)
    end

    def on_writable(conn)
      return unless conn.write_some

      release(conn)
      changed!
      conn.start_linger
      set_deadline(conn, clock + LINGER_SECONDS)
      close(conn) if conn.drain
    rescue IOError, SystemCallError
      close(conn)
    end

    def sweep
      now = clock
      upcoming = now + 1
      @conns.values.each do |conn|
        deadline = conn.deadline
        next unless deadline

        if deadline <= now
          if conn.state == :reading
            reply(conn, 408, "request not received within #{@read_timeout}s")
          else
            close(conn) # an unread answer, a finished linger, or an app that never answered
          end
          deadline = conn.deadline if @conns.key?(conn.sock)
        end
        upcoming = deadline if deadline && deadline > now && deadline < upcoming
      end
      @next_sweep = [upcoming, now + SWEEP_EVERY].max
    end

    def set_deadline(conn, time)
      conn.deadline = time
      @next_sweep = time if time < @next_sweep
    end

    def release(conn)
      return unless conn.in_flight

      conn.in_flight = false
      @in_flight -= 1
    end

    def close(conn)
      @goodbyes -= 1 if @conns.delete(conn.sock) && conn.goodbye
      changed!
      release(conn)
      conn.close
    end

    def wake
      @wake_w&.write_nonblock("x", exception: false)
    rescue IOError, SystemCallError
      nil
    end

    def authorized?(header)
      # RFC 7235: the scheme is case-insensitive and followed by one or more spaces.
      token_matches?(header.to_s[/\Abearer +(.+)\z/i, 1])
    end

    # ?token=TOKEN (percent-encoded) in the request target.
    def query_authorized?(target)
      query = target.split("?", 2)[1] or return false
      given = URI.decode_www_form(query).find { |k, _| k == "token" }&.last
      token_matches?(given)
    rescue ArgumentError
      false
    end

    def token_matches?(given)
      return false if given.nil? || given.bytesize != @token.bytesize

      # Constant time, so the comparison does not leak how much of the token matched.
      given.bytes.zip(@token.bytes).reduce(0) { |acc, (a, b)| acc | (a ^ b) }.zero?
    end

    def clock
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
