# frozen_string_literal: true

require "fileutils"
require "shellwords"
require "tmpdir"
require "heapscope/version"
require "heapscope/env_config"

module Heapscope
  # CLI is the `heapscope` command: `run` profiles a Ruby command through RUBYOPT=-rheapscope/auto;
  # top, flamegraph, diff and leaks read profile files (Heapscope::Report::CLI, loaded only then); ui
  # serves a page over them (Heapscope::UI::CLI).
  # Exit statuses: 0 ok, 1 failure, 2 bad usage (one line saying why); `run` exits with the
  # command's own status (128+N when a signal N ended it, 127 when it could not be started).
  module CLI
    REPORT_COMMANDS = %w[top flamegraph diff leaks retainers examples ui].freeze
    DEFAULT_DIR = EnvConfig::DEFAULT_DIR

    # Flags of `run`: flag => [environment variable, placeholder, help].
    RUN_FLAGS = {
      "--sample-every" => ["HEAPSCOPE_SAMPLE_EVERY", "N", "sample one allocation in N on average (default 1000); never lowered unless --max-overhead is given"],
      "--max-overhead" => ["HEAPSCOPE_MAX_OVERHEAD", "FRACTION", "lower the rate while sampling costs over FRACTION of run time, or off (default 0.01; off with --sample-every)"],
      "--dir" => ["HEAPSCOPE_DIR", "DIR", "where profiles are written (default ./#{DEFAULT_DIR})"],
      "--interval" => ["HEAPSCOPE_INTERVAL", "SECONDS", "also write a profile every SECONDS (default 60)"],
      "--keep" => ["HEAPSCOPE_KEEP", "K", "keep the newest K files of the app (default 48)"],
      "--http" => ["HEAPSCOPE_HTTP", "HOST:PORT", "serve /debug/pprof/ there while it runs (loopback unless HEAPSCOPE_HTTP_TOKEN is set)"],
      "--app-name" => ["HEAPSCOPE_APP_NAME", "NAME", "name in file names (default: the script's name)"],
      "--max-frames" => ["HEAPSCOPE_MAX_FRAMES", "N", "deepest stack kept, 1..3000 (default 400)"],
      "--min-age" => ["HEAPSCOPE_MIN_AGE", "GCS", "leave out objects younger than GCS collections (default 1)"],
      "--sampling" => ["HEAPSCOPE_SAMPLING", "MODE", "windowed or always (default windowed; always with --sample-every 1)"],
      "--window-share" => ["HEAPSCOPE_WINDOW_SHARE", "FRACTION", "fraction of time the allocation hook is on when windowed, (0, 1] or budget (default budget: the overhead budget sets it, 0.005-0.5 from 0.04)"],
      "--focus" => ["HEAPSCOPE_FOCUS", "CLASS=N,...", "sample these classes at their own rate, e.g. Quote=10 (denser: narrower errors for them)"],
      "--dump-rss" => ["HEAPSCOPE_DUMP_RSS", "SIZE", "also write a profile when a process's RSS reaches SIZE (1.5G, 800M), and at each further tenth"],
      "--signal" => ["HEAPSCOPE_SIGNAL", "SIGNAL", "also write a profile each time a process receives SIGNAL (USR1, USR2 or HUP)"],
      "--label-threads" => ["HEAPSCOPE_LABEL_THREADS", "0|1", "1 labels every sample thread=<its thread's name> (default 0)"],
    }.freeze

    USAGE = <<~TEXT
      Usage: heapscope COMMAND [ARGS]

      heapscope finds which lines allocated the Ruby objects that are still alive and writes gzipped
      pprof profiles that go tool pprof, Pyroscope, Parca and Grafana read.

      Commands:
        run [FLAGS] -- CMD ARGS...   run a Ruby command under the profiler and write a final profile at exit
        top FILE|URL                 the allocation sites holding the most live memory
        flamegraph FILE|URL          an HTML flame graph that opens offline
        diff OLD NEW                 what grew between two profiles
        leaks FILES...|DIR|URLS...   sites whose live objects keep growing across profiles
        retainers URL FILE:LINE      who keeps a site's live objects alive, in a running process
        examples URL FILE:LINE       what a site's live objects hold (a preview of each), in a running process
        ui SOURCE... [--port N]      a local web page: live bytes over time, top, flame graph, diff, leaks
                                     (SOURCE: a folder of profiles, files, live URLs; heapscope ui --help)
        help, --help, -h             this text (heapscope run --help: the flags of run)
        --version                    the version

      A URL is a pprof heap endpoint's (http://HOST:PORT/debug/pprof/heap; HEAPSCOPE_HTTP_TOKEN is sent
      as its bearer token; --timeout SECONDS bounds the wait, default 30).

      Without changing code: RUBYOPT=-rheapscope/auto with HEAPSCOPE_* variables (heapscope run --help
      lists them). In code: Heapscope.start; Heapscope.write("heap.pb.gz"). See docs/surfaces.md.
    TEXT

    class << self
      # Runs the command line argv. Returns the exit status.
      def run(argv, out: $stdout, err: $stderr)
        argv = argv.dup
        command = argv.shift
        case command
        when nil
          err.puts("heapscope: missing command (see heapscope --help)")
          2
        when "-h", "--help", "help"
          out.print(USAGE)
          0
        when "-v", "--version", "version"
          out.puts("heapscope #{Heapscope::VERSION}")
          0
        when "run"
          Run.new(argv, out: out, err: err).call
        when *REPORT_COMMANDS
          report(command, argv, out, err)
        else
          err.puts("heapscope: unknown command #{command.inspect} (see heapscope --help)")
          2
        end
      end

      private

      def report(command, argv, out, err)
        begin
          require "heapscope/report/cli"
          require "heapscope/ui/cli" if command == "ui"
        rescue LoadError => e
          err.puts("heapscope: the #{command} command is not available in this build (#{e.message})")
          return 1
        end
        return Heapscope::UI::CLI.run(argv, out: out, err: err) if command == "ui"

        Heapscope::Report::CLI.run(command, argv, out: out, err: err)
      end
    end

    # Run is `heapscope run [FLAGS] -- CMD ARGS...`.
    class Run
      def initialize(argv, out:, err:)
        @argv = argv
        @out = out
        @err = err
      end

      def call
        flags, command = parse
        return flags if flags.is_a?(Integer) # help (0) or usage error (2)

        # Each process of this run lists the final profile it wrote in this file (auto.rb), so
        # the report names this run's profiles only: the directory may also hold finals of other
        # runs, of other applications, or of processes that share it right now (issue 11, item 12).
        # The file is in a directory of its own (0700), so nobody else can add lines to it.
        begin
          private_dir = Dir.mktmpdir("heapscope-run")
          @report = File.join(private_dir, "finals")
          File.open(@report, File::WRONLY | File::CREAT | File::EXCL, 0o600, &:close)
        rescue SystemCallError => e
          @err.puts("heapscope run: cannot create its list of final profiles in #{Dir.tmpdir}: #{e.message.sub(/ @ .*/, "")} (set TMPDIR)")
          return 1
        end
        begin
          env = child_env(flags)
          @err.puts("heapscope run: profiling #{Shellwords.join(command)} (every Ruby process it starts); " \
                    "final profiles go to #{@dir}")
          spawn_and_wait(env, command)
        ensure
          FileUtils.rm_rf(private_dir)
        end
      end

      def self.usage
        flag_lines = RUN_FLAGS.map do |flag, (_var, arg, help)|
          format("  %-26s %s", "#{flag} #{arg}", help)
        end
        var_lines = EnvConfig::VARIABLES.map { |var, help| format("  %-30s %s", var, help) }
        <<~TEXT
          Usage: heapscope run [FLAGS] -- CMD ARGS...

          Runs CMD with RUBYOPT=-rheapscope/auto, so every Ruby process it starts is profiled, and
          prints the final profile each one wrote at exit (DIR/APP-PID-TIME-final.heap.pb.gz).
          Exits with CMD's status.

          Flags (each sets the HEAPSCOPE_* variable shown in the list below; a flag wins over the environment):
          #{flag_lines.join("\n")}
            -h, --help                 this text

          Environment variables read by -rheapscope/auto:
          #{var_lines.join("\n")}

          Examples:
            heapscope run -- ruby app.rb
            heapscope run --interval 30 --http 127.0.0.1:6060 -- bundle exec puma
            go tool pprof -top -sample_index=inuse_space #{DEFAULT_DIR}/*-final.heap.pb.gz
        TEXT
      end

      private

      # Returns [flags {var => value}, command Array], or an exit status.
      def parse
        flags = {}
        args = @argv.dup
        until args.empty?
          arg = args.shift
          break if arg == "--"

          if %w[-h --help].include?(arg)
            @out.print(self.class.usage)
            return 0
          end
          unless arg.start_with?("-")
            args.unshift(arg) # the command starts here
            break
          end

          name, value = arg.split("=", 2)
          spec = RUN_FLAGS[name]
          return usage_error("unknown flag #{name}") unless spec

          if value.nil?
            return usage_error("#{name} needs a value (#{name} #{spec[1]})") if args.empty? || args.first == "--"

            value = args.shift
          end
          return usage_error("#{name} given more than once") if flags.key?(spec[0])

          flags[spec[0]] = value
        end
        return usage_error("missing the command to run (heapscope run [FLAGS] -- CMD ARGS...)") if args.empty?

        # A token in the environment allows a non-loopback --http.
        token = ENV["HEAPSCOPE_HTTP_TOKEN"] ? { "HEAPSCOPE_HTTP_TOKEN" => ENV["HEAPSCOPE_HTTP_TOKEN"] } : {}
        _config, parser = EnvConfig.parse_with_problems(token.merge(flags))
        parser.problems.each do |var, value, reason|
          flag = RUN_FLAGS.find { |_f, (v, _a, _h)| v == var }&.first
          shown = EnvConfig.quote(value)
          return usage_error(flag ? "#{flag} #{shown} is invalid: #{reason}" : "#{var}=#{shown} is invalid: #{reason}")
        end
        [flags, args]
      end

      def usage_error(reason)
        @err.puts("heapscope run: #{reason}")
        2
      end

      def child_env(flags)
        env = flags.dup
        env["HEAPSCOPE_DIR"] ||= ENV["HEAPSCOPE_DIR"] || DEFAULT_DIR
        @dir = File.expand_path(env["HEAPSCOPE_DIR"])
        env["HEAPSCOPE_DIR"] = @dir
        env["HEAPSCOPE_ENABLED"] = "1"
        env[EnvConfig::RUN_REPORT_VARIABLE] = @report
        lib = File.expand_path("..", __dir__)
        env["RUBYOPT"] = ["-I#{lib}", "-rheapscope/auto", ENV["RUBYOPT"]].compact.join(" ")
        env
      end

      def spawn_and_wait(env, command)
        pid =
          begin
            # The [cmd, cmd] form never goes through a shell, even for a single word.
            Process.spawn(env, [command.first, command.first], *command.drop(1))
          rescue SystemCallError => e
            @err.puts("heapscope run: cannot run #{command.first.inspect}: #{e.message}")
            return 127
          end
        # Ctrl-C reaches the child from the terminal; TERM and HUP sent to us are passed on.
        old = %w[INT TERM HUP].to_h do |sig|
          [sig, trap(sig) { Process.kill(sig, pid) unless sig == "INT" rescue nil }]
        end
        _, status = Process.wait2(pid)
        old.each { |sig, handler| trap(sig, handler || "DEFAULT") }
        report_profiles
        status.exited? ? status.exitstatus : 128 + status.termsig.to_i
      end

      # Prints the final profiles that the processes of this run listed (see call), oldest first.
      def report_profiles
        finals = File.readlines(@report, chomp: true).uniq.filter_map do |path|
          [File.mtime(path), path] if File.file?(path)
        rescue SystemCallError
          nil # removed meanwhile (another process rotated it away)
        end.sort.map(&:last)
        if finals.empty?
          @err.puts("heapscope: no final profile was written to #{@dir} (did the command run Ruby? see messages above)")
        else
          finals.each { |path| @err.puts("heapscope: final profile: #{path}") }
          @err.puts("heapscope: read it with: heapscope top #{finals.last}  (or go tool pprof -top #{finals.last})")
        end
      end
    end
  end
end
