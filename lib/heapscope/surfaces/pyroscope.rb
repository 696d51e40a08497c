# frozen_string_literal: true

require "io/wait"
require "securerandom"
require "socket"
require "uri"
require "heapscope/internal"
require "heapscope/http_client"

module Heapscope
  # Pyroscope pushes a heap profile to a Pyroscope server every interval seconds:
  #
  #   POST URL/ingest?name=APP.heap{k=v,...}&from=UNIX&until=UNIX&format=pprof&spyName=heapscope
  #   Content-Type: multipart/form-data; the gzipped pprof is the field "profile".
  #
  # Two background threads, so the application never waits on the network: a collector takes a
  # profile each interval and queues it; a sender posts the queue in order. The queue is bounded
  # (queue_size): when full, the oldest profile is dropped and counted. A failed post (connection
  # refused, timeout, non-2xx) is retried with exponential backoff (min_backoff, 1 s, doubling up to
  # max_backoff, 60 s), warning once per kind of failure. stats counts pushed, failed, dropped and
  # queued.
  #
  # The server is not trusted to be well behaved (issue 11, item 7): each post has deadlines for
  # the whole of each phase (open_timeout to connect, read_timeout to send the profile and receive
  # the answer's status line), not per read, so an answer trickled a byte at a time fails on time;
  # at most MAX_RESPONSE_HEAD bytes of the answer are read and its body never is, so a huge answer
  # costs no memory; and stop abandons a post in flight, so exit waits on the network for at most
  # flush_timeout plus about a second. The client is a few lines on Socket (and OpenSSL for https,
  # verifying the certificate against the system's store) rather than Net::HTTP, whose timeouts
  # are per read and which reads whole bodies; that part is HttpClient, shared with the report
  # commands' GET. Like Net::HTTP it honours http_proxy and no_proxy (never for a loopback server),
  # tunnelling https with CONNECT; proxy: overrides them.
  class Pyroscope
    extend InternalNew
    include HttpClient

    # The most bytes of an answer read: enough for its status line and headers.
    MAX_RESPONSE_HEAD = HttpClient::MAX_RESPONSE_HEAD
    # How often a wait on the network checks whether stop was called.
    WAIT_SLICE = 0.1

    # A post that overran its deadline.
    class TimeoutError < StandardError; end
    # An answer that is not HTTP, or too long before its status line.
    ResponseError = HttpClient::ResponseError
    # Raised inside the sender when stop abandons the post in flight (never escapes).
    class Aborted < StandardError; end

    attr_reader :url, :app_name, :labels

    # Checks a server URL; returns the URI. Raises ArgumentError saying what is wrong (the reason
    # only: EnvConfig words it as "HEAPSCOPE_PYROSCOPE_URL=... is invalid: REASON").
    def self.parse_url(url)
      begin
        uri = URI.parse(url.to_s)
      rescue URI::InvalidURIError
        # (URI's own message only repeats the URL, worded differently from one Ruby to the next.)
        raise ArgumentError, "cannot be parsed as a URL"
      end
      raise ArgumentError, "must be an http:// or https:// URL" unless uri.is_a?(URI::HTTP)
      raise ArgumentError, "has no host" if uri.hostname.to_s.empty?
      raise ArgumentError, "must not have a query or a fragment" if uri.query || uri.fragment
      raise ArgumentError, "port must be from 1 to 65535, got #{uri.port}" unless uri.port.between?(1, 65_535)

      # (URI.parse already rejects user:password@ that is not valid percent-encoding.)
      uri
    end

    # Raises ArgumentError unless token can be sent in a header (nil is no token).
    def self.check_token(token)
      return if token.nil?
      raise ArgumentError, "must not contain control characters such as a newline (it is sent in an HTTP header)" if token.match?(/[\x00-\x1f\x7f]/)
    end

    # url:    the server's base URL (http or https; user:password@ is sent as basic auth).
    # labels: series labels {String => String}; token: sent as Authorization: Bearer.
    # source: anything answering running? and profile(gc:, type:) (Heapscope by default).
    # open_timeout: seconds to connect (and finish TLS); read_timeout: seconds to send a profile
    # and receive the answer's status line. Both bound the whole phase.
    # proxy:  :env (http_proxy and no_proxy, as Net::HTTP), nil (none) or an http:// proxy URL.
    def initialize(url:, app_name:, labels: {}, interval: 60, token: nil, source: nil, queue_size: 8,
                   open_timeout: 5, read_timeout: 10, min_backoff: 1, max_backoff: 60, proxy: :env, warn: nil)
      begin
        @uri = self.class.parse_url(url)
      rescue ArgumentError => e
        raise ArgumentError, "url #{url.inspect} is invalid: #{e.message}"
      end
      begin
        self.class.check_token(token)
      rescue ArgumentError => e
        raise ArgumentError, "token is invalid: #{e.message}"
      end
      raise ArgumentError, "interval must be a number > 0, got #{interval.inspect}" unless interval.is_a?(Numeric) && interval.positive?
      raise ArgumentError, "queue_size must be an Integer >= 1, got #{queue_size.inspect}" unless queue_size.is_a?(Integer) && queue_size >= 1
      [[:open_timeout, open_timeout], [:read_timeout, read_timeout]].each do |name, value|
        raise ArgumentError, "#{name} must be a number > 0, got #{value.inspect}" unless value.is_a?(Numeric) && value.positive?
      end

      # OpenSSL is loaded now, not at the first post: a require after Heapscope.start adds objects to
      # the heap (and took seconds inside a deadline).
      require "openssl" if @uri.scheme == "https"
      @url = url
      @app_name = app_name.to_s
      @labels = labels
      @interval = interval
      @token = token
      @source = source || (require "heapscope"; Heapscope)
      @queue_size = queue_size
      @proxy =
        case proxy
        when :env, nil then proxy
        else
          begin
            self.class.parse_url(proxy).tap { |u| raise ArgumentError, "must be http://" unless u.scheme == "http" }
          rescue ArgumentError => e
            raise ArgumentError, "proxy #{proxy.inspect} is invalid: #{e.message}"
          end
        end
      @open_timeout = open_timeout
      @read_timeout = read_timeout
      @min_backoff = min_backoff
      @max_backoff = max_backoff
      @warn = warn || ->(line) { Kernel.warn(line) }
      @warned = {}
      @counts = Hash.new(0)
      @last_until = Time.now.to_i
      reset_sync
    end

    # Starts the collector and sender threads. Returns self.
    # Both threads exclude themselves from sampling first thing, and what start allocates on the
    # caller's thread runs in Heapscope.internal: the pusher's objects never reach the user's profile.
    def start
      Heapscope.internal do
        @stopping = false
        @collector = Heapscope.start_internal_thread("heapscope-pyroscope-collect") { collect_loop }
        @sender = Heapscope.start_internal_thread("heapscope-pyroscope-send") { send_loop }
        self
      end
    end

    def running?
      [@collector, @sender].all? { |t| t&.alive? }
    end

    # Stops both threads, first giving the sender up to flush_timeout seconds to empty the queue.
    # A post still in flight then is abandoned: it notices within WAIT_SLICE, and a sender stuck
    # elsewhere (a name lookup, a connect) is killed after half a second, so stop returns within
    # about flush_timeout + 1 s whatever the server does.
    def stop(flush_timeout: 0)
      deadline = clock + flush_timeout
      sleep 0.05 while clock < deadline && @sender&.alive? && @sync.synchronize { !@queue.empty? }
      @sync.synchronize do
        @stopping = true
        @wake.broadcast
      end
      @collector&.join(5)
      if @sender && !@sender.join(0.5)
        @sender.kill
        @sender.join(0.5)
      end
      nil
    end

    # Takes a profile now and queues it (the collector thread calls this each interval).
    # Returns true if queued, false if the profiler is not running or profiling failed.
    def collect_now
      return false unless @source.running?

      data = @source.profile(gc: false, type: :heap)
      # Consecutive pushes tile time: each starts where the last ended (whole seconds, from < until).
      from = @last_until
      @last_until = [Time.now.to_i, from + 1].max
      enqueue(from: from, until: @last_until, data: data)
      true
    rescue StandardError => e
      note_failure(e)
      false
    end

    # Counters: pushed, failed (posts that failed and will be retried), dropped (oldest profiles
    # pushed out of the full queue), queued (waiting now).
    def stats
      @sync.synchronize do
        { pushed: @counts[:pushed], failed: @counts[:failed], dropped: @counts[:dropped], queued: @queue.size }
      end
    end

    # The request target for one profile (path and query).
    def ingest_target(from, until_time)
      label_text = @labels.map { |k, v| "#{k}=#{v}" }.join(",")
      query = URI.encode_www_form(
        name: "#{@app_name}.heap{#{label_text}}", from: from, until: until_time, format: "pprof", spyName: "heapscope",
      )
      "#{@uri.path.sub(%r{/+\z}, "")}/ingest?#{query}"
    end

    # Encodes fields {name => [filename, bytes]} as multipart/form-data. Returns [content_type, body].
    def self.multipart(fields)
      boundary = "heapscope-#{SecureRandom.hex(16)}"
      body = +"".b
      fields.each do |name, (filename, bytes)|
        body << "--#{boundary}\r\n" \
                "Content-Disposition: form-data; name=\"#{name}\"; filename=\"#{filename}\"\r\n" \
                "Content-Type: application/octet-stream\r\n\r\n".b
        body << bytes.b << "\r\n".b
      end
      body << "--#{boundary}--\r\n".b
      ["multipart/form-data; boundary=#{boundary}", body]
    end

    # In a forked child: both threads are gone; start again with an empty queue.
    def after_fork
      Heapscope.internal do
        reset_sync
        @counts = Hash.new(0)
        start unless @stopping
      end
    end

    private

    def reset_sync
      @sync = Mutex.new
      @wake = ConditionVariable.new
      @queue = []
    end

    def enqueue(item)
      @sync.synchronize do
        @queue << item
        while @queue.size > @queue_size
          @queue.shift
          @counts[:dropped] += 1
        end
        @wake.broadcast
      end
    end

    def collect_loop
      deadline = clock + @interval
      until wait_until(deadline)
        collect_now
        deadline += @interval while deadline <= clock
      end
    end

    def send_loop
      backoff = 0
      loop do
        item = nil
        @sync.synchronize do
          @wake.wait(@sync) while @queue.empty? && !@stopping
          item = @queue.first
        end
        break if item.nil?

        result = post(item)
        break if result.nil? # abandoned by stop

        if result
          backoff = 0
          @sync.synchronize do
            # It may have been dropped from the full queue meanwhile: remove this very item only.
            index = @queue.index { |queued| queued.equal?(item) }
            @queue.delete_at(index) if index
            @counts[:pushed] += 1
          end
        else
          @sync.synchronize { @counts[:failed] += 1 }
          backoff = backoff.zero? ? @min_backoff : [backoff * 2, @max_backoff].min
          break if wait_until(clock + backoff)
        end
      end
    end

    # Sleeps until deadline or stop; returns true when stopping.
    def wait_until(deadline)
      @sync.synchronize do
        loop do
          return true if @stopping

          left = deadline - clock
          return false if left <= 0

          @wake.wait(@sync, left)
        end
      end
    end

    # Posts one queued profile. Returns true on a 2xx answer, nil when stop abandoned it, false
    # (warned once per kind of failure) otherwise.
    def post(item)
      content_type, body = self.class.multipart("profile" => ["profile.pprof", item[:data]])
      proxy = proxy_uri
      target = ingest_target(item[:from], item[:until])
      # Through a proxy, plain http names the whole URL; https goes through a CONNECT tunnel.
      target = "http://#{@uri.host}:#{@uri.port}#{target}" if proxy && @uri.scheme == "http"
      head = request_head(target, content_type, body.bytesize, proxy)
      io = connect(proxy, clock + @open_timeout)
      deadline = clock + @read_timeout
      write_all(io, head, deadline)
      write_all(io, body, deadline)
      code = read_status(io, deadline)
      return true if code.between?(200, 299)

      note_failure(RuntimeError.new("HTTP #{code} from #{@uri.host}:#{@uri.port}"), "HTTP #{code}")
      false
    rescue Aborted
      nil
    rescue StandardError => e
      note_failure(e)
      false
    ensure
      begin
        io&.close
      rescue StandardError
        nil
      end
    end

    def request_head(target, content_type, length, proxy)
      lines = ["POST #{target} HTTP/1.1", "Host: #{@uri.host}:#{@uri.port}", "Content-Type: #{content_type}",
               "Content-Length: #{length}", "Connection: close"]
      lines << "User-Agent: heapscope/#{Heapscope::VERSION}" if defined?(Heapscope::VERSION)
      # user:password@ in the URL wins over the token (as with Net::HTTP's basic_auth before).
      if @uri.user
        lines << "Authorization: Basic #{basic_credentials(@uri)}"
      elsif @token
        lines << "Authorization: Bearer #{@token}"
      end
      lines << "Proxy-Authorization: Basic #{basic_credentials(proxy)}" if proxy&.user && @uri.scheme == "http"
      "#{lines.join("\r\n")}\r\n\r\n".b
    end

    # Reads the answer up to its status line (skipping interim 1xx answers) and returns the status
    # code. Reads at most MAX_RESPONSE_HEAD bytes; the body is never read.
    def read_status(io, deadline)
      buffer = +"".b
      total = 0
      loop do
        code = parse_status(buffer)
        return code if code
        raise ResponseError, "no status line in the first #{MAX_RESPONSE_HEAD} bytes of the answer" if total >= MAX_RESPONSE_HEAD

        chunk = io.read_nonblock(MAX_RESPONSE_HEAD - total, exception: false)
        case chunk
        when :wait_readable then wait_for(io, :read, deadline, "answer")
        when :wait_writable then wait_for(io, :write, deadline, "answer")
        when nil then raise ResponseError, "the server closed the connection before answering"
        else
          total += chunk.bytesize
          buffer << chunk
        end
      end
    end

    # Waits until io is ready, in slices so that stop is noticed; raises at the deadline.
    def wait_for(io, mode, deadline, phase)
      raw = io.to_io
      loop do
        raise Aborted if @stopping

        left = deadline - clock
        if left <= 0
          limit = phase == "connect" ? "#{@open_timeout} s to connect" : "#{@read_timeout} s to send the profile and get the answer"
          raise TimeoutError, "timed out during #{phase} (the limit is #{limit})"
        end
        slice = [left, WAIT_SLICE].min
        return if mode == :read ? raw.wait_readable(slice) : raw.wait_writable(slice)
      end
    end

    def note_failure(error, kind = error.class)
      return if @warned[kind]

      @warned[kind] = true
      @warn.call("heapscope: Pyroscope push to #{@uri.host}:#{@uri.port} failed: #{error.class}: #{error.message} " \
                 "(retrying with backoff; further #{kind} failures are not reported)")
    end
  end
end
