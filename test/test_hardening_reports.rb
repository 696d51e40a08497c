# frozen_string_literal: true

# Issue 11, items 6 and 10: the report commands read hostile profiles. Item 6: reading has a limit
# (--max-size; a gzip bomb, /dev/zero and an endless pipe stop at it with exit 2 and one line), and time
# and memory stay linear in the profile (crafted profiles that made top, flamegraph and diff --html take
# minutes and gigabytes). Item 10: bad input (too few values, invalid UTF-8, a huge -n, a full disk) gets
# exit 2 and one line, never "internal error" or a silent exit 0.
#
# Costs are measured in a child process running exe/heapscope: its peak RSS (VmHWM) and CPU time, read
# in an at_exit hook. Bounds are generous (several times what the code needs, far below what it needed
# before) or ratios between two sizes, so a loaded machine does not make them flake.

require_relative "test_report_helper"
require "rbconfig"
require "zlib"
require "socket"
require_relative "../bench/many_samples"
require_relative "support/hostile_server"

class TestHardeningReports < Minitest::Test
  include HostileServer
  ROOT = File.expand_path("..", __dir__)
  EXE = File.join(ROOT, "exe", "heapscope")
  W = Heapscope::Pprof::Wire::Writer
  TYPES = %w[alloc_objects count alloc_space bytes inuse_objects count inuse_space bytes].freeze
  # Runs exe/heapscope under `load`, recording peak RSS (KiB) and CPU seconds when it exits.
  PROBE = 'at_exit { File.write(ENV.fetch("HS_PROBE"), "#{File.read("/proc/self/status")[/VmHWM:\s*(\d+)/, 1]} ' \
          '#{Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)}") }; $0 = ARGV.shift; load $0'
  Result = Struct.new(:status, :out, :err, :rss_mb, :cpu)

  def setup
    @dir = Dir.mktmpdir("heapscope-hardening")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # --- item 6: limits -------------------------------------------------------------------------------

  def test_a_gzip_bomb_stops_at_the_limit
    # 1 GiB of zeros behind a string-table field that claims all of it: about 1 MB gzipped.
    bomb = path("bomb.pb.gz")
    Zlib::GzipWriter.open(bomb, 9) do |gz|
      gz.write("\x32\x80\x80\x80\x80\x04".b)
      chunk = "\0".b * (1 << 20)
      1024.times { gz.write(chunk) }
    end
    r = heapscope("top", bomb)
    assert_one_line_exit_2(r, "heapscope top: #{bomb}: decompresses to more than the 256 MiB limit (--max-size SIZE raises it)")
    assert_operator r.rss_mb, :<, 600, "the bomb used #{r.rss_mb} MB (1 GB before the limit)"
    r = heapscope("flamegraph", bomb, "--max-size", "16M", "-o", path("bomb.html"))
    assert_one_line_exit_2(r, "heapscope flamegraph: #{bomb}: decompresses to more than the 16 MiB limit (--max-size SIZE raises it)")
    assert_operator r.rss_mb, :<, 150
    refute File.exist?(path("bomb.html")), "nothing is written for a refused profile"
    # A bomb of bytes that cannot start a profile stops at the first piece.
    Zlib::GzipWriter.open(zeros = path("zeros.pb.gz"), 9) { |gz| 64.times { gz.write("\0".b * (1 << 20)) } }
    r = heapscope("top", zeros)
    assert_one_line_exit_2(r, "heapscope top: #{zeros}: field number 0 in Profile")
    assert_operator r.rss_mb, :<, 100
  end

  def test_endless_and_oversized_inputs_are_refused
    r = heapscope("top", "/dev/zero", timeout: 60)
    assert_one_line_exit_2(r, "heapscope top: /dev/zero: not gzip or pprof protobuf data (field number 0 in Profile)")
    assert_operator r.rss_mb, :<, 100

    # A pipe that starts like a profile and never ends: read until the limit, then refused.
    reader, writer = IO.pipe
    feeder = Thread.new do
      writer.write("\x32\x80\x80\x80\x80\x04".b)
      chunk = "\0".b * 65_536
      loop { writer.write(chunk) }
    rescue Errno::EPIPE, IOError
      nil
    end
    r = heapscope("top", "/dev/stdin", "--max-size", "8M", stdin: reader, timeout: 60)
    writer.close
    feeder.join
    reader.close
    assert_one_line_exit_2(r, "heapscope top: /dev/stdin: goes on past the 8 MiB limit (--max-size SIZE raises it)")
    assert_operator r.rss_mb, :<, 150

    # A file over the limit is refused before it is read; a profile is read again with a higher limit.
    big = write_bytes("big.pb.gz", crafted(300, 3000))
    r = heapscope("top", big, "--max-size", "1M")
    assert_one_line_exit_2(r, /\Aheapscope top: #{Regexp.escape(big)}: decompresses to more than the 1 MiB limit/)
    assert_equal 0, heapscope("top", big, "--max-size", "64MiB").status
    File.binwrite(raw = path("raw.pb"), "\x32".b + "\x00".b * (2 << 20))
    assert_one_line_exit_2(heapscope("top", raw, "--max-size", "1M"),
                           "heapscope top: #{raw}: the file is 2.0 MiB, more than the 1 MiB limit (--max-size SIZE raises it)")
    assert_one_line_exit_2(heapscope("top", big, "--max-size", "lots"),
                           "heapscope top: --max-size must be a size like 512M or 2G, got \"lots\"")

    # leaks DIR reads the regular files in it: a FIFO named like a profile would block it forever.
    dir = path("series")
    Dir.mkdir(dir)
    2.times { |k| File.binwrite(File.join(dir, "heap-#{k}.pb.gz"), crafted(2 + k, 5)) }
    File.utime(Time.now - 60, Time.now - 60, File.join(dir, "heap-0.pb.gz"))
    File.mkfifo(File.join(dir, "heap-2.pb.gz"))
    r = heapscope("leaks", dir, timeout: 60)
    assert_equal [0, ""], [r.status, r.err]
    assert_includes r.out, "Profiles: 2 from"
  end

  # One location with 30,000 inlined lines shared by every sample: work grows with samples x lines, a
  # product the file does not pay for. Stacks are capped (max_size / 4 frames) and within the cap the
  # reports do each location's lines once, not once per sample.
  def test_inlined_lines_cost_per_location_not_per_sample
    small = write_bytes("inline-small.pb.gz", inlined(125, 7_500))
    large = write_bytes("inline-large.pb.gz", inlined(1_000, 30_000)) # 4x the file, 32x samples x lines
    [%w[top], %w[top --by function], %w[flamegraph -o -]].each do |command, *flags|
      a = heapscope(command, small, *flags)
      b = heapscope(command, large, *flags)
      assert_equal [0, 0], [a.status, b.status], a.err + b.err
      assert_operator b.cpu, :<, 8 * a.cpu + 1.5, "#{command} #{flags.join(" ")}: #{a.cpu.round(2)} s -> #{b.cpu.round(2)} s"
    end
    r = heapscope("top", large, "--max-size", "64M")
    assert_one_line_exit_2(r, "heapscope top: #{large}: its stacks expand to more than 16777216 frames (inlined " \
                              "lines counted at every sample that uses them), the limit that goes with 64 MiB " \
                              "(--max-size SIZE raises it)")
  end

  # Long names cost once per function, not once per frame of every sample: 4x the input (4x the samples'
  # frames, 4x the names' bytes) must not take 16x the time.
  def test_top_time_is_linear_in_names_and_frames
    a = heapscope("top", write_bytes("names-a.pb.gz", crafted(200, 1000, name_len: 16_384, rotate: false)), "--by", "function")
    b = heapscope("top", write_bytes("names-b.pb.gz", crafted(800, 1000, name_len: 65_536, rotate: false)), "--by", "function")
    assert_equal [0, 0], [a.status, b.status], a.err + b.err
    assert_operator b.cpu, :<, 8 * a.cpu, "#{a.cpu.round(2)} s -> #{b.cpu.round(2)} s"
  end

  # The attack's profile: 2,000 samples of 3,000 distinct frames each (every stack a rotation), 130 KB
  # gzipped. Before: flamegraph 1.8 GB and a 147 MB page, diff --html 2.9 GB, over a minute each.
  def test_a_crafted_deep_profile_stays_small_and_fast
    prof = write_bytes("crafted.pb.gz", crafted(2000, 3000))
    other = write_bytes("crafted2.pb.gz", crafted(2000, 3000))
    html = path("crafted.html")
    r = heapscope("flamegraph", prof, "-o", html)
    assert_equal [0, ""], [r.status, r.err]
    assert_operator r.rss_mb, :<, 700
    assert_operator File.size(html), :<, 16 << 20
    assert_includes File.read(html), "largest frames are drawn", "a capped page says so"
    assert_operator r.cpu, :<, 60
    r = heapscope("diff", other, prof, "--html", "-o", path("diff.html"))
    assert_equal [0, ""], [r.status, r.err]
    assert_operator r.rss_mb, :<, 900
    assert_operator r.cpu, :<, 90
    r = heapscope("top", prof)
    assert_equal 0, r.status
    assert_operator r.rss_mb, :<, 500
  end

  # Sample type names were looked up by a linear search each, once per type (and per row): a 1.4 MB
  # profile declaring 100,000 types took top, flamegraph and diff over two minutes.
  def test_many_sample_types_cost_linear_time
    prof = write_bytes("types.pb.gz", many_types(100_000, 5))
    [["top", prof], ["flamegraph", prof, "-o", "-"], ["diff", prof, prof]].each do |args|
      r = heapscope(*args, timeout: 90)
      assert_equal [0, ""], [r.status, r.err], args.first
      assert_operator r.cpu, :<, 30, args.first
    end
  end

  # A comment is the writer's text: "sampling=windowed " repeated made a backtracking regexp quadratic
  # (200,000 times: hours, and SIGTERM could not stop it).
  def test_comments_are_read_in_linear_time
    prof = Heapscope::Pprof::Profile.new(sample_types: TYPES.each_slice(2).to_a, comments: ["sampling=windowed " * 200_000])
    prof.add_sample(frames: [["f", "a.rb", 1]], values: [1, 2, 3, 4])
    r = heapscope("top", write_bytes("comment.pb.gz", prof.to_pprof), "--json", timeout: 60)
    assert_equal [0, ""], [r.status, r.err]
    assert_operator r.cpu, :<, 10
  end

  # Issue 12, item 10: 4,000,000 equal one-frame samples gzip to 85 KB (44 MB decompressed) and took
  # `top` 46-56 s and 2.2 GB, a Sample with its arrays and Hash each. Equal samples are now one object;
  # 1,000,000 of them took 5 s and 330 MB before (Ruby 3.1, this machine) and take under 2 s and 40 MB.
  def test_many_equal_samples_cost_a_slot_each
    prof = write_bytes("equal.pb.gz", equal_samples(1_000_000))
    r = heapscope("top", prof)
    assert_equal [0, ""], [r.status, r.err]
    assert_includes r.out, "95.4 MiB  100.0%"
    assert_operator r.rss_mb, :<, 150
  end

  # Distinct samples cost their objects: at most max_size / 256 of them are read, and at most
  # max_size / 64 samples in all, each refused with one line naming the count and the flag.
  def test_samples_are_capped_by_max_size
    r = heapscope("top", write_bytes("distinct.pb.gz", equal_samples(2049, distinct: true)), "--max-size", "512K")
    assert_one_line_exit_2(r, /: it has more than 2048 distinct samples, the limit that goes with 512 KiB \(--max-size SIZE raises it\)\z/)
    r = heapscope("top", write_bytes("equal-cap.pb.gz", equal_samples(8193)), "--max-size", "512K")
    assert_one_line_exit_2(r, /: it has more than 8192 samples, the limit that goes with 512 KiB \(--max-size SIZE raises it\)\z/)
    assert_equal 0, heapscope("top", path("equal-cap.pb.gz"), "--max-size", "1M").status
  end

  # Issue 12, item 11: `heapscope retainers URL` read without bounds (Net::HTTP: a timeout per read, whole
  # header lines and bodies): an endless body reached 3.16 GB in 60 s, a header line a second hung until
  # killed. Now one deadline (--timeout, default 30 s) covers the exchange, the head is at most 64 KiB in
  # 100 lines and the body at most 16 MiB, each ending in exit 2 and one line.
  def test_retainers_from_a_hostile_server_end_on_time_in_bounded_memory
    endless = hostile_server { |c| c.write("HTTP/1.1 200 OK\r\n\r\n") ; loop { c.write("x" * 65_536) } }
    r = heapscope("retainers", endless, "a.rb:1", timeout: 120)
    assert_one_line_exit_2(r, /\Aheapscope retainers: 127\.0\.0\.1:\d+: the answer's body is over the 16 MiB limit\z/)
    assert_operator r.rss_mb, :<, 150
    drip = hostile_server { |c| c.write("HTTP/1.1 200 OK\r\n") ; loop { c.write("X-Drip: 1\r\n") ; sleep 1 } }
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    r = heapscope("retainers", drip, "a.rb:1", "--timeout", "3", timeout: 120)
    assert_one_line_exit_2(r, /\Aheapscope retainers: 127\.0\.0\.1:\d+: no complete answer within 3 s \(--timeout SECONDS raises it\)\z/)
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 30
    huge = hostile_server { |c| c.write("HTTP/1.1 200 OK\r\nX-Huge: ") ; loop { c.write("y" * 65_536) } }
    r = heapscope("retainers", huge, "a.rb:1", timeout: 120)
    assert_one_line_exit_2(r, /\Aheapscope retainers: 127\.0\.0\.1:\d+: the answer's head is over 64 KiB\z/)
    many = hostile_server { |c| c.write("HTTP/1.1 200 OK\r\n") ; loop { c.write("X-N: 1\r\n") } }
    r = heapscope("retainers", many, "a.rb:1", timeout: 120)
    assert_one_line_exit_2(r, /\Aheapscope retainers: 127\.0\.0\.1:\d+: the answer has more than 100 header lines\z/)
    claims = hostile_server { |c| c.write("HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n") ; sleep 60 }
    r = heapscope("retainers", claims, "a.rb:1", timeout: 120)
    assert_one_line_exit_2(r, /: the answer's body is 99999999999 bytes, over the 16 MiB limit\z/)
    chunked = hostile_server { |c| c.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nok \e\r\n3;x=1\r\nend\r\n0\r\n\r\n") }
    r = heapscope("retainers", chunked, "a.rb:1", timeout: 120)
    assert_equal [0, "ok \\eend\n", ""], [r.status, r.out, r.err]
  ensure
    stop_hostile_servers
  end

  # --- item 10: bad input is exit 2 (or read), never an internal error -----------------------------

  def test_bad_profiles_are_exit_2_or_read_not_internal_errors
    few = Heapscope::Pprof::Profile.new(sample_types: TYPES.each_slice(2).to_a)
    few.add_sample(frames: [["f", "a.rb", 1]], values: [1, 2, 3, 4])
    few.samples[0].values.pop(2)
    few = write_bytes("few.pb.gz", few.to_pprof)
    [["top", few], ["flamegraph", few, "-o", "-"], ["diff", few, few]].each do |command, *args|
      assert_one_line_exit_2(heapscope(command, *args),
                             "heapscope #{command}: #{few}: sample 0 has 2 values, but the profile has 4 sample types")
    end

    # Invalid UTF-8 (Ruby allows it in method names and paths, so heapscope's own profiles can hold it):
    # every report reads it and shows the bytes as \xNN.
    bad = Heapscope::Pprof::Profile.new(sample_types: TYPES.each_slice(2).to_a, comments: ["sample_every=0"])
    bad.add_sample(frames: [[binary("caf\xE9#brew"), binary("app/\xFF.rb"), 3]], values: [1, 2, 3, 4],
                   labels: { "class" => binary("K\xFE") })
    bad2 = Heapscope::Pprof.decode(bad.to_pprof)
    bad2.samples[0].values.map! { |v| v * 2 }
    bad = write_bytes("bad.pb.gz", bad.to_pprof)
    bad2 = write_bytes("bad2.pb.gz", bad2.to_pprof)
    [["top", bad], ["top", bad, "--json"], ["top", bad, "--by", "class"], ["top", bad, "--by", "class", "--json"],
     ["flamegraph", bad, "-o", "-"], ["diff", bad, bad2, "--json"], ["diff", bad, bad2, "--html", "-o", "-"]].each do |args|
      r = heapscope(*args)
      assert_equal [0, ""], [r.status, r.err], args.join(" ")
      assert r.out.valid_encoding?, args.join(" ")
      assert_match(/caf\\\\?xE9#brew|K\\\\?xFE/, r.out, args.join(" "))
    end

    # -n larger than any count of rows (even past 64 bits) shows every row.
    r = heapscope("top", bad, "-n", "1" + "0" * 30)
    assert_equal [0, ""], [r.status, r.err]
    assert_includes r.out, "showing 1 of 1 sites"
  end

  def test_a_full_disk_is_exit_2_with_one_line
    good = Heapscope::Pprof::Profile.new(sample_types: TYPES.each_slice(2).to_a, time_nanos: 1_800_000_000 * 10**9)
    good.add_sample(frames: [["f", "a.rb", 1]], values: [1, 2, 3, 4])
    later = Heapscope::Pprof.decode(good.to_pprof)
    later.time_nanos += 60 * 10**9
    later.samples[0].values.map! { |v| v * 2 }
    a = write_bytes("a.pb.gz", good.to_pprof)
    b = write_bytes("b.pb.gz", later.to_pprof)
    [["top", a], ["top", a, "--json"], ["flamegraph", a, "-o", "-"], ["diff", a, b], ["diff", a, b, "--html", "-o", "-"],
     ["leaks", a, b]].each do |args|
      r = heapscope(*args, stdout: "/dev/full")
      command = args.first
      assert_one_line_exit_2(r, "heapscope #{command}: cannot write the output: No space left on device")
    end
    r = heapscope("flamegraph", a, "-o", "/dev/full")
    assert_one_line_exit_2(r, "heapscope flamegraph: cannot write /dev/full: No space left on device")
  end

  private

  def path(name)
    File.join(@dir, name)
  end

  def binary(text)
    text.b.force_encoding(Encoding::UTF_8)
  end

  def write_bytes(name, bytes)
    File.binwrite(path(name), bytes)
    path(name)
  end

  def assert_one_line_exit_2(r, expected)
    assert_equal 2, r.status, "exit status; stderr: #{r.err[0, 500]}"
    assert_equal "", r.out
    assert_equal 1, r.err.lines.size, "one line: #{r.err[0, 500].inspect}"
    expected.is_a?(Regexp) ? assert_match(expected, r.err.chomp) : assert_equal(expected, r.err.chomp)
  end

  # Runs exe/heapscope in a child; stdout to a file (or stdout: a path such as /dev/full). The address
  # space limit keeps a runaway child (the code before the fix) from taking the machine.
  def heapscope(*args, stdin: File::NULL, stdout: nil, timeout: 240)
    probe = path("probe-#{rand(1 << 30)}")
    out_path = stdout || path("out-#{rand(1 << 30)}")
    err_path = path("err-#{rand(1 << 30)}")
    pid = Process.spawn({ "HS_PROBE" => probe }, RbConfig.ruby, "-e", PROBE, EXE, *args,
                        in: stdin, out: out_path, err: err_path, rlimit_as: 4 << 30, pgroup: true)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    status = nil
    until (status = Process.wait2(pid, Process::WNOHANG)&.last)
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        Process.kill("KILL", -pid)
        Process.wait(pid)
        flunk "heapscope #{args.join(" ")[0, 200]} did not finish in #{timeout} s"
      end
      sleep 0.05
    end
    rss, cpu = File.exist?(probe) ? File.read(probe).split : [0, 0]
    out = stdout ? "" : File.binread(out_path).force_encoding(Encoding::UTF_8)
    Result.new(status.exitstatus, out, File.read(err_path), rss.to_i / 1024, cpu.to_f)
  end

  # gzipped profile.proto of n one-frame samples, all equal (or each with its own inuse_space).
  def equal_samples(n, distinct: false)
    Zlib.gzip(ManySamples.profile(n, distinct: distinct))
  end

  # gzipped profile.proto: `samples` stacks over `frames` locations (one line, one function each); each
  # stack is 1..frames rotated by its index (all distinct), or all the same with rotate: false.
  def crafted(samples, frames, name_len: nil, rotate: true)
    strings = { "" => 0 }
    s = ->(x) { strings[x] ||= strings.size }
    w = W.new
    TYPES.each_slice(2) { |t, u| w.message(1, W.new.tap { |vt| vt.int(1, s[t]); vt.int(2, s[u]) }) }
    ids = (1..frames).to_a
    samples.times do |j|
      sw = W.new
      sw.packed(1, rotate ? ids.rotate(j) : ids)
      sw.packed(2, [1, 100, 1, 100])
      w.message(2, sw)
    end
    frames.times do |i|
      line = W.new.tap { |lw| lw.int(1, i + 1); lw.int(2, i + 1) }
      w.message(4, W.new.tap { |loc| loc.int(1, i + 1); loc.message(4, line) })
    end
    frames.times do |i|
      name = s["f#{i}#{"x" * name_len.to_i}"]
      w.message(5, W.new.tap { |fw| fw.int(1, i + 1); fw.int(2, name); fw.int(4, s["app/x.rb"]) })
    end
    w.packed(13, [s["heapscope sample_every=1"]])
    strings.each_key { |x| w.bytes(6, x) }
    Zlib.gzip(w.buf)
  end

  # gzipped profile.proto with `types` sample types and `samples` one-frame samples.
  def many_types(types, samples)
    strings = { "" => 0 }
    s = ->(x) { strings[x] ||= strings.size }
    w = W.new
    types.times { |i| w.message(1, W.new.tap { |vt| vt.int(1, s["t#{i}_space"]); vt.int(2, s["bytes"]) }) }
    samples.times do |j|
      w.message(2, W.new.tap { |sw| sw.packed(1, [j + 1]); sw.packed(2, Array.new(types) { |i| i + j }) })
      line = W.new.tap { |lw| lw.int(1, j + 1); lw.int(2, 1) }
      w.message(4, W.new.tap { |loc| loc.int(1, j + 1); loc.message(4, line) })
      w.message(5, W.new.tap { |fw| fw.int(1, j + 1); fw.int(2, s["f#{j}"]) })
    end
    strings.each_key { |x| w.bytes(6, x) }
    Zlib.gzip(w.buf)
  end

  # gzipped profile.proto: location 1 has `lines` inlined lines (distinct functions, one file and line);
  # each of `samples` stacks is its own leaf location, then location 1.
  def inlined(samples, lines)
    strings = { "" => 0 }
    s = ->(x) { strings[x] ||= strings.size }
    w = W.new
    TYPES.each_slice(2) { |t, u| w.message(1, W.new.tap { |vt| vt.int(1, s[t]); vt.int(2, s[u]) }) }
    samples.times { |j| w.message(2, W.new.tap { |sw| sw.packed(1, [2 + j, 1]); sw.packed(2, [1, 100, 1, 100]) }) }
    fat = W.new
    fat.int(1, 1)
    lines.times { |i| fat.message(4, W.new.tap { |lw| lw.int(1, i + 1); lw.int(2, 1) }) }
    w.message(4, fat)
    samples.times do |j|
      line = W.new.tap { |lw| lw.int(1, lines + 1); lw.int(2, j + 1) }
      w.message(4, W.new.tap { |loc| loc.int(1, 2 + j); loc.message(4, line) })
    end
    (lines + 1).times { |i| w.message(5, W.new.tap { |fw| fw.int(1, i + 1); fw.int(2, s["g#{i}"]); fw.int(4, s["in.rb"]) }) }
    strings.each_key { |x| w.bytes(6, x) }
    Zlib.gzip(w.buf)
  end
end
