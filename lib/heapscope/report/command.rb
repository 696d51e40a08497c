# frozen_string_literal: true

require "optparse"
require "json"
require "heapscope/report/units"
require "heapscope/report/sampling"
require "heapscope/report/sites"
require "heapscope/report/escape"
require "heapscope/report/profile_url"
require "heapscope/memory"

module Heapscope
  module Report
    # Help is raised by -h/--help: the CLI prints the usage on out and exits 0.
    class Help < StandardError; end

    # Command is what every report shares: option parsing that turns any bad flag into Report::Error,
    # -h/--help, and the count of positional arguments. A subclass defines USAGE, options(parser, opts)
    # and run(out); CLI does the rest.
    class Command
      # -n is at most this: more rows than any profile has.
      MAX_ROWS = 1 << 40
      SIZE_UNITS = { "" => 1, "k" => 1 << 10, "m" => 1 << 20, "g" => 1 << 30, "t" => 1 << 40 }.freeze
      # The longest wait for a URL's whole answer (--timeout), as for the Pyroscope push.
      TIMEOUT = 30
      # Said under every reader's usage line, as USAGE names FILE only.
      URL_NOTE = "FILE may be an http(s):// URL of a pprof heap endpoint (http://HOST:PORT means its " \
                 "#{ProfileUrl::DEFAULT_PATH}); #{ProfileUrl::TOKEN_VARIABLE} is sent as its bearer token."

      attr_reader :opts, :args

      def initialize(argv)
        @opts = { timeout: TIMEOUT }.merge(defaults)
        parser = OptionParser.new
        parser.banner = "#{self.class::USAGE}\n\n#{self.class::DESCRIPTION}\n#{"#{URL_NOTE}\n" if profile_urls?}"
        parser.on("-h", "--help", "show this help") { raise Help, parser.help }
        options(parser, @opts)
        size_flag(parser, @opts)
        timeout_flag(parser, @opts)
        begin
          @args = parser.parse(argv.dup)
        rescue OptionParser::ParseError => e
          raise Error, "#{e.message} (#{self.class::USAGE.sub(/\Ausage: /, "")})"
        end
        check_args(@args)
        # A URL is shown without its password, in the reports and their messages alike; @urls keeps
        # what to fetch for each shown form.
        @urls = {}
        @args = @args.map do |arg|
          next arg unless profile_urls? && ProfileUrl.url?(arg)

          shown = ProfileUrl.display(arg)
          @urls[shown] = arg
          shown
        end
      end

      private

      # True for the readers, whose FILE arguments may be profiles' URLs (ProfileUrl).
      def profile_urls?
        true
      end

      def defaults
        {}
      end

      # Adds the flags shared by several commands.
      def sample_flag(parser, opts)
        parser.on("--sample TYPE", "sample type to show (default: the profile's default, else inuse_space)") do |v|
          opts[:sample] = v
        end
      end

      # Parsed by Labels.parse_by rather than an OptionParser list, which cannot take label:KEY (and
      # would only say "invalid argument").
      def by_flag(parser, opts)
        parser.on("--by WHAT", "group by line, function, class, file, gem or label:KEY (a label's value; default: line);",
                  "gem: the first frame outside Ruby's own code decides; rows NAME VERSION, (app), (stdlib), (ruby)") do |v|
          opts[:by] = Labels.parse_by(v)
        end
      end

      # --label KEY=VALUE, repeatable: every one must match (the selection is their intersection).
      def label_flag(parser, opts)
        parser.on("--label KEY=VALUE", "only samples whose label KEY is VALUE (exact; repeat to require several)") do |v|
          (opts[:labels] ||= []) << Labels.parse_filter(v)
        end
      end

      # Any positive N; one larger than the rows there are shows them all (so a huge N, even past 64
      # bits, means "every row" instead of overflowing Array#first).
      def limit_flag(parser, opts)
        parser.on("-n N", Integer, "rows to show (default: #{opts[:n]})") do |v|
          raise Error, "-n must be a positive number, got #{v}" unless v.positive?

          opts[:n] = [v, MAX_ROWS].min
        end
      end

      # Every command reads profiles, so every command has the reading limit.
      def size_flag(parser, opts)
        parser.on("--max-size SIZE", "largest profile to read, decompressed (default: " \
                                     "#{Pprof.size_text(Pprof::DEFAULT_MAX_SIZE)}; e.g. 1G, 512M)") do |v|
          opts[:max_size] = Command.parse_size(v)
        end
      end

      # Every command may read a URL (retainers always does), so every command has its deadline.
      def timeout_flag(parser, opts)
        parser.on("--timeout SECONDS", Float, "longest wait for a URL's whole answer (default #{TIMEOUT})") do |v|
          raise Error, "--timeout must be a positive number of seconds, got #{v}" unless v.positive? && v.finite?

          opts[:timeout] = v
        end
      end

      # Loads one profile, from a file or a URL, with this command's reading limit (and deadline).
      def load_profile(path)
        if (url = @urls[path])
          ProfileUrl.load(url, timeout: @opts[:timeout], max_size: @opts[:max_size] || Pprof::DEFAULT_MAX_SIZE)
        else
          Sites.load(path, max_size: @opts[:max_size])
        end
      end

      # Where a report made from path writes by default: next to a file, or for a URL, a name made of
      # its host, port and last path segment in the current directory.
      def output_stem(path)
        @urls[path] ? ProfileUrl.file_stem(@urls[path]) : path.sub(/(\.pb)?(\.gz)?\z/, "").sub(/\.(pprof|prof)\z/, "")
      end

      # "512M", "2G", "64MiB", "1000000": bytes (K, M, G, T are powers of 1024).
      def self.parse_size(text)
        m = text.to_s.strip.match(/\A(\d+)\s*([kmgt]?)(i?b)?\z/i)
        n = m && m[1].to_i * SIZE_UNITS[m[2].downcase]
        raise Error, "--max-size must be a size like 512M or 2G, got #{text.inspect}" if n.nil? || n.zero?

        n
      end

      # Checks the count of positional arguments (FILE by default).
      def check_args(args, min: 1, max: 1, what: "FILE")
        if args.size < min
          raise Error, "missing #{what} (#{self.class::USAGE.sub(/\Ausage: /, "")})"
        elsif max && args.size > max
          raise Error, "unexpected argument #{args[max].inspect} (#{self.class::USAGE.sub(/\Ausage: /, "")})"
        end
      end
    end

    # Pads cells into aligned columns, right-aligned, except the last column (names) left as is.
    def self.table(rows)
      widths = rows.transpose.map { |col| col.map { |c| c.to_s.size }.max }
      rows.map do |row|
        row.each_with_index.map do |cell, i|
          i == row.size - 1 ? cell.to_s : cell.to_s.rjust(widths[i])
        end.join("  ").rstrip
      end
    end
  end
end
