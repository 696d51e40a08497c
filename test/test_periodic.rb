# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/surfaces/periodic_writer"
require "zlib"
require "fileutils"

# The periodic writer with a fake source: interval writes, names, rotation, final file, failure
# warnings, and atomicity under kill -9. test_periodic_auto checks the same with the real profiler.
class TestPeriodic < Minitest::Test
  include SurfacesTestHelper

  NAME = /\Aweb-#{Process.pid}-\d{8}T\d{6}\.\d{3}Z(-final)?\.heap\.pb\.gz\z/.freeze

  def setup
    @dir = Dir.mktmpdir("heapscope-periodic")
    @warnings = []
    @source = FakeSource.new
  end

  def teardown
    @writer&.stop
    reap_children
    system("umount", @mount, err: File::NULL) if @mount
    FileUtils.rm_rf(@dir)
  end

  def writer(**options)
    @writer = Heapscope::PeriodicWriter.new(dir: @dir, app_name: "web", source: @source,
                                            warn: ->(line) { @warnings << line }, **options)
  end

  def profiles
    Dir.children(@dir).sort
  end

  def test_writes_every_interval_with_app_pid_and_time_in_the_name
    writer(interval: 0.2).start
    wait_for("3 files") { profiles.size >= 3 }
    @writer.stop
    profiles.each do |name|
      assert_match NAME, name
      refute name.include?("-final")
      assert_includes Heapscope::Pprof.decode(File.binread(File.join(@dir, name))).sample_type_names, "inuse_space"
    end
    assert_equal [[false, :heap]], @source.calls.uniq
    assert_operator @writer.stats[:written], :>=, 3
    assert_empty @warnings
  end

  def test_stop_is_prompt_and_final_is_marked
    writer(interval: 3600).start
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    @writer.stop
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 1
    assert_empty profiles
    path = @writer.write_now(final: true, gc: true)
    assert_equal [File.basename(path)], profiles
    assert_match(/-final\.heap\.pb\.gz\z/, path)
    assert_equal [true, :heap], @source.calls.last
  end

  def test_rotation_keeps_the_newest_k
    writer(interval: 3600, keep: 3)
    # Another app's file and an unrelated file in the same directory are never touched.
    File.write(File.join(@dir, "other-1-20260101T000000.000Z.heap.pb.gz"), "x")
    File.write(File.join(@dir, "notes.txt"), "x")
    paths = Array.new(6) do
      sleep 0.01 # distinct timestamps
      @writer.write_now
    end
    mine = profiles.grep(/\Aweb-/)
    assert_equal paths.last(3).map { |p| File.basename(p) }, mine
    assert_includes profiles, "other-1-20260101T000000.000Z.heap.pb.gz"
    assert_includes profiles, "notes.txt"
    assert_equal({ written: 6, failed: 0, removed: 3 }, @writer.stats)
  end

  def test_rotation_removes_temp_files_of_dead_processes_only
    dead = Process.spawn(RbConfig.ruby, "-e", "0")
    Process.wait(dead)
    # Temp names are .NAME.tmp-PID-RANDOM (.NAME.tmp-PID before issue 11: still cleaned up).
    stale = File.join(@dir, ".web-#{dead}-20260101T000000.000Z.heap.pb.gz.tmp-#{dead}-0123456789abcdef")
    stale_old = File.join(@dir, ".web-#{dead}-20260101T000000.001Z.heap.pb.gz.tmp-#{dead}")
    live = File.join(@dir, ".web-#{Process.ppid}-20260101T000000.000Z.heap.pb.gz.tmp-#{Process.ppid}-0123456789abcdef")
    [stale, stale_old, live].each { |path| File.write(path, "partial") }
    writer(interval: 3600).write_now
    refute File.exist?(stale), "a dead writer's temp file is removed"
    refute File.exist?(stale_old), "a dead writer's temp file (old name) is removed"
    assert File.exist?(live), "a live writer's temp file is left alone"
  end

  def test_not_running_writes_nothing
    @source.running = false
    assert_nil writer(interval: 3600).write_now
    assert_empty profiles
  end

  def test_unwritable_dir_warns_once_per_failure_class
    blocker = File.join(@dir, "a-file")
    File.write(blocker, "")
    @writer = Heapscope::PeriodicWriter.new(dir: File.join(blocker, "sub"), app_name: "web", source: @source,
                                            warn: ->(line) { @warnings << line })
    3.times { assert_nil @writer.write_now }
    assert_equal 1, @warnings.size, @warnings.inspect
    assert_match(%r{\Aheapscope: cannot write profiles to .*/a-file/sub: Errno::(EEXIST|ENOTDIR): .*\(further Errno::\w+ failures are not reported\)\z},
                 @warnings.first)
    assert_equal 3, @writer.stats[:failed]
  end

  def test_disk_full_leaves_no_partial_file
    @mount = File.join(@dir, "small")
    Dir.mkdir(@mount)
    skip "cannot mount a tmpfs here" unless system("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", @mount, err: File::NULL)
    @source.payload = Zlib.gzip(Random.new(1).bytes(200_000)) # larger than the disk
    w = Heapscope::PeriodicWriter.new(dir: @mount, app_name: "web", source: @source, warn: ->(line) { @warnings << line })
    3.times { assert_nil w.write_now }
    assert_empty Dir.children(@mount), "neither a partial profile nor a temp file remains"
    assert_equal 1, @warnings.size
    assert_match(/Errno::ENOSPC/, @warnings.first)
    @source.payload = nil
    assert w.write_now, "writes resume once there is room"
  end

  def test_kill_9_during_writes_leaves_only_complete_files
    # A child writes a 4 MB profile every 20 ms; it is killed at random moments, mid-write or not.
    script = <<~RUBY
      require "heapscope/surfaces/periodic_writer"
      require "zlib"
      data = Zlib.gzip(Random.new(2).bytes(4_000_000))
      source = Object.new
      source.define_singleton_method(:running?) { true }
      source.define_singleton_method(:profile) { |**| data }
      Heapscope::PeriodicWriter.new(dir: ARGV[0], interval: 0.02, keep: 1000, app_name: "web", source: source).start
      $stdout.puts data.bytesize
      $stdout.flush
      sleep
    RUBY
    size = nil
    6.times do |round|
      pid, out, = spawn_child({ "RUBYLIB" => LIB }, RbConfig.ruby, "-e", script, @dir, dir: Dir.tmpdir)
      wait_for("the child to start") { File.size?(out) }
      size = File.read(out).to_i
      wait_for("a profile from round #{round}") { Dir.children(@dir).count { |n| !n.start_with?(".") } > round }
      sleep rand * 0.2
      Process.kill("KILL", pid)
      Process.wait(pid)
      File.unlink(out)
    end
    finished = Dir.children(@dir).reject { |n| n.start_with?(".") }
    assert_operator finished.size, :>=, 4
    finished.each do |name|
      data = File.binread(File.join(@dir, name))
      assert_equal size, data.bytesize, "#{name} is complete"
      Zlib.gunzip(data)
    end
    # Whatever was mid-write is only ever a hidden temp file, and the next writer removes it.
    Dir.children(@dir).select { |n| n.start_with?(".") }.each { |n| assert_match(/\A\.web-\d+-.*\.heap\.pb\.gz\.tmp-\d+-[0-9a-f]{16}\z/, n) }
    $stderr.puts "temp files left by kill -9: #{Dir.children(@dir).count { |n| n.start_with?(".") }}" if ENV["HEAPSCOPE_TEST_VERBOSE"]
    writer(interval: 3600, keep: 1000).write_now
    assert_empty Dir.children(@dir).select { |n| n.start_with?(".") }
  end

  def test_bad_arguments
    assert_raises(ArgumentError) { Heapscope::PeriodicWriter.new(dir: @dir, interval: 0, source: @source) }
    assert_raises(ArgumentError) { Heapscope::PeriodicWriter.new(dir: @dir, keep: 0, source: @source) }
    assert_raises(ArgumentError) { Heapscope::PeriodicWriter.new(dir: @dir, app_name: "a/b", source: @source) }
  end
end
