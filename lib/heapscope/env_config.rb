# frozen_string_literal: true

require "ipaddr"
require_relative "surfaces/dumps"
require_relative "focus"

module Heapscope
  # EnvConfig turns HEAPSCOPE_* environment variables into the settings of every no-code surface
  # (autostart, periodic files, the standalone listener, the Pyroscope pusher).
  #
  #   config, errors = Heapscope::EnvConfig.parse(ENV)
  #
  # Parsing never raises: every bad variable becomes one line in errors that names the variable
  # and its value, so lib/heapscope/auto.rb can print them and let the application run unprofiled.
  # docs/surfaces.md documents each variable; keep VARIABLES and that page in step.
  module EnvConfig
    INT_MAX = 2**31 - 1

    # Where autostart writes the final profile when no output is set, and where `heapscope run` writes
    # profiles unless told (relative to the directory the process starts in).
    DEFAULT_DIR = "heapscope-profiles"

    # Every variable read, with a one-line description (used by `heapscope --help` and the docs test).
    VARIABLES = {
      "HEAPSCOPE_ENABLED" => "0 turns autostart off without removing -rheapscope/auto (default 1)",
      "HEAPSCOPE_SAMPLE_EVERY" => "sample one allocation in N on average (default 1000); set, it is never lowered unless HEAPSCOPE_MAX_OVERHEAD is set too",
      "HEAPSCOPE_MAX_FRAMES" => "deepest stack kept per sample, 1..3000 (default 400)",
      "HEAPSCOPE_MIN_AGE" => "leave out objects that survived fewer GCs than this (default 1)",
      "HEAPSCOPE_MAX_TRACKED_OBJECTS" => "cap on tracked objects, drops are counted (default 1000000)",
      "HEAPSCOPE_MAX_STACKS" => "cap on unique stacks, drops are counted (default 100000)",
      "HEAPSCOPE_MAX_OVERHEAD" => "fraction of run time the sampler may cost, above 0 and at most 1, or off (default 0.01; off when HEAPSCOPE_SAMPLE_EVERY is set)",
      "HEAPSCOPE_TRACK_SIZES" => "1 measures object sizes (inuse_space), 0 counts objects only (default 1)",
      "HEAPSCOPE_SAMPLING" => "windowed or always: when the allocation hook is on (default windowed; always when HEAPSCOPE_SAMPLE_EVERY is 1)",
      "HEAPSCOPE_WINDOW_SHARE" => "fraction of time the allocation hook is on when windowed, above 0 and at most 1, or budget (default budget: the overhead budget sets it from how densely the program allocates, 0.005-0.5 from 0.04; 0.04 where no budget or ticker is)",
      "HEAPSCOPE_LABEL_THREADS" => "1 labels every sample thread=<its thread's name> (default 0)",
      "HEAPSCOPE_SHOW_CONTENTS" => "1 lets reports show contents of the application's objects, such as Hash keys in retainers?keys=1 and String bytes and keys in examples (default 0: classes only)",
      "HEAPSCOPE_FOCUS" => "classes sampled at their own rate, CLASS=N,CLASS2=M (e.g. Quote=10): denser sampling and narrower errors where a decision is made; a class not defined at start is looked for at each profile (docs/configuration.md, focus)",
      "HEAPSCOPE_AUTO_FOCUS" => "0 stops classes whose exact live bytes keep growing over the last profiles getting a 10x denser rate (default 1; needs the census)",
      "HEAPSCOPE_EXACT_THREADS" => "0 samples Threads and Fibers like other objects instead of recording each one made by Thread.new, .start, .fork or Fiber.new whole (default 1)",
      "HEAPSCOPE_CENSUS" => "0 leaves the exact census of the live heap (per type and class totals, about 15 ms per million objects) out of profiles (default 1)",
      "HEAPSCOPE_MAX_LABEL_SETS" => "distinct label sets kept, 1..1000000; past it new ones become \"(other)\" (default 1000)",
      "HEAPSCOPE_LABELS" => "0 stops Rails apps' requests and jobs being labelled endpoint=Controller#action, job=JobClass (default 1)",
      "HEAPSCOPE_QUIET" => "1 silences the line a Rails app prints when profiling starts (where profiles go, where to read them live); warnings are always printed (default 0)",
      "HEAPSCOPE_DIR" => "write profiles to this directory every HEAPSCOPE_INTERVAL and a final one at exit (unset, with no HEAPSCOPE_HTTP or HEAPSCOPE_PYROSCOPE_URL either: only the final one, in ./#{DEFAULT_DIR})",
      "HEAPSCOPE_INTERVAL" => "seconds between periodic files and Pyroscope pushes, 0.1..86400 (default 60)",
      "HEAPSCOPE_KEEP" => "keep the newest K profile files of the app in HEAPSCOPE_DIR (default 48)",
      "HEAPSCOPE_FINAL" => "0 skips the final profile at exit (default 1: written to HEAPSCOPE_DIR, or ./#{DEFAULT_DIR} when no output is set)",
      "HEAPSCOPE_APP_NAME" => "name used in file names and Pyroscope series (default: the script's name)",
      "HEAPSCOPE_DUMP_RSS" => "write a heap profile (without a GC) when RSS first reaches this size, e.g. 1.5G or 800M, and again at each further HEAPSCOPE_DUMP_RSS_STEP; to HEAPSCOPE_DIR, else ./#{DEFAULT_DIR}",
      "HEAPSCOPE_DUMP_RSS_STEP" => "further RSS growth that writes another profile (default: a tenth of HEAPSCOPE_DUMP_RSS)",
      "HEAPSCOPE_DUMP_INTERVAL" => "least seconds between two RSS profiles, 0..86400 (default 60)",
      "HEAPSCOPE_SIGNAL" => "USR1, USR2 or HUP: write a heap profile (after a full GC) each time the process receives it; to HEAPSCOPE_DIR, else ./#{DEFAULT_DIR}",
      "HEAPSCOPE_MALLOC_STATS" => "0 leaves glibc's malloc figures out of each profile's memory breakdown (reading them walks malloc's free lists: 14-65 ms in a fragmented heap; default 1)",
      "HEAPSCOPE_HTTP" => "serve /debug/pprof/ on HOST:PORT (a bare PORT means 127.0.0.1:PORT)",
      "HEAPSCOPE_HTTP_TOKEN" => "require Authorization: Bearer TOKEN; mandatory for a non-loopback HEAPSCOPE_HTTP",
      "HEAPSCOPE_HTTP_FORK" => "listener in forked children: offset (first free port above), same, or off (default offset)",
      "HEAPSCOPE_PYROSCOPE_URL" => "push a heap profile every HEAPSCOPE_INTERVAL to this Pyroscope server",
      "HEAPSCOPE_PYROSCOPE_LABELS" => "extra series labels for Pyroscope, k=v,k2=v2",
      "HEAPSCOPE_PYROSCOPE_TOKEN" => "sent as Authorization: Bearer TOKEN to Pyroscope (or put user:pass@ in the URL)",
    }.freeze

    # Set by `heapscope run` (cli.rb) for the processes it starts: a file where each lists the
    # final profile it wrote (auto.rb). Not a setting for users, so not in VARIABLES.
    RUN_REPORT_VARIABLE = "HEAPSCOPE_RUN_REPORT"

    FORK_MODES = %w[offset same off].freeze
    SAMPLING_MODES = %w[windowed always].freeze
    LABEL_KEY = /\A[A-Za-z_][A-Za-z0-9_.]*\z/.freeze
    SECRETS = %w[HEAPSCOPE_HTTP_TOKEN HEAPSCOPE_PYROSCOPE_TOKEN].freeze

    class << self
      # Returns [config Hash, Array of error lines]. config has :start (options for Heapscope.start),
      # :enabled, :app_name, :dir, :interval, :keep, :final, :http (Hash or nil), :pyroscope (Hash or nil).
      def parse(env = ENV)
        config, parser = parse_with_problems(env)
        [config, parser.errors]
      end

      # Like parse, but returns the Parser, whose problems list [variable, value, reason].
      def parse_with_problems(env)
        p = Parser.new(env)
        config = {
          enabled: p.boolean("HEAPSCOPE_ENABLED", true),
          start: {},
          app_name: p.app_name,
          dir: p.string("HEAPSCOPE_DIR"),
          interval: p.number("HEAPSCOPE_INTERVAL", 60.0, 0.1, 86_400),
          keep: p.integer("HEAPSCOPE_KEEP", 48, 1, 1_000_000),
          final: p.boolean("HEAPSCOPE_FINAL", true),
          http: p.http,
          pyroscope: p.pyroscope,
          dumps: p.dumps,
          malloc_stats: p.boolean("HEAPSCOPE_MALLOC_STATS", true),
          labels: p.boolean("HEAPSCOPE_LABELS", true),
          quiet: p.boolean("HEAPSCOPE_QUIET", false),
        }
        {
          sample_every: ["HEAPSCOPE_SAMPLE_EVERY", 1, INT_MAX],
          max_frames: ["HEAPSCOPE_MAX_FRAMES", 1, 3000],
          min_age: ["HEAPSCOPE_MIN_AGE", 0, INT_MAX],
          max_tracked_objects: ["HEAPSCOPE_MAX_TRACKED_OBJECTS", 1, INT_MAX],
          max_stacks: ["HEAPSCOPE_MAX_STACKS", 1, INT_MAX],
          max_label_sets: ["HEAPSCOPE_MAX_LABEL_SETS", 1, 1_000_000],
        }.each do |key, (name, min, max)|
          value = p.integer(name, nil, min, max)
          config[:start][key] = value unless value.nil?
        end
        overhead = p.fraction("HEAPSCOPE_MAX_OVERHEAD")
        config[:start][:max_overhead] = overhead unless overhead == :unset
        label_threads = p.boolean("HEAPSCOPE_LABEL_THREADS", nil)
        config[:start][:label_threads] = label_threads unless label_threads.nil?
        show_contents = p.boolean("HEAPSCOPE_SHOW_CONTENTS", nil)
        config[:start][:show_contents] = show_contents unless show_contents.nil?
        focus = p.focus("HEAPSCOPE_FOCUS")
        config[:start][:focus] = focus unless focus.nil?
        auto_focus = p.boolean("HEAPSCOPE_AUTO_FOCUS", nil)
        config[:start][:auto_focus] = auto_focus unless auto_focus.nil?
        exact_threads = p.boolean("HEAPSCOPE_EXACT_THREADS", nil)
        config[:start][:exact_threads] = exact_threads unless exact_threads.nil?
        census = p.boolean("HEAPSCOPE_CENSUS", nil)
        config[:start][:census] = census unless census.nil?
        sizes = p.boolean("HEAPSCOPE_TRACK_SIZES", nil)
        config[:start][:track_sizes] = sizes unless sizes.nil?
        sampling = p.one_of("HEAPSCOPE_SAMPLING", SAMPLING_MODES)
        config[:start][:sampling] = sampling.to_sym unless sampling.nil?
        share = p.exact("HEAPSCOPE_WINDOW_SHARE")&.downcase == "budget" ? :budget : p.fraction("HEAPSCOPE_WINDOW_SHARE", off: false, also: "budget")
        config[:start][:window_share] = share unless share.nil? || share == :unset
        [config, p]
      end

      # Splits "HOST:PORT", "[V6]:PORT", ":PORT" or "PORT" into [host, port]; the host defaults to
      # 127.0.0.1. Raises ArgumentError with the reason.
      def parse_host_port(text)
        text = text.strip
        host, port =
          case text
          when /\A(\d+)\z/ then ["127.0.0.1", Regexp.last_match(1)]
          when /\A:(\d+)\z/ then ["127.0.0.1", Regexp.last_match(1)]
          when /\A\[([0-9A-Fa-f:.]+)\]:(\d+)\z/ then [Regexp.last_match(1), Regexp.last_match(2)]
          when /\A([A-Za-z0-9.\-]+):(\d+)\z/ then [Regexp.last_match(1), Regexp.last_match(2)]
          else raise ArgumentError, "must be HOST:PORT, [IPV6]:PORT or PORT"
          end
        port = Integer(port, 10)
        raise ArgumentError, "port must be from 0 to 65535" unless port.between?(0, 65_535)

        [host, port]
      end

      # Parses "k=v,k2=v2" into a Hash; raises ArgumentError with the reason.
      def parse_labels(text)
        text.split(",").map(&:strip).reject(&:empty?).to_h do |pair|
          key, value = pair.split("=", 2)
          raise ArgumentError, "#{quote(pair)} is not key=value" if value.nil? || value.empty?
          raise ArgumentError, "label name #{quote(key)} must start with a letter or _ and hold only letters, digits, _ and ." unless key.match?(LABEL_KEY)
          raise ArgumentError, "label value #{quote(value)} must not contain {}=, or quotes" if value.match?(/[{}=,"']/)

          [key, value]
        end
      end
    end

    # Up to this many characters of a bad value are quoted in its error line: the lines go to the
    # application's logs, and a value can be as long as the environment allows (100,000 characters
    # were echoed whole).
    QUOTE_LIMIT = 80

    # A value as error lines show it: inspected, and when long, its first QUOTE_LIMIT characters
    # followed by "... (N characters)".
    def self.quote(value)
      text = value.to_s
      return text.inspect if text.length <= QUOTE_LIMIT

      "#{text[0, QUOTE_LIMIT].inspect}... (#{text.length} characters)"
    end

    # Parser reads one variable at a time and collects an error line for each bad one.
    class Parser
      # problems: [variable, value, reason] for each bad variable (the CLI words them as flags).
      attr_reader :problems

      def initialize(env)
        @env = env
        @problems = []
      end

      # One line per bad variable, in the order of VARIABLES. A token's value is never printed:
      # these lines go to the application's logs.
      def errors
        order = VARIABLES.keys
        @problems.sort_by { |name, _, _| order.index(name) || order.size }.map do |name, value, reason|
          shown = SECRETS.include?(name) ? " (#{value.to_s.length} characters, not shown)" : "=#{EnvConfig.quote(value)}"
          "heapscope: #{name}#{shown} is invalid: #{reason}"
        end
      end

      def bad(name, reason)
        @problems << [name, @env[name], reason]
        nil
      end

      # The value, stripped; nil when unset or empty (an empty variable counts as unset).
      def string(name)
        value = @env[name]
        return nil if value.nil?

        value = value.strip
        value.empty? ? nil : value
      end

      # A number's or size's value exactly as set (nil when unset, empty or only spaces, as for every
      # variable): unlike other values it is not stripped, so " 5" is an error rather than 5
      # (docs/surfaces.md: digits only).
      def exact(name)
        value = @env[name]
        value.nil? || value.strip.empty? ? nil : value
      end

      # reason, plus what is wrong when text holds spaces (the likeliest cause of a number not parsing).
      def numeric_reason(text, reason)
        text.match?(/\s/) ? "#{reason} (digits only: it has spaces)" : reason
      end

      # CLASS=N,... as a Hash for the focus option (Focus.parse says what is malformed); nil when unset.
      def focus(name)
        text = string(name)
        return nil if text.nil?

        Focus.parse(text)
      rescue ArgumentError => e
        bad(name, e.message)
      end

      def integer(name, default, min, max)
        text = exact(name)
        return default if text.nil?
        reason = "must be an integer from #{min} to #{max}"
        return bad(name, numeric_reason(text, reason)) unless text.match?(/\A\d+\z/)

        value = Integer(text, 10)
        return bad(name, reason) unless value.between?(min, max)

        value
      end

      def number(name, default, min, max)
        text = exact(name)
        return default if text.nil?
        reason = "must be a number of seconds from #{min} to #{max}"
        return bad(name, numeric_reason(text, reason)) unless text.match?(/\A\d+(\.\d+)?\z/)

        value = Float(text)
        return bad(name, reason) unless value.between?(min, max)

        value
      end

      # A fraction in (0, 1], or nil for "off" (when off is allowed); :unset when the variable is not set.
      # also: a word the caller accepts beside a number, named in the error.
      def fraction(name, off: true, also: nil)
        text = exact(name)
        return :unset if text.nil?
        return nil if off && %w[off none].include?(text.downcase)

        value = Float(text) if text.match?(/\A\d*\.?\d+\z/)
        unless value&.positive? && value <= 1
          return bad(name, numeric_reason(text, "must be a number above 0 and at most 1#{off ? ", or off" : ""}#{also && ", or #{also}"}"))
        end

        value
      end

      # One of words (exact), or nil when unset or bad.
      def one_of(name, words)
        text = string(name)
        return nil if text.nil?
        return bad(name, "must be one of #{words.join(", ")}") unless words.include?(text)

        text
      end

      def boolean(name, default)
        text = string(name)
        return default if text.nil?

        case text.downcase
        when "1", "true", "yes", "on" then true
        when "0", "false", "no", "off" then false
        else bad(name, "must be 1 or 0 (true/false, yes/no, on/off)")
        end
      end

      def app_name
        name = string("HEAPSCOPE_APP_NAME")
        if name
          return name if name.match?(/\A[A-Za-z0-9_.\-]{1,100}\z/)

          return bad("HEAPSCOPE_APP_NAME", "use 1 to 100 of A-Z a-z 0-9 _ . -")
        end
        # The script's name, made safe for file names; "-e" or ".hidden" would look like a flag or
        # hide the file, so a name must start with a letter, digit or _.
        return "ruby" if %w[-e - irb].include?($PROGRAM_NAME.to_s)

        base = File.basename($PROGRAM_NAME.to_s, ".rb").gsub(/[^A-Za-z0-9_.\-]/, "_").sub(/\A[.\-]+/, "")[0, 100]
        base.empty? ? "ruby" : base
      end

      def http
        text = string("HEAPSCOPE_HTTP")
        token = string("HEAPSCOPE_HTTP_TOKEN")
        mode = one_of("HEAPSCOPE_HTTP_FORK", FORK_MODES) || "offset"
        return nil if text.nil?

        begin
          host, port = EnvConfig.parse_host_port(text)
        rescue ArgumentError => e
          return bad("HEAPSCOPE_HTTP", e.message)
        end
        if token.nil? && !HttpAddress.loopback?(host)
          return bad("HEAPSCOPE_HTTP", "#{host} is not a loopback address: set HEAPSCOPE_HTTP_TOKEN to serve it")
        end
        if token && token.length < 16
          return bad("HEAPSCOPE_HTTP_TOKEN", "must be at least 16 characters")
        end

        { host: host, port: port, token: token, fork: mode.to_sym }
      end

      # HEAPSCOPE_DUMP_RSS, _STEP, _INTERVAL and HEAPSCOPE_SIGNAL -> options for Dumps.new, or nil.
      def dumps
        rss = size("HEAPSCOPE_DUMP_RSS")
        step = size("HEAPSCOPE_DUMP_RSS_STEP")
        interval = number("HEAPSCOPE_DUMP_INTERVAL", 60.0, 0, 86_400)
        signal = string("HEAPSCOPE_SIGNAL")
        if signal
          begin
            signal = Dumps.signal_name(signal)
          rescue ArgumentError
            signal = bad("HEAPSCOPE_SIGNAL", "must be one of #{Dumps::SIGNALS.join(", ")}")
          end
        end
        unless rss || exact("HEAPSCOPE_DUMP_RSS")
          bad("HEAPSCOPE_DUMP_RSS_STEP", "needs HEAPSCOPE_DUMP_RSS") if step
          bad("HEAPSCOPE_DUMP_INTERVAL", "needs HEAPSCOPE_DUMP_RSS") if exact("HEAPSCOPE_DUMP_INTERVAL") && interval
        end
        return nil unless rss || signal

        { rss: rss, step: step, signal: signal, min_interval: interval }
      end

      # A size like 1.5G, 800M, 800MiB or a number of bytes; nil when unset or bad (then a problem).
      def size(name)
        text = exact(name)
        return nil if text.nil?

        reason = "must be a positive size like 1.5G, 512M or 800MiB (binary units)"
        return bad(name, numeric_reason(text, reason)) if text.match?(/\s/) # parse_size allows spaces (Ruby callers)

        Dumps.parse_size(text, name)
      rescue ArgumentError
        bad(name, reason)
      end

      def pyroscope
        url = string("HEAPSCOPE_PYROSCOPE_URL")
        labels_text = string("HEAPSCOPE_PYROSCOPE_LABELS")
        labels = {}
        if labels_text
          begin
            labels = EnvConfig.parse_labels(labels_text)
          rescue ArgumentError => e
            bad("HEAPSCOPE_PYROSCOPE_LABELS", e.message)
          end
        end
        return nil if url.nil?

        unless url.match?(%r{\Ahttps?://[^/\s?#]+(/[^\s?#]*)?\z})
          return bad("HEAPSCOPE_PYROSCOPE_URL", "must be an http:// or https:// URL without query, e.g. http://127.0.0.1:4040")
        end
        # The pusher's own check, so a URL accepted here never fails when the pusher starts
        # (http://[::1 passed the pattern above, then failed URI parsing after the listener and the
        # writer had started).
        require "heapscope/surfaces/pyroscope"
        begin
          Pyroscope.parse_url(url)
        rescue ArgumentError => e
          return bad("HEAPSCOPE_PYROSCOPE_URL", e.message)
        end
        token = string("HEAPSCOPE_PYROSCOPE_TOKEN")
        begin
          Pyroscope.check_token(token)
        rescue ArgumentError => e
          return bad("HEAPSCOPE_PYROSCOPE_TOKEN", e.message)
        end

        { url: url, labels: labels, token: token }
      end
    end

    # HttpAddress answers whether a listen address stays on this machine.
    module HttpAddress
      # True when every address host resolves to is a loopback address (127.0.0.0/8 or ::1).
      def self.loopback?(host)
        return true if host == "localhost"

        IPAddr.new(host).loopback?
      rescue IPAddr::Error, ArgumentError
        false
      end
    end
  end
end
