# frozen_string_literal: true

# Shared by the pprof reader and report tests: profiles with known answers, built three ways (by hand with
# Heapscope::Pprof::Profile#add_sample, by Go's runtime/pprof, and through `go tool pprof`), and a parser
# for `go tool pprof -raw`, the reference client's view of a profile. Holds no tests itself.

require "minitest/autorun"
require "open3"
require "tmpdir"
require "fileutils"
require "stringio"
require "json"
require "heapscope/pprof"

module ReportHelper
  # Go keeps its build cache here so repeated runs compile once; nothing is fetched (stdlib only).
  GO_ENV = {
    "GOCACHE" => File.join(Dir.tmpdir, "heapscope-test-gocache"),
    "GOPATH" => File.join(Dir.tmpdir, "heapscope-test-gopath"),
    "GO111MODULE" => "off",
    "GOFLAGS" => "",
    "GOPROXY" => "off",
    "PPROF_TMPDIR" => Dir.tmpdir,
  }.freeze

  HEAPSCOPE_TYPES = [%w[alloc_objects count], %w[alloc_space bytes], %w[inuse_objects count],
                     %w[inuse_space bytes]].freeze

  # A Go program that keeps `count` 4 KiB buffers allocated in leakyAlloc, frees what churnAlloc makes,
  # and writes a heap profile to its first argument with every allocation sampled.
  GO_HEAP_PROGRAM = <<~GO
    package main

    import (
    	"os"
    	"runtime"
    	"runtime/pprof"
    )

    var keep [][]byte
    var sink []byte

    //go:noinline
    func leakyAlloc(count int) {
    	for i := 0; i < count; i++ {
    		keep = append(keep, make([]byte, 4096))
    	}
    }

    //go:noinline
    func churnAlloc(count int) {
    	for i := 0; i < count; i++ {
    		sink = make([]byte, 512)
    	}
    }

    func main() {
    	runtime.MemProfileRate = 1
    	leakyAlloc(1000)
    	churnAlloc(1000)
    	runtime.GC()
    	runtime.GC()
    	f, err := os.Create(os.Args[1])
    	if err != nil {
    		panic(err)
    	}
    	if err := pprof.WriteHeapProfile(f); err != nil {
    		panic(err)
    	}
    	f.Close()
    }
  GO

  module_function

  def go_env
    GO_ENV
  end

  # Runs a command, failing the test loudly (with its output) if it does not succeed.
  def run!(env, *cmd)
    out, err, status = Open3.capture3(env, *cmd)
    raise "#{cmd.join(" ")} failed (#{status.exitstatus}): #{err}#{out}" unless status.success?

    out
  end

  # Writes a Go heap profile into dir and returns its path.
  def go_heap_profile(dir)
    src = File.join(dir, "main.go")
    File.write(src, GO_HEAP_PROGRAM)
    out = File.join(dir, "go-heap.pb.gz")
    run!(GO_ENV, "go", "run", src, out)
    out
  end

  # Runs `go tool pprof` with args and returns its stdout.
  def go_pprof(*args)
    run!(GO_ENV, "go", "tool", "pprof", *args)
  end

  # Parses `go tool pprof -raw` output into {sample_types:, samples: [{values:, frames:, labels:}]},
  # frames leaf first as "function file:line" strings, label values as Strings.
  def parse_raw(text)
    section = nil
    types = nil
    samples = []
    locations = {}
    current = nil
    text.each_line do |line|
      line = line.chomp
      case line
      when /\ASamples:/ then section = :samples
      when /\ALocations/ then section = :locations
      when /\AMappings/ then section = :mappings
      else
        if section == :samples
          if types.nil?
            types = line.split.map { |t| t.delete_suffix("[dflt]").split("/") }
          elsif line =~ /\A\s+(-?\d+(?:\s+-?\d+)*): ([\d ]*)\z/
            samples << { values: $1.split.map(&:to_i), ids: $2.split.map(&:to_i), labels: {} }
          elsif line =~ /\A\s+([^:\s]+):\[(.*)\]\z/
            key = $1
            value = $2
            # Numeric labels share one line ("gc_age:[2] inuse_space_var:[7]"); a string label's value
            # may hold "]" itself, so the line is split only when the pairs make it up exactly.
            pairs = line.strip.scan(/([^:\s]+):\[([^\]]*)\]/)
            if pairs.size > 1 && pairs.map { |k, v| "#{k}:[#{v}]" }.join(" ") == line.strip
              pairs.each { |k, v| samples.last[:labels][k] = v }
            else
              samples.last[:labels][key] = value
            end
          end
        elsif section == :locations
          # Newer pprof (Go 1.2x) prints "file:line:column"; ours has no columns, so the column goes.
          if line =~ /\A\s+(\d+): 0x\h+ (?:M=\d+ )?(.+) s=\d+\z/
            current = locations[$1.to_i] = [$2.sub(/(:\d+):\d+\z/, '\\1')]
          elsif line =~ /\A\s+(.+) s=\d+\z/
            current << $1.sub(/(:\d+):\d+\z/, '\\1')
          end
        end
      end
    end
    samples.each { |s| s[:frames] = s.delete(:ids).flat_map { |id| locations.fetch(id) } }
    { sample_types: types, samples: samples }
  end

  # The same view as parse_raw, taken from our decoder, for comparison.
  def our_view(prof)
    samples = prof.samples.map do |s|
      # Go's reader drops a num label whose value is 0 and has no unit (proto3 cannot tell it from unset).
      labels = s.labels.reject { |k, v| v == 0 && !s.num_units.key?(k) }
      { values: s.values, labels: labels.transform_values(&:to_s),
        frames: s.frames.map { |f| f.line.positive? ? "#{f.function} #{f.file}:#{f.line}" : "#{f.function} #{f.file}" } }
    end
    { sample_types: prof.sample_types, samples: samples }
  end

  # Runs a report command in this process (Heapscope::Report::CLI, which the test requires); returns
  # [status, stdout, stderr].
  def run_cli(command, *argv)
    out = StringIO.new
    err = StringIO.new
    status = Heapscope::Report::CLI.run(command, argv, out: out, err: err)
    [status, out.string, err.string]
  end

  # Runs a workload script (source, given the directory as its argument) in a fresh Ruby with this
  # checkout's lib, writing its profiles into @dir. Returns [the script's path, line of tag -> its
  # line number].
  def run_workload(source)
    script = File.join(@dir, "workload.rb")
    File.write(script, source)
    out, status = Open3.capture2e(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), script, @dir)
    assert status.success?, "workload failed (is the extension built? bundle exec rake compile):\n#{out}"
    [script, ->(tag) { source.lines.index { |l| l.include?(tag) } + 1 }]
  end

  # A report command's --json output, parsed; fails unless it exits 0 with nothing on stderr.
  def json(command, *args)
    status, out, err = run_cli(command, *args, "--json")
    assert_equal [0, ""], [status, err], "#{command} #{args.join(" ")}"
    JSON.parse(out)
  end

  # Writes prof (gzipped) as name in the test's @dir; returns the path.
  def write(name, prof)
    path = File.join(@dir, name)
    File.binwrite(path, prof.to_pprof)
    path
  end

  # A hand-made heapscope-style profile: rows of [frames (leaf first), [alloc_objects, alloc_space,
  # inuse_objects, inuse_space], labels].
  def heapscope_profile(rows, sample_every: 1, time_nanos: 0)
    prof = Heapscope::Pprof::Profile.new(sample_types: HEAPSCOPE_TYPES, period_type: %w[space bytes], period: 1,
                                         time_nanos: time_nanos, comments: ["heapscope sample_every=#{sample_every}"])
    rows.each { |frames, values, labels| prof.add_sample(frames: frames, values: values, labels: labels || {}) }
    prof
  end
end
