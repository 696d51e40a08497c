# frozen_string_literal: true

require "heapscope/env_config"
require "heapscope/internal"

module Heapscope
  # Auto starts heapscope with no code change, from HEAPSCOPE_* variables (env_config.rb lists them;
  # docs/surfaces.md explains them): at boot under `RUBYOPT=-rheapscope/auto` (auto.rb, which
  # requires this file and calls Auto.start; this file alone starts nothing).
  #
  # It starts the profiler, then whichever surfaces the variables ask for: the periodic writer
  # (HEAPSCOPE_DIR), the standalone listener (HEAPSCOPE_HTTP) and the Pyroscope pusher
  # (HEAPSCOPE_PYROSCOPE_URL); restarts them in forked children; and at exit writes a final
  # profile (to HEAPSCOPE_DIR, or to ./heapscope-profiles when no output was asked for). A bad
  # variable prints one line naming it and its value, and the application runs on unprofiled: a
  # configuration mistake must never take an application down.
  module Auto
    class << self
      attr_reader :config, :writer, :server, :pusher, :dumps

      # Reads env and starts everything it asks for. Returns true when profiling started.
      # Either everything the variables ask for runs, or nothing does: a surface that fails to start
      # for a reason the variables' check did not catch stops whatever had started, so the line
      # that says "profiling is off" is true. names: what to call a variable in error lines when it
      # came from somewhere else ({"HEAPSCOPE_DIR" => "config.heapscope.dir"}: lib/heapscope/surfaces/rails.rb).
      def start(env = ENV, err: $stderr, names: {})
        return false if @started

        @started = true
        @err = err
        config, errors = EnvConfig.parse(env)
        unless errors.empty?
          errors.each do |line|
            names.each { |variable, name| line = line.sub(/\Aheapscope: #{variable}(?=[= ])/, "heapscope: #{name}") }
            say("#{line}; profiling is off")
          end
          return false
        end
        return false unless config[:enabled]

        @config = config
        # `heapscope run` passes a file where each process it started lists its final profile,
        # so it reports its own processes' profiles only (cli.rb).
        @run_report = env[EnvConfig::RUN_REPORT_VARIABLE]
        @stage = "the profiler"
        return false unless start_profiler(config[:start])

        Memory.malloc_stats = config[:malloc_stats]

        # The profiler runs from here on: what the surfaces allocate on this thread is heapscope's.
        # (lib/heapscope.rb loaded every file they need, so nothing is required now.)
        Heapscope.internal { start_surfaces(config) }
        true
      rescue StandardError, LoadError => e
        abandon
        say("heapscope: autostart failed starting #{@stage}: #{e.class}: #{e.message}; profiling is off")
        false
      end

      # Whether start ran in this process (whatever it decided).
      def started?
        @started == true
      end

      # Counters of the surfaces (see Heapscope.stats for the recorder's).
      def stats
        {
          files: @writer&.stats,
          pyroscope: @pusher&.stats,
          dumps: @dumps&.stats,
          http: @server && { url: @server.url },
        }.compact
      end

      # Runs at exit: stops the threads, writes the final profile, flushes the push queue.
      def finish
        Heapscope.internal { finish_surfaces }
      end

      # Whether autostart started the profiler that is running now (Heapscope.start then warns
      # instead of raising; see AppStart).
      def owns_profiler?
        @owns_profiler == true && defined?(Heapscope.running?) && Heapscope.running?
      end

      def profiler_taken_over
        @owns_profiler = false
      end

      # Called by AppStart when application code calls Heapscope.start under autostart. Warns once.
      def app_called_start
        return if @app_start_warned

        @app_start_warned = true
        say("heapscope: Heapscope.start was called while autostart (RUBYOPT=-rheapscope/auto) is profiling " \
            "this process: it returns false and autostart's settings stay (call Heapscope.stop first to " \
            "start with other options)")
      end

      private

      def start_surfaces(config)
        if config[:http]
          @stage = "the listener (HEAPSCOPE_HTTP)"
          start_server(config[:http])
        end
        if config[:dir]
          @stage = "the periodic writer (HEAPSCOPE_DIR)"
          start_writer(config)
        end
        if config[:pyroscope]
          # The variable, not its value: a URL may hold a password.
          @stage = "the Pyroscope pusher (HEAPSCOPE_PYROSCOPE_URL)"
          start_pusher(config)
        end
        if config[:dumps]
          @stage = "the dumps (HEAPSCOPE_DUMP_RSS, HEAPSCOPE_SIGNAL)"
          start_dumps(config)
        end
        unless config[:dir] || config[:http] || config[:pyroscope] || !config[:final]
          # No output asked for: autostart still leaves a result, the final profile at exit in
          # ./heapscope-profiles (resolved now: the application may change directory), and says where.
          @stage = "the final profile's directory (./#{EnvConfig::DEFAULT_DIR})"
          @writer = PeriodicWriter.new(dir: File.expand_path(EnvConfig::DEFAULT_DIR), interval: config[:interval],
                                       keep: config[:keep], app_name: config[:app_name],
                                       warn: ->(line) { say(line) }, periodic: false).start
        end
        @stage = "the fork hook"
        Fork.after_fork_child { |_parent| after_fork }
        at_exit { finish }
      end

      def finish_surfaces
        @server&.stop
        @dumps&.stop
        if @writer
          @writer.stop
          write_final if @config[:final]
        end
        @pusher&.stop(flush_timeout: 2)
      rescue StandardError => e
        say("heapscope: at exit: #{e.class}: #{e.message}")
      end

      def start_profiler(options)
        require "heapscope"
        # Only the options this build of the core knows (an older core has no max_overhead).
        options = options.select { |key, _| Heapscope::START_DEFAULTS.key?(key) } if defined?(Heapscope::START_DEFAULTS)
        unless Heapscope.running?
          Heapscope.start(**options)
          @owns_profiler = true
          Heapscope.singleton_class.prepend(AppStart)
        end
        true
      rescue LoadError => e
        say("heapscope: cannot load the extension (#{e.message}); profiling is off")
        false
      rescue ArgumentError, Heapscope::Error => e
        say("heapscope: cannot start: #{e.message}; profiling is off")
        false
      end

      def start_server(http)
        @server = HttpServer.new(host: http[:host], port: http[:port], token: http[:token], fork_mode: http[:fork]).start
        say("heapscope: serving #{@server.url} (pid #{Process.pid})")
      rescue SystemCallError => e
        @server = nil
        say("heapscope: HEAPSCOPE_HTTP=#{http[:host]}:#{http[:port]} cannot listen: #{e.message}; the listener is off")
      end

      def start_writer(config)
        @writer = PeriodicWriter.new(dir: config[:dir], interval: config[:interval], keep: config[:keep],
                                     app_name: config[:app_name], warn: ->(line) { say(line) }).start
      end

      def start_dumps(config)
        options = config[:dumps]
        dir = config[:dir] || File.expand_path(EnvConfig::DEFAULT_DIR)
        @dumps = Dumps.new(dir: dir, rss: options[:rss], step: options[:step], signal: options[:signal],
                           min_interval: options[:min_interval], app_name: config[:app_name],
                           warn: ->(line) { say(line) }).start
        whens = []
        if @dumps.threshold
          whens << "when RSS reaches #{Dumps.human(@dumps.threshold)} (then at each further #{Dumps.human(@dumps.step)})"
        end
        whens << "on SIG#{@dumps.signal} (kill -#{@dumps.signal} #{Process.pid})" if @dumps.signal
        say("heapscope: a heap profile goes to #{dir} #{whens.join(" and ")}")
      end

      def start_pusher(config)
        py = config[:pyroscope]
        @pusher = Pyroscope.new(url: py[:url], app_name: config[:app_name], labels: py[:labels], token: py[:token],
                                interval: config[:interval], warn: ->(line) { say(line) }).start
      end

      # The final profile, and one line saying where it is or why there is none: a full disk or an
      # unsafe directory must not pass in silence, even when a periodic write already warned.
      def write_final
        path, error = @writer.write_final(gc: true)
        if error
          reason = error.message.sub(/ @ .*/m, "") # Errno's " @ rb_sysopen - PATH" repeats the path
          say("heapscope: final profile not written to #{path || @writer.dir}: #{reason} (#{error.class})")
        elsif path
          # Under `heapscope run`, run prints the path (once, for all its processes).
          @run_report ? note_final(path) : say("heapscope: final profile written to #{path}")
        else
          say("heapscope: no final profile: the profiler is not running (Heapscope.stop was called, or it switched itself off)")
        end
      end

      # Appends path to the report file of `heapscope run`, if this process was started by one.
      # The file must exist already (heapscope run made it): it is opened without O_CREAT and
      # without following a symlink, and with O_APPEND, so processes of one run never mix lines.
      def note_final(path)
        return unless @run_report

        File.open(@run_report, File::WRONLY | File::APPEND | AtomicWrite::NOFOLLOW) { |f| f.write("#{path}\n") }
      rescue SystemCallError, IOError
        nil
      end

      # Stops whatever start had started before it failed.
      def abandon
        [@server, @writer, @pusher, @dumps].each do |surface|
          surface&.stop
        rescue StandardError
          nil
        end
        @server = @writer = @pusher = @dumps = nil
        Heapscope.stop if @owns_profiler && defined?(Heapscope.stop)
        @owns_profiler = false
        @config = nil
      rescue StandardError
        nil
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
        @dumps&.after_fork
      end

      def say(line)
        @err.puts(line)
      rescue StandardError
        nil
      end
    end

    # Prepended to Heapscope's singleton once autostart has started the profiler: application code
    # that calls Heapscope.start itself (as it would without autostart) gets false and one warning,
    # not the "already running" Heapscope::Error. Bad options still raise ArgumentError, as they
    # would without autostart.
    module AppStart
      def start(**options)
        result = super
        Auto.profiler_taken_over # the application stopped autostart's profiler and started its own
        result
      rescue Heapscope::Error
        raise unless Auto.owns_profiler?

        Auto.app_called_start
        false
      end
    end
  end
end
