# frozen_string_literal: true

require "optparse"
require "json"
require "heapscope/report/units"
require "heapscope/report/sampling"
require "heapscope/report/sites"

module Heapscope
  module Report
    # Help is raised by -h/--help: the CLI prints the usage on out and exits 0.
    class Help < StandardError; end

    # Command is what every report shares: option parsing that turns any bad flag into Report::Error,
    # -h/--help, and the count of positional arguments. A subclass defines USAGE, options(parser, opts)
    # and run(out); CLI does the rest.
    class Command
      attr_reader :opts, :args

      def initialize(argv)
        @opts = defaults
        parser = OptionParser.new
        parser.banner = self.class::USAGE
        parser.on("-h", "--help") { raise Help, parser.help }
        options(parser, @opts)
        begin
          @args = parser.parse(argv.dup)
        rescue OptionParser::ParseError => e
          raise Error, "#{e.message} (#{self.class::USAGE.sub(/\Ausage: /, "")})"
        end
        check_args(@args)
      end

      private

      def defaults
        {}
      end

      # Adds the flags shared by several commands.
      def sample_flag(parser, opts)
        parser.on("--sample TYPE", "sample type to show (default: the profile's default, else inuse_space)") do |v|
          opts[:sample] = v
        end
      end

      def by_flag(parser, opts)
        parser.on("--by WHAT", Sites::BY, "group by line, function or class (default: line)") { |v| opts[:by] = v }
      end

      def limit_flag(parser, opts)
        parser.on("-n N", Integer, "rows to show (default: #{opts[:n]})") do |v|
          raise Error, "-n must be a positive number, got #{v}" unless v.positive?

          opts[:n] = v
        end
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
