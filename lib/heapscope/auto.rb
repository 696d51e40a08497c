# frozen_string_literal: true

require "heapscope/env_config"

module Heapscope
  # Auto starts heapscope with no code change: `RUBYOPT=-rheapscope/auto` plus HEAPSCOPE_*
  # variables (lib/heapscope/env_config.rb lists them; docs/surfaces.md explains them).
  #
  # It starts the profiler, then whichever surfaces the variables ask for: the periodic writer
  # (HEAPSCOPE_DIR), the standalone listener (HEAPSCOPE_HTTP) and the Pyroscope pusher
  # (HEAPSCOPE_PYROSCOPE_URL); restarts them in forked children; and at exit writes a final
  # profile. A bad variable prints one line naming it and its value, and the application runs
  # on unprofiled: a configuration mistake must never take an application down.
  module Auto
    class << self
      attr_reader :config, :writer, :server, :pusher

      # Reads env and starts everything it asks for. Returns true when profiling started.
      def start(env = ENV, err: $stderr)
        return false if @started

        @started = true
        @err = err
        config, errors = EnvConfig.parse(env)
        unless errors.empty?
          errors.each { |line| say("#{line}; profiling is off") }
          return false
        end
        return false unless config[:enabled]

        @config = config
        return false unless start_profiler(config[:start])

        start_server(config[:http]) if config[:http]
        start_writer(config) if config[:dir]
        start_pusher(config) if config[:pyroscope]
        require "heapscope/fork"
        Fork.after_fork_child { |_parent| after_fork }
        at_exit { finish }
        true
      rescue StandardError, LoadError => e
        say("heapscope: autostart failed: #{e.class}: #{e.message}; profiling is off")
        false
      end

      # Counters of the surfaces (see Heapscope.stats for the recorder's).
      def stats
        {
          files: @writer&.stats,
          pyroscope: @pusher&.stats,
          http: @server && { url: @server.url },
        }.compact
      end

      # Runs at exit: stops the threads, writes the final profile, flushes the push queue.
      def finish
        @server&.stop
        if @writer
          @writer.stop
          if @config[:final]
            path = @writer.write_now(final: true, gc: true)
            say("heapscope: final profile written to #{path}") if path
          end
        end
        @pusher&.stop(flush_timeout: 2)
      rescue StandardError => e
        say("heapscope: at exit: #{e.class}: #{e.message}")
      end

      private

      def start_profiler(options)
        require "heapscope"
        # Only the options this build of the core knows (an older core has no max_overhead).
        options = options.select { |key, _| Heapscope::START_DEFAULTS.key?(key) } if defined?(Heapscope::START_DEFAULTS)
        Heapscope.start(**options) unless Heapscope.running?
        true
      rescue LoadError => e
        say("heapscope: cannot load the extension (#{e.message}); profiling is off")
        false
      rescue ArgumentError, Heapscope::Error => e
        say("heapscope: cannot start: #{e.message}; profiling is off")
        false
      end

      def start_server(http)
        require "heapscope/http_server"
        @server = HttpServer.new(host: http[:host], port: http[:port], token: http[:token], fork_mode: http[:fork]).start
        say("heapscope: serving #{@server.url} (pid #{Process.pid})")
      rescue SystemCallError => e
        @server = nil
        say("heapscope: HEAPSCOPE_HTTP=#{http[:host]}:#{http[:port]} cannot listen: #{e.message}; the listener is off")
      end

      def start_writer(config)
        require "heapscope/periodic_writer"
        @writer = PeriodicWriter.new(dir: config[:dir], interval: config[:interval], keep: config[:keep],
                                     app_name: config[:app_name], warn: ->(line) { say(line) }).start
      end

      def start_pusher(config)
        require "heapscope/pyroscope"
        py = config[:pyroscope]
        @pusher = Pyroscope.new(url: py[:url], app_name: config[:app_name], labels: py[:labels], token: py[:token],
                                interval: config[:interval], warn: ->(line) { say(line) }).start
      end

      def after_fork
        if @server
          begin
            say("heapscope: serving #{@server.url} (pid #{Process.pid})") if @server.after_fork
          rescue SystemCallError => e
            say("heapscope: pid #{Process.pid} cannot listen after fork: #{e.message}; its listener is off")
          end
        end
        @writer&.after_fork
        @pusher&.after_fork
      end

      def say(line)
        @err.puts(line)
      rescue StandardError
        nil
      end
    end
  end
end

Heapscope::Auto.start
