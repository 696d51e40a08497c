# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"

# The diagnostics beside the accuracy suite (burst_coverage.rb, ccall_coverage.rb, hook_charge.rb,
# loaded_phases.rb) run their probe in fresh processes (the hook's cost is measured once per process):
# `ruby -Ilib SCRIPT --child ARGS...`, whose last line of stdout is JSON. Returns the parsed lines, one per process; aborts naming the
# failure if a child fails.
module FreshProcesses
  # The command line both diagnostics take: [PROCESSES (4)] [share (0.04)], or --child SHARE (yields
  # the share and exits). Returns [processes, share, results of run].
  def self.main(script)
    if ARGV.first == "--child"
      yield Float(ARGV[1])
      exit
    end
    processes = Integer(ARGV.fetch(0, 4))
    share = Float(ARGV.fetch(1, 0.04))
    unless processes >= 1 && share.positive? && share <= 1
      abort "usage: #{File.basename(script)} [PROCESSES >= 1] [0 < share <= 1]"
    end
    [processes, share, run(script, processes, share)]
  end

  def self.run(script, processes, *args)
    lib = File.expand_path("../../lib", __dir__)
    Array.new(processes) do
      out, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, script, "--child", *args.map(&:to_s))
      abort "#{File.basename(script)}: a child failed: #{err}" unless status.success?
      JSON.parse(out.lines.last)
    end
  end
end
