# frozen_string_literal: true

require "heapscope/report/command"
require "heapscope/report/top"
require "heapscope/report/flamegraph"
require "heapscope/report/diff"
require "heapscope/report/leaks"

module Heapscope
  module Report
    # CLI is the entry point of `heapscope top|flamegraph|diff|leaks`. exe/heapscope calls run; it never
    # lets a backtrace through: bad input exits 2 with one line on err, a bug exits 1 with one line.
    module CLI
      COMMANDS = { "top" => Top, "flamegraph" => Flamegraph, "diff" => Diff, "leaks" => Leaks }.freeze

      module_function

      # Runs one report command. Returns the exit status (0 ok, 1 internal error, 2 bad input).
      def run(command, argv, out: $stdout, err: $stderr)
        klass = COMMANDS[command]
        unless klass
          err.puts "heapscope: unknown report command #{command.inspect} (known: #{COMMANDS.keys.join(", ")})"
          return 2
        end
        klass.new(argv).run(out)
      rescue Help => e
        out.puts e.message
        0
      rescue Error => e
        err.puts "heapscope #{command}: #{e.message}"
        2
      rescue Errno::EPIPE
        0 # the reader (head, less) went away: not an error
      rescue StandardError => e
        err.puts "heapscope #{command}: internal error: #{e.class}: #{e.message.lines.first&.chomp} " \
                 "(please report it with the profile)"
        1
      end
    end
  end
end
