# frozen_string_literal: true

require "heapscope/http_client"
require "heapscope/report/sites"

module Heapscope
  module Report
    # HttpFetch GETs one URL for a report command (retainers, and the profiles top, flamegraph, diff
    # and leaks read from a URL: ProfileUrl), never trusting the server: one deadline covers
    # connecting, sending, the answer's head and its body together, so a server that sends a header
    # line a second, or a body a byte at a time, fails on time; the head may have at most MAX_HEAD
    # bytes in at most MAX_HEADERS lines, and the body at most max_body bytes (Content-Length, chunked
    # or read to the end), so an endless answer costs at most about max_body of memory. Any failure
    # is an Error with one line naming the server. An answer that is not 2xx is only read for its
    # reason: its body is cut at ERROR_BODY bytes, so an endless 500 costs little. check_start: a
    # callable given a 2xx answer's first bytes (at least START_BYTES, or the whole body if shorter)
    # that raises ResponseError to refuse the answer there, so an endless body of something else is
    # refused at its start, not at max_body.
    #
    #   HttpFetch.new(uri, timeout: 30, max_body: 16 << 20).get("authorization" => "Bearer x")
    #   # => Response(code: 200, headers: {"content-type" => "text/plain"}, body: "...")
    class HttpFetch
      include HttpClient

      MAX_HEAD = 64 * 1024
      MAX_HEADERS = 100
      READ_SIZE = 64 * 1024
      ERROR_BODY = 64 * 1024
      START_BYTES = 16

      # code: Integer; headers: {lowercase name => value}, the last of repeated ones; body: binary String.
      Response = Struct.new(:code, :headers, :body)

      # The deadline passed (raised inside, turned into an Error by get).
      class Late < StandardError; end

      # timeout: seconds for the whole exchange; max_body: bytes; timeout_flag and size_flag: the flags
      # that raise the timeout and max_body, named in the messages (nil: none); name: how messages name
      # the server (default HOST:PORT); check_start: see above.
      def initialize(uri, timeout:, max_body:, timeout_flag: nil, size_flag: nil, name: nil, check_start: nil)
        @uri = uri
        @proxy = :env
        @timeout = timeout
        @max_body = max_body
        @timeout_flag = timeout_flag
        @size_flag = size_flag
        @name = name
        @check_start = check_start
      end

      # Sends the GET with these extra headers and returns the Response, whatever its status.
      def get(headers = {})
        require "openssl" if @uri.scheme == "https"
        deadline = clock + @timeout
        proxy = proxy_uri
        io = connect(proxy, deadline)
        write_all(io, request_head(headers, proxy), deadline)
        buf = +"".b
        code, fields = read_head(io, buf, deadline)
        @success = code.between?(200, 299)
        @limit = @success ? @max_body : ERROR_BODY
        @started = !(@success && @check_start)
        Response.new(code, fields, read_body(io, buf, fields, deadline))
      rescue Late
        raise Error, "#{server}: no complete answer within #{format("%g", @timeout)} s" \
                     "#{" (#{@timeout_flag} SECONDS raises it)" if @timeout_flag}"
      rescue HttpClient::ResponseError => e
        raise Error, "#{server}: #{e.message}"
      rescue SystemCallError, IOError, SocketError => e
        raise Error, "cannot reach #{server}: #{e.message}"
      rescue StandardError => e
        raise unless defined?(OpenSSL::SSL::SSLError) && e.is_a?(OpenSSL::SSL::SSLError)

        raise Error, "cannot reach #{server}: #{e.message}"
      ensure
        io&.close
      end

      private

      def server
        @name || "#{@uri.host}:#{@uri.port}"
      end

      def request_head(headers, proxy)
        # Through a proxy, plain http names the whole URL; https goes through a CONNECT tunnel.
        authority = "#{@uri.host}:#{@uri.port}"
        target = proxy && @uri.scheme == "http" ? "http://#{authority}#{@uri.request_uri}" : @uri.request_uri
        lines = ["GET #{target} HTTP/1.1", "Host: #{authority}", "Accept-Encoding: identity", "Connection: close"]
        lines << "User-Agent: heapscope/#{Heapscope::VERSION}" if defined?(Heapscope::VERSION)
        headers.each { |k, v| lines << "#{k}: #{v}" }
        lines << "Proxy-Authorization: Basic #{basic_credentials(proxy)}" if proxy&.user && @uri.scheme == "http"
        "#{lines.join("\r\n")}\r\n\r\n".b
      end

      # Reads up to the end of the final head (interim 1xx answers skipped by parse_status); returns
      # [code, headers] and leaves what follows the head in buf.
      def read_head(io, buf, deadline)
        loop do
          code = parse_status(buf)
          head_end = code && buf.index("\r\n\r\n")
          if head_end
            fields = parse_headers(buf.byteslice(0, head_end))
            buf.slice!(0, head_end + 4)
            return [code, fields]
          end
          raise ResponseError, "the answer's head is over #{MAX_HEAD / 1024} KiB" if buf.bytesize >= MAX_HEAD
          check_header_count(buf.count("\n"))
          fill(io, buf, deadline, MAX_HEAD - buf.bytesize) or raise ResponseError, "the server closed the connection mid-answer"
        end
      end

      def parse_headers(head)
        lines = head.split("\r\n").drop(1)
        check_header_count(lines.size)
        lines.to_h do |line|
          name, value = line.split(":", 2)
          raise ResponseError, "a header line of the answer is not NAME: VALUE: #{line.byteslice(0, 60).inspect}" unless value

          [name.strip.downcase, value.strip]
        end
      end

      def check_header_count(count)
        raise ResponseError, "the answer has more than #{MAX_HEADERS} header lines" if count > MAX_HEADERS + 1
      end

      def read_body(io, buf, fields, deadline)
        if fields["transfer-encoding"].to_s.downcase.include?("chunked")
          read_chunked(io, buf, deadline)
        elsif (length = fields["content-length"])
          n = /\A\d{1,20}\z/.match?(length) ? length.to_i : raise(ResponseError, "bad Content-Length #{length[0, 40].inspect}")
          if n > @limit
            too_large("#{n} bytes, ") if @success
            n = @limit # an error's reason: its start is enough
          end
          while buf.bytesize < n
            check_start(buf)
            next if fill(io, buf, deadline, n - buf.bytesize)

            raise ResponseError, "the answer ended after #{buf.bytesize} of its #{n} bytes"
          end

          check_start(buf, whole: true)
          buf.byteslice(0, n)
        else
          while fill(io, buf, deadline, @limit + 1 - buf.bytesize)
            check_start(buf)
            next unless buf.bytesize > @limit
            return buf.byteslice(0, @limit) unless @success

            too_large
          end
          check_start(buf, whole: true)
          buf
        end
      end

      # Chunked transfer coding: size line, data, CRLF, up to a zero size (trailers ignored).
      def read_chunked(io, buf, deadline)
        body = +"".b
        loop do
          check_start(body)
          line_end = buf.index("\r\n")
          unless line_end
            raise ResponseError, "a chunk size line of the answer is over 1 KiB" if buf.bytesize > 1024

            fill(io, buf, deadline, READ_SIZE) or raise ResponseError, "the answer ended inside a chunk"
            next
          end
          size = buf.byteslice(0, line_end)[/\A\h{1,15}(?=\s*(;|\z))/] or
            raise ResponseError, "bad chunk size line #{buf.byteslice(0, [line_end, 40].min).inspect}"
          size = size.to_i(16)
          if size.zero?
            check_start(body, whole: true)
            return body
          end
          if body.bytesize + size > @limit
            return body unless @success

            too_large
          end
          need = line_end + 2 + size + 2
          while buf.bytesize < need
            fill(io, buf, deadline, need - buf.bytesize) or raise ResponseError, "the answer ended inside a chunk"
          end
          body << buf.byteslice(line_end + 2, size)
          buf.slice!(0, need)
        end
      end

      # Hands the body's first bytes to check_start once: when START_BYTES are in, or at its end.
      def check_start(body, whole: false)
        return if @started || (body.bytesize < START_BYTES && !whole)

        @started = true
        @check_start.call(body)
      end

      def too_large(size = nil)
        raise ResponseError, "the answer's body is #{size}over the #{Pprof.size_text(@max_body)} limit" \
                             "#{" (#{@size_flag} SIZE raises it)" if @size_flag}"
      end

      # Appends at most max bytes read from io; false at the end of the answer.
      def fill(io, buf, deadline, max)
        loop do
          chunk = io.read_nonblock([[max, 1].max, READ_SIZE].min, exception: false)
          case chunk
          when :wait_readable then wait_for(io, :read, deadline, "answer")
          when :wait_writable then wait_for(io, :write, deadline, "answer")
          when nil then return false
          else
            buf << chunk
            return true
          end
        end
      end

      # HttpClient's wait: the one deadline, whatever the phase.
      def wait_for(io, mode, deadline, _phase)
        left = deadline - clock
        raise Late if left <= 0

        raw = io.to_io
        ready = mode == :read ? raw.wait_readable(left) : raw.wait_writable(left)
        raise Late unless ready
      end
    end
  end
end
