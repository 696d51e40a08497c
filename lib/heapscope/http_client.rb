# frozen_string_literal: true

require "socket"
require "uri"

module Heapscope
  # HttpClient is the part of an HTTP client that every heapscope client shares (the Pyroscope push
  # and the report commands' GET, Report::HttpFetch): connecting (TLS verified against the system's
  # store, a CONNECT tunnel through an https proxy), writing, and reading a status line, each step
  # bounded by a deadline for the whole of it rather than per read, so a server that trickles bytes
  # fails on time. Written on Socket rather than Net::HTTP, whose timeouts are per read and which
  # reads whole header lines and bodies into memory.
  #
  # The includer provides @uri (the server's URI), @proxy (a URI, nil, or :env for http_proxy and
  # no_proxy as Net::HTTP reads them) and wait_for(io, mode, deadline, phase), which waits until io
  # is ready for mode (:read or :write) and raises when deadline (clock seconds) has passed.
  module HttpClient
    # The most bytes of an answer read before its status line (and a proxy's answer to CONNECT).
    MAX_RESPONSE_HEAD = 16 * 1024

    # An answer that is not HTTP, or too long before its status line.
    class ResponseError < StandardError; end

    # The proxy to go through, or nil: the proxy: option, or with :env (the default) http_proxy
    # and no_proxy as Net::HTTP reads them (never for a loopback server).
    def proxy_uri
      return @proxy unless @proxy == :env

      URI::HTTP.new("http", nil, @uri.host, @uri.port, nil, nil, nil, nil, nil).find_proxy
    rescue URI::Error, SocketError
      nil
    end

    def basic_credentials(uri)
      ["#{URI.decode_www_form_component(uri.user)}:#{URI.decode_www_form_component(uri.password.to_s)}"].pack("m0")
    end

    # A connected socket (TLS for https, verifying the server's certificate and name).
    def connect(proxy, deadline)
      left = deadline - clock
      host, port = proxy ? [proxy.hostname, proxy.port] : [@uri.hostname, @uri.port]
      sock = Socket.tcp(host, port, connect_timeout: left, resolv_timeout: left)
      return sock unless @uri.scheme == "https"

      tunnel(sock, proxy, deadline) if proxy
      context = OpenSSL::SSL::SSLContext.new
      context.set_params(verify_mode: OpenSSL::SSL::VERIFY_PEER)
      ssl = OpenSSL::SSL::SSLSocket.new(sock, context)
      ssl.sync_close = true
      ssl.hostname = @uri.hostname unless @uri.hostname.match?(/\A[\d.]+\z|:/) # SNI takes names only
      loop do
        case ssl.connect_nonblock(exception: false)
        when :wait_readable then wait_for(sock, :read, deadline, "connect")
        when :wait_writable then wait_for(sock, :write, deadline, "connect")
        else break
        end
      end
      ssl.post_connection_check(@uri.hostname)
      ssl
    rescue StandardError
      (ssl || sock)&.close
      raise
    end

    # Asks the proxy for a tunnel to the server; its whole answer head is read (bounded), so TLS
    # starts right after it.
    def tunnel(sock, proxy, deadline)
      authority = "#{@uri.host}:#{@uri.port}"
      lines = ["CONNECT #{authority} HTTP/1.1", "Host: #{authority}"]
      lines << "Proxy-Authorization: Basic #{basic_credentials(proxy)}" if proxy.user
      write_all(sock, "#{lines.join("\r\n")}\r\n\r\n".b, deadline)
      head = +"".b
      until head.include?("\r\n\r\n")
        raise ResponseError, "the proxy's answer to CONNECT is over #{MAX_RESPONSE_HEAD} bytes" if head.bytesize >= MAX_RESPONSE_HEAD

        chunk = sock.read_nonblock(1, exception: false) # byte by byte: not one byte of TLS is taken
        case chunk
        when :wait_readable then wait_for(sock, :read, deadline, "connect")
        when nil then raise ResponseError, "the proxy closed the connection instead of answering CONNECT"
        else head << chunk
        end
      end
      code = parse_status(head)
      raise ResponseError, "the proxy #{proxy.host}:#{proxy.port} answered CONNECT with HTTP #{code}" unless code&.between?(200, 299)
    end

    def write_all(io, data, deadline)
      offset = 0
      while offset < data.bytesize
        written = io.write_nonblock(data.byteslice(offset, 65_536), exception: false)
        case written
        when :wait_writable then wait_for(io, :write, deadline, "send")
        when :wait_readable then wait_for(io, :read, deadline, "send")
        else offset += written
        end
      end
    end

    # The final status code in buffer, or nil while its status line is incomplete.
    def parse_status(buffer)
      loop do
        line_end = buffer.index("\n")
        return nil unless line_end

        line = buffer.byteslice(0, line_end).chomp("\r")
        match = line.match(%r{\AHTTP/\d\.\d (\d{3})(?: |\z)})
        raise ResponseError, "the answer is not HTTP: #{line.byteslice(0, 60).inspect}" unless match

        code = match[1].to_i
        return code unless code.between?(100, 199)

        # An interim answer (100 Continue, 103 Early Hints): drop its head, read on.
        head_end = buffer.index("\r\n\r\n")
        return nil unless head_end

        buffer.slice!(0, head_end + 4)
      end
    end

    def clock
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
