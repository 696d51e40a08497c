# frozen_string_literal: true

require "securerandom"
require "uri"

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
  # max_backoff, 60 s),
  # warning once per kind of failure. stats counts pushed, failed, dropped and queued.
  class Pyroscope
    attr_reader :url, :app_name, :labels

    # url:    the server's base URL (http or https; user:password@ is sent as basic auth).
    # labels: series labels {String => String}; token: sent as Authorization: Bearer.
    # source: anything answering running? and profile(gc:, type:) (Heapscope by default).
    def initialize(url:, app_name:, labels: {}, interval: 60, token: nil, source: nil, queue_size: 8,
                   open_timeout: 5, read_timeout: 10, min_backoff: 1, max_backoff: 60, warn: nil)
      @uri = URI.parse(url)
      raise ArgumentError, "url must be http:// or https://, got #{url.inspect}" unless @uri.is_a?(URI::HTTP) && @uri.host
      raise ArgumentError, "interval must be a number > 0, got #{interval.inspect}" unless interval.is_a?(Numeric) && interval.positive?
      raise ArgumentError, "queue_size must be an Integer >= 1, got #{queue_size.inspect}" unless queue_size.is_a?(Integer) && queue_size >= 1

      @url = url
      @app_name = app_name.to_s
      @labels = labels
      @interval = interval
      @token = token
      @source = source || (require "heapscope"; Heapscope)
      @queue_size = queue_size
      @open_timeout = open_timeout
      @read_timeout = read_timeout
      @min_backoff = min_backoff
      @max_backoff = max_backoff
      @warn = warn || ->(line) { Kernel.warn(line) }
      @warned = {}
      @counts = Hash.new(0)
      @last_until = Time.now.to_i
      require "net/http"
      reset_sync
    end

    # Starts the collector and sender threads. Returns self.
    def start
      @stopping = false
      @collector = Thread.new { collect_loop }
      @sender = Thread.new { send_loop }
      @collector.name = "heapscope-pyroscope-collect" if @collector.respond_to?(:name=)
      @sender.name = "heapscope-pyroscope-send" if @sender.respond_to?(:name=)
      self
    end

    def running?
      [@collector, @sender].all? { |t| t&.alive? }
    end

    # Stops both threads, first giving the sender up to flush_timeout seconds to empty the queue.
    def stop(flush_timeout: 0)
      deadline = clock + flush_timeout
      sleep 0.05 while clock < deadline && @sync.synchronize { !@queue.empty? }
      @sync.synchronize do
        @stopping = true
        @wake.broadcast
      end
      @collector&.join(5)
      @sender&.join(@open_timeout + @read_timeout + 1)
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
      reset_sync
      @counts = Hash.new(0)
      start unless @stopping
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

        if post(item)
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

    def post(item)
      content_type, body = self.class.multipart("profile" => ["profile.pprof", item[:data]])
      request = Net::HTTP::Post.new(ingest_target(item[:from], item[:until]))
      request["Content-Type"] = content_type
      request["User-Agent"] = "heapscope/#{Heapscope::VERSION}" if defined?(Heapscope::VERSION)
      request["Authorization"] = "Bearer #{@token}" if @token
      request.basic_auth(URI.decode_www_form_component(@uri.user), URI.decode_www_form_component(@uri.password.to_s)) if @uri.user
      request.body = body
      http = Net::HTTP.new(@uri.host, @uri.port)
      http.use_ssl = @uri.scheme == "https"
      http.open_timeout = @open_timeout
      http.read_timeout = @read_timeout
      http.write_timeout = @read_timeout if http.respond_to?(:write_timeout=)
      response = http.start { |h| h.request(request) }
      return true if response.code.to_i.between?(200, 299)

      note_failure(RuntimeError.new("HTTP #{response.code} from #{@uri.host}:#{@uri.port}"), "HTTP #{response.code}")
      false
    rescue StandardError, Timeout::Error => e
      note_failure(e)
      false
    end

    def note_failure(error, kind = error.class)
      return if @warned[kind]

      @warned[kind] = true
      @warn.call("heapscope: Pyroscope push to #{@uri.host}:#{@uri.port} failed: #{error.class}: #{error.message} " \
                 "(retrying with backoff; further #{kind} failures are not reported)")
    end

    def clock
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
