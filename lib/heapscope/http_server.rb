# frozen_string_literal: true

require "socket"
require "io/wait"
require "heapscope/rack"

module Heapscope
  # HttpServer is the standalone /debug/pprof/ listener for processes without a Rack server
  # (Sidekiq, scripts): one background accept thread and one short-lived thread per connection,
  # stdlib sockets only. It serves through Heapscope::Rack, so both surfaces answer alike.
  #
  #   server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 6060).start
  #   server.url  # => "http://127.0.0.1:6060/debug/pprof/"
  #
  # Defences against slow or hostile clients, each answered with its own status before closing:
  #   - at most max_connections at once (503 beyond; the excess is closed at once),
  #   - the request line and headers must arrive within read_timeout seconds (408),
  #   - request line <= 8 KiB (414), headers <= 16 KiB and 100 lines (431), no body (413),
  #   - a response that the client does not read within write_timeout seconds is abandoned,
  #   - one request per connection (connection: close), so no idle keep-alive sockets.
  # A non-loopback host needs a token; with a token every request must carry
  # "Authorization: Bearer TOKEN" (401 otherwise).
  class HttpServer
    MAX_REQUEST_LINE = 8192
    MAX_HEADER_BYTES = 16_384
    MAX_HEADER_LINES = 100
    REASONS = {
      200 => "OK", 400 => "Bad Request", 401 => "Unauthorized", 404 => "Not Found",
      405 => "Method Not Allowed", 408 => "Request Timeout", 413 => "Content Too Large",
      414 => "URI Too Long", 429 => "Too Many Requests", 431 => "Request Header Fields Too Large",
      500 => "Internal Server Error", 503 => "Service Unavailable",
    }.freeze

    # Raised when the request cannot be read; status is what the client is told.
    class RequestError < StandardError
      attr_reader :status

      def initialize(status, message)
        super(message)
        @status = status
      end
    end

    attr_reader :host, :token

    def initialize(host: "127.0.0.1", port: 6060, token: nil, app: nil, max_connections: 8,
                   read_timeout: 10, write_timeout: 30, fork_mode: :offset)
      require "heapscope/env_config"
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
      @max_connections = max_connections
      @read_timeout = read_timeout
      @write_timeout = write_timeout
      @fork_mode = fork_mode
      @server = nil
      @thread = nil
      @lock = Mutex.new
      @active = 0
    end

    # Binds and starts the accept thread. Raises SystemCallError (e.g. Errno::EADDRINUSE) if the
    # address cannot be bound. Returns self.
    def start
      @server ||= TCPServer.new(@host, @base_port)
      @port = @server.addr[1]
      @thread = Thread.new(@server) { |server| accept_loop(server) }
      @thread.name = "heapscope-http" if @thread.respond_to?(:name=)
      self
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

    # Closes the listening socket; the accept thread ends. Connections in flight finish.
    def stop
      server = @server
      @server = nil
      server&.close
      @thread&.join(2)
      @thread = nil
      nil
    rescue IOError
      nil
    end

    # Called in a forked child (whose threads are gone). :offset binds the first free port above
    # the parent's, :same accepts on the inherited socket too (the kernel spreads connections),
    # :off closes the child's copy. Returns self, or nil when the child serves nothing.
    def after_fork
      @lock = Mutex.new
      @active = 0
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

    private

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

    def accept_loop(server)
      loop do
        sock = server.accept
        if admit
          Thread.new(sock) { |s| serve(s) }
        else
          refuse(sock)
        end
      rescue IOError, Errno::EBADF
        break # closed by stop
      rescue SystemCallError
        sleep 0.05 # e.g. EMFILE: back off instead of spinning
      end
    end

    def admit
      @lock.synchronize do
        return false if @active >= @max_connections

        @active += 1
        true
      end
    end

    # Answers 503 from the accept thread itself, so refusing costs no thread; the short linger
    # keeps the client's unread request from turning the answer into a connection reset.
    def refuse(sock)
      respond(sock, 503, { "content-type" => "text/plain", "retry-after" => "1" }, ["too many connections\n"], 1)
    rescue StandardError
      nil
    ensure
      linger_close(sock, 0.1)
    end

    # Half-closes, reads what the client still sends (up to 64 KiB, until deadline), then closes:
    # closing a socket with unread input makes the kernel send a reset, which can destroy the
    # response before the client reads it.
    def linger_close(sock, seconds)
      sock.shutdown(Socket::SHUT_WR)
      deadline = clock + seconds
      drained = 0
      while drained < 65_536
        chunk = sock.read_nonblock(4096, exception: false)
        break if chunk.nil?

        if chunk == :wait_readable
          left = deadline - clock
          break if left <= 0 || !sock.wait_readable(left)
        else
          drained += chunk.bytesize
        end
      end
    rescue StandardError
      nil
    ensure
      sock.close unless sock.closed?
    end

    def serve(sock)
      Thread.current.report_on_exception = false
      begin
        method, target, headers = read_request(sock)
        if @token && !authorized?(headers["authorization"])
          return respond(sock, 401, { "content-type" => "text/plain", "www-authenticate" => "Bearer realm=\"heapscope\"" },
                         ["missing or wrong Authorization: Bearer token\n"])
        end

        path, query = target.split("?", 2)
        env = {
          "REQUEST_METHOD" => method, "SCRIPT_NAME" => "", "PATH_INFO" => path, "QUERY_STRING" => query.to_s,
          "SERVER_NAME" => @host, "SERVER_PORT" => port.to_s, "rack.url_scheme" => "http",
        }
        status, out_headers, body = @app.call(env)
        respond(sock, status, out_headers, body, head: method == "HEAD")
      rescue RequestError => e
        respond(sock, e.status, { "content-type" => "text/plain" }, ["#{e.message}\n"])
      end
    rescue StandardError
      nil # a client that went away must not disturb the application
    ensure
      linger_close(sock, 1)
      @lock.synchronize { @active -= 1 }
    end

    # Reads the request line and headers within read_timeout. Returns [method, target, headers].
    def read_request(sock)
      deadline = clock + @read_timeout
      buffer = +""
      until (head_end = buffer.index("\r\n\r\n"))
        line_end = buffer.index("\r\n")
        raise RequestError.new(414, "request line longer than #{MAX_REQUEST_LINE} bytes") if (line_end || buffer.bytesize) > MAX_REQUEST_LINE
        raise RequestError.new(431, "request headers larger than #{MAX_HEADER_BYTES} bytes") if buffer.bytesize > MAX_HEADER_BYTES

        chunk = read_some(sock, deadline)
        raise RequestError.new(400, "connection closed before the request ended") if chunk.nil?

        buffer << chunk
      end
      raise RequestError.new(431, "request headers larger than #{MAX_HEADER_BYTES} bytes") if head_end > MAX_HEADER_BYTES

      request_line, *lines = buffer[0, head_end].split("\r\n")
      raise RequestError.new(414, "request line longer than #{MAX_REQUEST_LINE} bytes") if request_line.bytesize > MAX_REQUEST_LINE
      raise RequestError.new(431, "more than #{MAX_HEADER_LINES} header lines") if lines.size > MAX_HEADER_LINES

      match = %r{\A([A-Z]{1,16}) (/[^ ]*) HTTP/1\.[01]\z}.match(request_line)
      raise RequestError.new(400, "malformed request line") unless match

      headers = {}
      lines.each do |line|
        name, value = line.split(":", 2)
        raise RequestError.new(400, "malformed header line") if value.nil? || !name.match?(/\A[!#$%&'*+\-.^_`|~0-9A-Za-z]+\z/)

        headers[name.downcase] = value.strip
      end
      if headers["transfer-encoding"] || headers["content-length"].to_s.match?(/[1-9]/)
        raise RequestError.new(413, "request bodies are not accepted")
      end

      [match[1], match[2], headers]
    end

    def read_some(sock, deadline)
      loop do
        return sock.read_nonblock(4096)
      rescue IO::WaitReadable
        left = deadline - clock
        raise RequestError.new(408, "request not received within #{@read_timeout}s") if left <= 0

        sock.wait_readable(left)
      rescue EOFError
        return nil
      end
    end

    def authorized?(header)
      given = header.to_s[/\ABearer (.+)\z/, 1]
      return false if given.nil? || given.bytesize != @token.bytesize

      # Constant time, so the comparison does not leak how much of the token matched.
      given.bytes.zip(@token.bytes).reduce(0) { |acc, (a, b)| acc | (a ^ b) }.zero?
    end

    # Writes the whole response within timeout seconds. A HEAD answer keeps the app's content-length.
    def respond(sock, status, headers, body, timeout = @write_timeout, head: false)
      chunks = []
      body.each { |chunk| chunks << chunk.b }
      body.close if body.respond_to?(:close)
      payload = chunks.join
      length = payload.bytesize
      out = +"HTTP/1.1 #{status} #{REASONS.fetch(status, "Status")}\r\n"
      headers.each do |name, value|
        if name.casecmp?("content-length")
          length = value.to_i if head
          next
        end
        next if name.casecmp?("connection")

        value.to_s.split("\n").each { |v| out << "#{name}: #{v}\r\n" }
      end
      out << "content-length: #{length}\r\nconnection: close\r\n\r\n"
      write_all(sock, out.b + payload, clock + timeout)
    end

    def write_all(sock, data, deadline)
      until data.empty?
        begin
          written = sock.write_nonblock(data)
          data = data.byteslice(written..)
        rescue IO::WaitWritable
          left = deadline - clock
          return false if left <= 0

          sock.wait_writable(left)
        end
      end
      true
    end

    def clock
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
