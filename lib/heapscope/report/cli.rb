# frozen_string_literal: true

require "heapscope/report/command"
require "heapscope/report/top"
require "heapscope/report/flamegraph"
require "heapscope/report/diff"
require "heapscope/report/leaks"
require "heapscope/report/retainers"
require "heapscope/report/examples"

module Heapscope
  module Report
    # CLI is the entry point of `heapscope top|flamegraph|diff|leaks|retainers|examples`. exe/heapscope
    # calls run; it never lets a backtrace through: bad input exits 2 with one line on err, a bug exits
    # 1 with one line.
    module CLI
      COMMANDS = { "top" => Top, "flamegraph" => Flamegraph, "diff" => Diff, "leaks" => Leaks,
                   "retainers" => Retainers, "examples" => Examples }.freeze

      module_function

      # Runs one report command. Returns the exit status (0 ok, 1 internal error, 2 bad input).
      def run(command, argv, out: $stdout, err: $stderr)
        klass = COMMANDS[command]
        unless klass
          err.puts Escape.terminal("heapscope: unknown report command #{command.inspect} (known: #{COMMANDS.keys.join(", ")})")
          return 2
        end
        report = klass.new(argv)
        output = Output.new(out)
        status = report.run(output)
        # Output is buffered: a full disk is only seen when the buffer is written. Flush here, so
        # "top > /dev/full" fails now and says so, instead of exiting 0 with nothing written.
        output.flush
        status
      rescue Help => e
        out.puts e.message
        0
      rescue Error => e
        # One line whatever the message holds (a path or a name from a profile may contain CR or LF).
        err.puts Escape.terminal("heapscope #{command}: #{e.message}")
        2
      rescue Errno::EPIPE
        0 # the reader (head, less) went away: not an error
      rescue StandardError => e
        err.puts Escape.terminal("heapscope #{command}: internal error: #{e.class}: #{e.message.lines.first&.chomp} " \
                                 "(please report it with the profile)")
        1
      end

      # Output wraps the stream reports print to, so that a failed write (ENOSPC, EIO, a closed stream)
      # is an Error with one line, exit 2, not an internal error. EPIPE passes through: the reader left.
      class Output
        def initialize(io)
          @io = io
        end

        %i[puts print write flush].each do |name|
          define_method(name) do |*args|
            @io.public_send(name, *args)
          rescue Errno::EPIPE
            raise
          rescue SystemCallError, IOError => e
            raise Error, "cannot write the output: #{e.message.sub(/ @ .*/, "")}"
          end
        end
      end
    end
  end
end
