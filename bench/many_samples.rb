# frozen_string_literal: true

# bench/many_samples.rb: what a profile of many samples costs `heapscope top` (issue 12, item 10): N
# one-frame samples, all equal (gzip makes 4,000,000 of them 85 KB, 44 MB decompressed) or each with
# its own value (every one a Sample object). Prints, per profile, the decompressed bytes, the time and
# the peak RSS of `exe/heapscope top` (VmHWM of the child), and the RSS per decompressed byte.
#
#   bundle exec ruby -Ilib bench/many_samples.rb [equal:4000000 distinct:1000000 ...]
require "heapscope/pprof"
require "rbconfig"
require "tmpdir"
require "zlib"

# The profiles (test/test_hardening_reports.rb reads smaller ones through this module).
module ManySamples
  W = Heapscope::Pprof::Wire::Writer

  # profile.proto (raw) of n one-frame samples of app/x.rb:7 with four values, the last one 100, or
  # i + 1 for the i-th when distinct.
  def self.profile(n, distinct: false)
    strings = { "" => 0 }
    s = ->(x) { strings[x] ||= strings.size }
    w = W.new
    %w[alloc_objects count alloc_space bytes inuse_objects count inuse_space bytes].each_slice(2) do |t, u|
      w.message(1, W.new.tap { |vt| vt.int(1, s[t]); vt.int(2, s[u]) })
    end
    one = ->(v) { W.new.tap { |o| o.message(2, W.new.tap { |sw| sw.packed(1, [1]); sw.packed(2, [1, 100, 1, v]) }) }.buf }
    if distinct
      n.times { |i| w.buf << one.call(i + 1) }
    else
      w.buf << one.call(100) * n
    end
    w.message(4, W.new.tap { |loc| loc.int(1, 1); loc.message(4, W.new.tap { |lw| lw.int(1, 1); lw.int(2, 7) }) })
    w.message(5, W.new.tap { |fw| fw.int(1, 1); fw.int(2, s["f"]); fw.int(4, s["app/x.rb"]) })
    strings.each_key { |x| w.bytes(6, x) }
    w.buf
  end
end

return unless $PROGRAM_NAME == __FILE__

EXE = File.expand_path("../exe/heapscope", __dir__)
PROBE = 'at_exit { File.write(ENV.fetch("HS_PROBE"), File.read("/proc/self/status")[/VmHWM:\s*(\d+)/, 1]) }; ' \
        '$0 = ARGV.shift; load $0'

cases = ARGV.empty? ? %w[equal:1000000 equal:4000000 distinct:1000000] : ARGV
puts "| samples | decompressed | gzipped | top: time | peak RSS | RSS per decompressed byte | outcome |"
puts "|---|---|---|---|---|---|---|"
Dir.mktmpdir do |dir|
  cases.each do |c|
    kind, n = c.split(":")
    raw = ManySamples.profile(Integer(n), distinct: kind == "distinct")
    file = File.join(dir, "#{c.tr(":", "-")}.pb.gz")
    File.binwrite(file, Zlib.gzip(raw))
    probe = File.join(dir, "probe")
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    pid = Process.spawn({ "HS_PROBE" => probe }, RbConfig.ruby, "-e", PROBE, EXE, "top", file,
                        out: File::NULL, err: File.join(dir, "err"))
    status = Process.wait2(pid).last
    secs = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
    rss = File.read(probe).to_i * 1024
    outcome = status.success? ? "read" : File.read(File.join(dir, "err")).strip.sub(/\A.*?: .*?: /, "")
    puts format("| %s %s | %.1f MB | %d KB | %.1f s | %d MB | %.1f | %s |", n, kind, raw.bytesize / 1e6,
                File.size(file) / 1000, secs, rss / 1_000_000, rss.to_f / raw.bytesize, outcome)
  end
end
