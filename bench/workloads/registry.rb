# frozen_string_literal: true

# The workloads bench/run measures. Each file in this folder registers one workload:
#
#   Bench::Workloads.define(:name, sizes: { full: N, quick: N, callgrind: N }, summary: "...", env: {},
#                           prepare: -> { ... }) do |n|
#     ...            # the measured code; n is the size for the chosen mode
#     result         # anything the workload must keep alive until the profiler has finished
#   end
#
# Sizes: `full` is what docs/benchmarks.md reports, `quick` is for bench/run --quick (the smoke run),
# `callgrind` is small enough to run under valgrind in seconds. `env` is added to the cell's environment
# (the same for every profiler of that workload). `prepare` (optional) runs once in the cell before the
# warm-up, unprofiled: loading a gem, building inputs.
module Bench
  module Workloads
    Workload = Struct.new(:name, :sizes, :summary, :env, :prepare, :body, keyword_init: true) do
      def run(n)
        body.call(n)
      end

      def prepare!
        prepare&.call
      end
    end

    @all = {}

    class << self
      attr_reader :all

      def define(name, sizes:, summary:, env: {}, prepare: nil, &body)
        @all[name.to_s] = Workload.new(name: name.to_s, sizes: sizes, summary: summary, env: env, prepare: prepare, body: body)
      end

      def fetch(name)
        @all.fetch(name.to_s) { raise ArgumentError, "unknown workload #{name.inspect} (known: #{@all.keys.join(", ")})" }
      end

      # Loads every workload file in this folder, in name order (the order of the tables).
      def load_all
        Dir[File.join(__dir__, "*.rb")].sort.each do |f|
          require f unless File.basename(f) == "registry.rb"
        end
        self
      end
    end
  end
end
