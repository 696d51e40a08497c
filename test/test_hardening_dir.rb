# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/surfaces/periodic_writer"
require "heapscope/atomic_write"
require "fileutils"
require "open3"

# Issue 12, items 5 and 6: heapscope's output directory against a local attacker.
#
# Item 5 (TOCTOU): the directory was checked once by path, then the temp file and the rename each
# resolved DIR/NAME by path again. A user owning a parent of the directory swapped it for a symlink
# between check and use (renameat2(RENAME_EXCHANGE) in a loop), so root's writer put profiles and
# temp files into a directory of the attacker's choosing, and rotation deleted there. Now the
# directory is opened once, every ancestor checked on the way down, and every operation is relative
# to that descriptor.
#
# Item 6: rotation counted and deleted every file named like the app's profiles, so three empty files
# with mtimes in 2099 planted by another user in a shared sticky directory made it delete every
# periodic profile and the final one. Now it counts and deletes only what this process wrote (checked
# to still be that very file) and files of earlier processes of the app owned by this user; never a
# final profile this process wrote.
class TestHardeningDir < Minitest::Test
  include SurfacesTestHelper

  NOBODY = 65_534
  # Exchanges two paths with renameat2(RENAME_EXCHANGE) as fast as it can, as the given uid (-1:
  # stays who it is), until SIGTERM or the time limit; then exchanges once more if needed, so each
  # path ends where it began. Prints the number of exchanges that worked.
  SWAPPER = <<~C
    #define _GNU_SOURCE
    #include <fcntl.h>
    #include <grp.h>
    #include <signal.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <sys/syscall.h>
    #include <time.h>
    #include <unistd.h>
    #ifndef RENAME_EXCHANGE
    #define RENAME_EXCHANGE (1 << 1)
    #endif
    static volatile sig_atomic_t stop;
    static void on_term(int sig) { (void)sig; stop = 1; }
    static int exchange(const char *a, const char *b) {
      return (int)syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
    }
    int main(int argc, char **argv) {
      if (argc != 5) return 2;
      long uid = atol(argv[1]);
      if (uid >= 0 && (setgroups(0, NULL) != 0 || setgid((gid_t)uid) != 0 || setuid((uid_t)uid) != 0)) {
        perror("setuid");
        return 3;
      }
      signal(SIGTERM, on_term);
      time_t end = time(NULL) + atol(argv[4]);
      unsigned long swaps = 0;
      puts("ready");
      fflush(stdout);
      while (!stop && time(NULL) < end) {
        if (exchange(argv[2], argv[3]) == 0) swaps++;
      }
      if (swaps % 2 == 1 && exchange(argv[2], argv[3]) == 0) swaps++;
      printf("%lu\\n", swaps);
      return 0;
    }
  C

  def setup
    @tmp = Dir.mktmpdir("heapscope-dir")
    File.chmod(0o755, @tmp) # the attacker must reach the parent it owns
    @attic = File.join(@tmp, "attic")       # the parent of the profile directory
    @dir = File.join(@attic, "profiles")    # HEAPSCOPE_DIR
    @target = File.join(@tmp, "target")     # a directory of the attacker's choice
    @decoy = File.join(@attic, "decoy")     # a symlink to it, swapped with @dir
    Dir.mkdir(@attic, 0o755)
    Dir.mkdir(@dir, 0o755)
    Dir.mkdir(@target, 0o755)
    File.symlink(@target, @decoy)
    # A file in the target named like an old profile of the app: rotation must never reach it.
    @bait = File.join(@target, "web-1-20200101T000000.000Z.heap.pb.gz")
    File.write(@bait, "not heapscope's")
    @warnings = []
    @source = FakeSource.new
  end

  def teardown
    @writer&.stop
    stop_swapper
    FileUtils.rm_rf(@tmp)
  end

  def skip_unless_root
    skip "needs root (another user plays the attacker)" unless Process.euid.zero?
  end

  def writer(dir: @dir, keep: 1, **options)
    @writer = Heapscope::PeriodicWriter.new(dir: dir, interval: 3600, keep: keep, app_name: "web", source: @source,
                                            warn: ->(line) { @warnings << line }, **options)
  end

  def compile_swapper
    src = File.join(@tmp, "swapper.c")
    exe = File.join(@tmp, "swapper")
    File.write(src, SWAPPER)
    out, status = Open3.capture2e(RbConfig::CONFIG["CC"], "-O2", "-o", exe, src)
    assert status.success?, "the swapper compiles: #{out}"
    File.chmod(0o755, exe)
    exe
  end

  # Starts exchanging a and b as uid; returns once the first exchange is about to happen.
  def start_swapper(uid, a, b)
    @swapper_out, @swapper_in = IO.pipe
    @swapper = Process.spawn(compile_swapper, uid.to_s, a, b, "120", out: @swapper_in)
    @swapper_in.close
    assert_equal "ready\n", Timeout.timeout(30) { @swapper_out.gets }
  end

  # Stops the swapper (which leaves both paths as they began); returns its count of exchanges.
  def stop_swapper
    return unless @swapper

    Process.kill("TERM", @swapper)
    Process.wait(@swapper)
    swaps = @swapper_out.read.to_i
    @swapper_out.close
    @swapper = nil
    swaps
  end

  # What a write left outside the profile directory.
  def outside
    Dir.children(@target) - [File.basename(@bait)]
  end

  # Writes for `seconds` (at least 100 times) while the swapper runs; returns the paths written.
  def write_during_swaps(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    written = []
    count = 0
    while count < 100 || Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      written << @writer.write_now
      count += 1
    end
    final, error = @writer.write_final(gc: false)
    written << final unless error
    written.compact
  end

  # Item 5 as reported: root's writer, the parent owned by "nobody", who swaps the directory with a
  # symlink to a root-owned directory of their choice. The parent alone lets them do it: the writer
  # now refuses the directory, naming the parent, and nothing lands outside.
  def test_swap_race_by_the_owner_of_a_parent_writes_nothing_outside
    skip_unless_root
    File.chown(NOBODY, NOBODY, @attic)
    File.lchown(NOBODY, NOBODY, @decoy)
    writer.start
    start_swapper(NOBODY, @dir, @decoy)
    write_during_swaps(2)
    swaps = stop_swapper
    assert_operator swaps, :>, 100, "the attacker swapped"
    assert_empty outside.first(5), "#{outside.size} files written outside #{@dir}"
    assert File.exist?(@bait), "rotation deleted nothing outside #{@dir}"
    assert_empty Dir.children(@dir), "the directory is refused, not written"
    assert_equal 1, @warnings.size, @warnings.inspect
    assert_includes @warnings.first, "Heapscope::UnsafeDirectoryError: refusing to write into #{@dir}: its ancestor " \
                                     "#{@attic} belongs to another user (uid #{NOBODY})"
  end

  # The directory is opened once: when the path is swapped afterwards (here by the same user, whose
  # right it is), every file still goes into the directory the writer opened, and nothing outside.
  def test_files_go_to_the_directory_opened_even_when_its_path_is_swapped
    writer(keep: 1000).start
    start_swapper(-1, @dir, @decoy)
    written = write_during_swaps(2)
    swaps = stop_swapper
    assert_operator swaps, :>, 100, "the path was swapped"
    assert_empty outside.first(5), "#{outside.size} files written outside the directory opened"
    assert File.exist?(@bait)
    assert File.directory?(@dir) && !File.symlink?(@dir)
    assert_operator written.size, :>, 100
    # Two writes in the same millisecond share a name (the second replaces the first): uniq.
    assert_equal written.map { |p| File.basename(p) }.uniq.sort, Dir.children(@dir).sort
  end

  # A symlink in the path owned by another user (here the parent, in a sticky directory) is refused too.
  def test_ancestor_checks_name_the_offending_ancestor
    skip_unless_root
    File.chmod(0o777, @attic)
    error = assert_raises(Heapscope::UnsafeDirectoryError) { Heapscope.write_atomically(File.join(@dir, "heap.pb.gz"), "x") }
    assert_equal "refusing to write into #{@dir}: its ancestor #{@attic} may be written by every user and has no sticky bit " \
                 "(mode 0777), so another user could put another directory in its place; chmod o-w or chmod +t #{@attic}",
                 error.message
    File.chmod(0o1777, @attic)
    assert Heapscope.write_atomically(File.join(@dir, "heap.pb.gz"), "x"), "a sticky ancestor is fine"
    # In a sticky directory, a symlink owned by another user points where they like.
    link = File.join(@attic, "link")
    File.symlink(@attic, link)
    File.lchown(NOBODY, NOBODY, link)
    error = assert_raises(Heapscope::UnsafeDirectoryError) { Heapscope.write_atomically(File.join(link, "profiles", "heap.pb.gz"), "x") }
    assert_equal "refusing to write into #{link}/profiles: #{link} is a symlink owned by another user (uid #{NOBODY}), " \
                 "who chooses where it points; use a directory of your own", error.message
    assert_empty outside
  end

  # Item 6 as reported: a shared sticky directory, three empty files named like the app's profiles
  # with mtimes in 2099 planted by another user, HEAPSCOPE_KEEP=3. Rotation deleted every periodic
  # profile and the final one while stderr said "final profile written".
  def test_files_planted_by_another_user_are_neither_counted_nor_deleted
    skip_unless_native
    skip_unless_root
    shared = File.join(@tmp, "shared")
    Dir.mkdir(shared)
    File.chmod(0o1777, shared)
    go = File.join(@tmp, "go")
    done = File.join(@tmp, "done")
    script = "puts Process.pid; $stdout.flush; sleep 0.02 until File.exist?(#{go.inspect}); " \
             "sleep 0.02 until File.exist?(#{done.inspect})"
    env = ruby_env("HEAPSCOPE_DIR" => shared, "HEAPSCOPE_APP_NAME" => "web", "HEAPSCOPE_INTERVAL" => "0.1",
                   "HEAPSCOPE_KEEP" => "3")
    Open3.popen3(env, RbConfig.ruby, "-e", script) do |stdin, stdout, stderr, wait|
      stdin.close
      pid = Timeout.timeout(30) { stdout.gets }.to_i
      planted = ["web-#{pid}-20990101T000000.000Z.heap.pb.gz", "web-#{pid}-20990101T000000.001Z.heap.pb.gz",
                 "web-1-20990101T000000.000Z-final.heap.pb.gz"].map { |name| File.join(shared, name) }
      planted.each do |path|
        File.write(path, "")
        File.utime(Time.utc(2099), Time.utc(2099), path)
        File.chown(NOBODY, NOBODY, path)
      end
      File.write(go, "")
      # Once the app's own profiles reach the 3 kept, rotation has had the planted files to count. (Where
      # rotation deletes each profile as it is written they never do: then on after 30 s.)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
      until Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline ||
            (Dir.children(shared).reject { |n| n.start_with?(".") }.map { |n| File.join(shared, n) } - planted).size >= 3
        sleep 0.05
      end
      File.write(done, "")
      err = Timeout.timeout(60) { stderr.read }
      assert wait.value.success?, err
      final = err[/^heapscope: final profile written to (\S+)$/, 1]
      assert final, err
      assert File.file?(final), "the final profile survives"
      Heapscope::Pprof.decode(File.binread(final))
      planted.each { |path| assert File.exist?(path), "#{path} was not heapscope's to delete" }
      ours = Dir.children(shared).map { |n| File.join(shared, n) } - planted
      assert_equal 3, ours.size, "the newest 3 of heapscope's own files are kept: #{ours.inspect}"
      assert_includes ours, final
      assert ours.all? { |path| File.stat(path).uid.zero? && File.size(path).positive? }
    end
  end

  # Files of the same owner named like the app's (an earlier process of the app) are rotated, even
  # when their mtimes put them last: but never the final profile this process just wrote.
  def test_rotation_never_deletes_the_final_profile
    planted = (1..3).map { |i| File.join(@dir, "web-1-20990101T000000.00#{i}Z.heap.pb.gz") }
    planted.each do |path|
      File.write(path, "")
      File.utime(Time.utc(2099), Time.utc(2099), path)
    end
    writer(keep: 3)
    2.times { assert @writer.write_now }
    final, error = @writer.write_final(gc: false)
    assert_nil error
    assert File.exist?(final), "the final profile survives rotation"
  end

  # A name this process wrote, now holding another file (replaced by rename: a group member may, in a
  # group-writable directory): rotation leaves it, it is not the file heapscope wrote.
  def test_rotation_deletes_only_the_file_it_wrote_not_one_renamed_over_it
    writer(keep: 1)
    first = @writer.write_now
    other = File.join(@dir, "elsewhere")
    File.write(other, "someone else's")
    File.rename(other, first)
    sleep 0.01
    second = @writer.write_now
    assert_equal "someone else's", File.read(first), "a file heapscope did not write is not deleted"
    assert File.exist?(second)
    assert_equal 0, @writer.stats[:removed]
  end

  def test_temp_files_of_dead_processes_owned_by_another_user_are_left
    skip_unless_root
    dead = Process.spawn(RbConfig.ruby, "-e", "0")
    Process.wait(dead)
    theirs = File.join(@dir, ".web-#{dead}-20260101T000000.000Z.heap.pb.gz.tmp-#{dead}-0123456789abcdef")
    ours = File.join(@dir, ".web-#{dead}-20260101T000000.001Z.heap.pb.gz.tmp-#{dead}-0123456789abcdef")
    [theirs, ours].each { |path| File.write(path, "partial") }
    File.chown(NOBODY, NOBODY, theirs)
    writer.write_now
    assert File.exist?(theirs), "another user's file is not heapscope's to delete"
    refute File.exist?(ours), "heapscope's own dead temp file is removed"
  end
end
