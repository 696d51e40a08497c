# frozen_string_literal: true

require "socket"

module Heapscope
  # The pieces of the standalone listener (lib/heapscope/surfaces/http_server.rb): one connection's state
  # machine, the response bytes, and the worker pool. Nothing here blocks: the listener's single
  # event-loop thread drives every socket, so no client can hold it up.
  module Http
    # Raised when a request cannot be read; status is what the client is told.
    class RequestError < StandardError
      attr_reader :status

      def initialize(status, message)
        super(message)
        @status = status
      end
    end

    Request = Struct.new(:method, :target, :headers)

    # Serializes responses. Every response carries connection: close (one request per connection).
    module Response
      REASONS = {
        200 => "OK", 400 => "Bad Request", 401 => "Unauthorized", 404 => "Not Found",
        405 => "Method Not Allowed", 408 => "Request Timeout", 413 => "Content Too Large",
        414 => "URI Too Long", 429 => "Too Many Requests", 431 => "Request Header Fields Too Large",
        500 => "Internal Server Error", 503 => "Service Unavailable",
      }.freeze

      # The whole response as one binary string. A HEAD answer keeps the app's content-length and
      # sends no body.
      def self.build(status, headers, body, head: false)
        chunks = []
        begin
          body.each { |chunk| chunks << chunk.b }
        ensure
          body.close if body.respond_to?(:close)
        end
        payload = head ? "".b : chunks.join.b
        length = chunks.sum(&:bytesize)
        out = +"HTTP/1.1 #{status} #{REASONS.fetch(status, "Status")}\r\n"
        headers.each do |name, value|
          if name.casecmp?("content-length")
            length = value.to_i if head
            next
          end
          next if name.casecmp?("connection")

          # A CR or LF inside a value would let it forge headers; Rack allows several values split by LF.
          value.to_s.split("\n").each { |v| out << "#{name}: #{v.delete("\r")}\r\n" }
        end
        out << "content-length: #{length}\r\nconnection: close\r\n\r\n"
        out.b << payload
      end

      # The listener's own replies (401, 4xx for bad requests, 408, 503) carry the same cache-control
      # and pid headers as the profile responses, as docs/http-endpoints.md promises for every response.
      def self.text(status, message, extra = {}, head: false)
        body = "#{message}\n".b
        headers = {
          "content-type" => "text/plain; charset=utf-8", "cache-control" => "no-store",
          "x-heapscope-pid" => Process.pid.to_s,
        }.merge(extra)
        build(status, headers, [body], head: head)
      end
    end

    # One client socket and where it is in its life: :reading the request head, :dispatched (the app
    # is computing its answer on a worker), :writing the answer, :lingering (half-closed, draining
    # what the client still sends so that closing does not reset the connection and destroy the
    # answer). The event loop owns it; nothing here blocks.
    class Connection
      MAX_REQUEST_LINE = 8192
      MAX_HEADER_BYTES = 16_384
      MAX_HEADER_LINES = 100
      MAX_DRAIN = 65_536
      CHUNK = 4096
      TOKEN = /\A[!#$%&'*+\-.^_`|~0-9A-Za-z]+\z/.freeze
      LINE_END = /\r?\n/n.freeze
      HEAD_END = /\r?\n\r?\n/n.freeze

      attr_reader :sock, :state
      # When the loop acts on this connection next (408, abandon a write, end a linger); nil: never.
      attr_accessor :deadline
      # True while the request counts against the listener's max_requests (dispatched or writing
      # the app's answer). Such a connection carries an admitted request and is never evicted.
      attr_accessor :in_flight
      # True for a connection the listener said goodbye to (evicted or refused beyond its limits) and
      # lets linger: it no longer counts against max_connections and is never evicted again.
      attr_accessor :goodbye

      def initialize(sock, deadline)
        @sock = sock
        @state = :reading
        @deadline = deadline
        @buffer = +"".b
        @scanned = 0
        @in_flight = false
      end

      # Reads what has arrived. Returns a Request once the head is complete, nil while more is
      # needed, :eof when the client closed without sending anything; raises RequestError for a bad
      # or oversized request and SystemCallError/IOError when the socket fails.
      def read_request
        chunk = @sock.read_nonblock(CHUNK, exception: false)
        return nil if chunk == :wait_readable
        return :eof if chunk.nil? && @buffer.empty?
        raise RequestError.new(400, "connection closed before the request ended") if chunk.nil?

        @buffer << chunk
        parse
      end

      def dispatch!
        @state = :dispatched
        @deadline = nil
        @buffer = nil
      end

      def start_write(bytes)
        @state = :writing
        @out = bytes
        @buffer = nil
      end

      # Writes what the socket takes now; true once everything is written.
      def write_some
        written = @sock.write_nonblock(@out, exception: false)
        return false if written == :wait_writable

        @out = @out.byteslice(written..)
        @out.empty?
      end

      def start_linger
        @state = :lingering
        @out = nil
        @drained = 0
        @sock.shutdown(Socket::SHUT_WR)
      end

      # Reads and drops what the client still sends; true when it is done (EOF or enough read).
      def drain
        loop do
          chunk = @sock.read_nonblock(CHUNK, exception: false)
          return false if chunk == :wait_readable
          return true if chunk.nil?

          @drained += chunk.bytesize
          return true if @drained >= MAX_DRAIN
        end
      end

      def close
        @sock.close unless @sock.closed?
      rescue IOError, SystemCallError
        nil
      end

      private

      def parse
        # Reject what cannot become a request line at once (TLS handshakes, binary noise), instead of
        # holding the connection until the header timeout.
        unless @buffer.byteslice(0, 17).match?(/\A[A-Z]{1,16}(?: |\z)/)
          raise RequestError.new(400, "malformed request line")
        end

        # Lines end in CRLF, or in a bare LF, which RFC 9112 (section 2.2) lets a recipient accept
        # (printf and nc send those; waiting for a CRLF that never comes gave them 408 after 5 s).
        # The search resumes where the last one stopped (less 3 bytes, an end split between reads), so a
        # client trickling its head byte by byte costs one pass over it, not one per byte.
        head_end = @buffer.index(HEAD_END, @scanned)
        unless head_end
          @scanned = [@buffer.bytesize - 3, 0].max
          line_end = @buffer.index("\n")
          raise RequestError.new(414, "request line longer than #{MAX_REQUEST_LINE} bytes") if (line_end || @buffer.bytesize) > MAX_REQUEST_LINE
          raise RequestError.new(431, "request headers larger than #{MAX_HEADER_BYTES} bytes") if @buffer.bytesize > MAX_HEADER_BYTES

          return nil
        end
        raise RequestError.new(431, "request headers larger than #{MAX_HEADER_BYTES} bytes") if head_end > MAX_HEADER_BYTES

        request_line, *lines = @buffer[0, head_end].split(LINE_END)
        # A CR not followed by LF is not a line end, and RFC 9112 forbids passing it on.
        raise RequestError.new(400, "bare CR in the request head") if request_line.include?("\r") || lines.any? { |l| l.include?("\r") }
        raise RequestError.new(414, "request line longer than #{MAX_REQUEST_LINE} bytes") if request_line.bytesize > MAX_REQUEST_LINE
        raise RequestError.new(431, "more than #{MAX_HEADER_LINES} header lines") if lines.size > MAX_HEADER_LINES

        # The target in origin form, printable ASCII only (RFC 9112: anything else is percent-encoded).
        match = %r{\A([A-Z]{1,16}) (/[\x21-\x7e]*) HTTP/1\.[01]\z}n.match(request_line)
        raise RequestError.new(400, "malformed request line") unless match

        headers = {}
        lines.each do |line|
          name, value = line.split(":", 2)
          raise RequestError.new(400, "malformed header line") if value.nil? || !name.match?(TOKEN)

          headers[name.downcase] = value.strip
        end
        if headers["transfer-encoding"] || headers["content-length"].to_s.match?(/[1-9]/)
          raise RequestError.new(413, "request bodies are not accepted")
        end

        Request.new(match[1], match[2], headers)
      end
    end
  end
end
