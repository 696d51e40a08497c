# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/surfaces/periodic_writer"
require "heapscope/atomic_write"
require "fileutils"
require "open3"
require "securerandom"

# Issue 11, item 3: a local user who can write into the profile directory must not be able to make
# heapscope overwrite another file (the attack made a root application overwrite a root-only 0600
# file), whichever way heapscope writes: the periodic writer, autostart's final profile,
# Heapscope.write. The attacker's moves are played here by the test itself: symlinks planted at
# every name heapscope could use in the next few seconds, and directories others can write into.
class TestHardeningFiles < Minitest::Test
  include SurfacesTestHelper

  SECRET = "root-only secret\n"
  NOBODY = 65_534

  def setup
    @tmp = Dir.mktmpdir("heapscope-hardening")
    @dir = File.join(@tmp, "profiles")
    Dir.mkdir(@dir, 0o755)
    # The file the attacker wants overwritten: outside the profile directory, 0600.
    @vault = File.join(@tmp, "vault")
    Dir.mkdir(@vault, 0o700)
    @secret = File.join(@vault, "secret")
    File.write(@secret, SECRET, perm: 0o600)
    @warnings = []
    @source = FakeSource.new
  end

  def teardown
    @writer&.stop
    FileUtils.rm_rf(@tmp)
  end

  def writer
    @writer = Heapscope::PeriodicWriter.new(dir: @dir, interval: 3600, keep: 1_000_000, app_name: "web", source: @source,
                                            warn: ->(line) { @warnings << line })
  end

  # Plants a symlink to the secret at each name the writer of pid could use from now until `ahead`
  # seconds after planting ends: the profile's name (periodic and/or final, per `finals`), and its
  # temp name as the old writer predictably formed it (.NAME.tmp-PID). The names are planted one
  # millisecond stamp after another until the stamps lead the clock by `ahead`, so however slowly a
  # loaded machine plants (last CI's took over 20 s for 20 s of names), every name of the next
  # `ahead` seconds is there when this returns. Returns the profile names covered.
  def plant(pid, app:, finals:, ahead: 10)
    base = Time.now.utc
    give_up = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 180
    names = []
    (0..).each do |ms|
      stamp_time = base + Rational(ms, 1000)
      break if stamp_time > Time.now.utc + ahead
      flunk "planting cannot outrun the clock on this machine" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > give_up
      stamp = stamp_time.strftime("%Y%m%dT%H%M%S.%LZ")
      finals.each do |final|
        name = "#{app}-#{pid}-#{stamp}#{final ? "-final" : ""}.heap.pb.gz"
        names << name
        [name, ".#{name}.tmp-#{pid}"].each do |planted|
          File.symlink(@secret, File.join(@dir, planted))
        rescue Errno::EEXIST
          nil
        end
      end
    end
    names
  end

  def assert_secret_intact
    assert_equal SECRET, File.read(@secret), "the secret was overwritten through a planted symlink"
    assert_equal 0o600, File.stat(@secret).mode & 0o777
  end

  def assert_regular_profile(path)
    assert path, "a profile was written: #{@warnings.inspect}"
    assert File.lstat(path).file?, "#{path} is a file of its own, not a symlink"
    Heapscope::Pprof.decode(File.binread(path))
  end

  def test_symlinks_at_the_predicted_temp_and_final_names_are_never_followed
    planted = plant(Process.pid, app: "web", finals: [false, true])
    paths = Array.new(3) do
      sleep 0.01
      writer.write_now
    end
    final = @writer.write_now(final: true)
    assert_secret_intact
    (paths + [final]).each do |path|
      assert_regular_profile(path)
      assert_includes planted, File.basename(path), "the attack covered the name used"
    end
    assert_empty @warnings
    # The temp files have names nobody could plant: .NAME.tmp-PID-<64 random bits>; none is left.
    refute Dir.children(@dir).any? { |n| n.match?(/\.tmp-\d+-[0-9a-f]{16}\z/) }
  end

  # The attack of the issue, end to end: a root application under RUBYOPT=-rheapscope/auto writes
  # its final profile at exit into a directory where symlinks wait at every name it could use.
  def test_autostart_final_profile_cannot_be_redirected_by_planted_symlinks
    skip_unless_native
    go = File.join(@tmp, "go")
    script = "puts Process.pid; $stdout.flush; sleep 0.02 until File.exist?(#{go.inspect})"
    env = ruby_env("HEAPSCOPE_DIR" => @dir, "HEAPSCOPE_APP_NAME" => "victim", "HEAPSCOPE_INTERVAL" => "3600")
    Open3.popen3(env, RbConfig.ruby, "-e", script) do |stdin, stdout, stderr, wait|
      stdin.close
      pid = Timeout.timeout(30) { stdout.gets }.to_i
      planted = plant(pid, app: "victim", finals: [true])
      File.write(go, "")
      err = Timeout.timeout(30) { stderr.read }
      assert wait.value.success?, err
      assert_secret_intact
      final = err[/^heapscope: final profile written to (\S+)$/, 1]
      assert_match(/victim-#{pid}-.*-final\.heap\.pb\.gz\z/, final, err)
      assert_regular_profile(final)
      assert_includes planted, File.basename(final), "the attack covered the name used"
    end
  end

  # The report CLI's -o (flamegraph, diff --html): a symlink planted at the output name is replaced,
  # not written through; a device the user names is written in place, never replaced.
  def test_report_output_replaces_a_planted_symlink_and_writes_devices_in_place
    prof = File.join(@tmp, "heap.pb.gz")
    File.binwrite(prof, @source.profile)
    out = File.join(@dir, "heap.html")
    File.symlink(@secret, out)
    exe = File.expand_path("../exe/heapscope", __dir__)
    stdout, stderr, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), exe, "flamegraph", prof, "-o", out)
    assert status.success?, stderr
    assert_match(/wrote #{Regexp.escape(out)}/, stdout)
    assert_secret_intact
    assert File.lstat(out).file?, "the symlink was replaced by a file of its own"
    assert_includes File.read(out), "<html"
    _, stderr, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), exe, "flamegraph", prof, "-o", "/dev/null")
    assert status.success?, stderr
    assert File.chardev?("/dev/null"), "/dev/null is still the device"
  end

  def test_heapscope_write_replaces_a_symlink_at_its_path_instead_of_following_it
    skip_unless_native
    require "heapscope"
    path = File.join(@dir, "heap.pb.gz")
    File.symlink(@secret, path)
    Heapscope.start(sample_every: 10)
    begin
      assert_equal path, Heapscope.write(path)
    ensure
      Heapscope.stop
    end
    assert_secret_intact
    assert_regular_profile(path)
  end

  def test_world_writable_directory_without_sticky_bit_is_refused_with_one_warning
    File.chmod(0o777, @dir)
    writer.start # warns at once, not one interval later
    3.times { assert_nil @writer.write_now }
    assert_equal 1, @warnings.size, @warnings.inspect
    assert_includes @warnings.first, "heapscope: cannot write profiles to #{@dir}: Heapscope::UnsafeDirectoryError: " \
                                     "refusing to write into #{@dir}: every user may write there and it has no sticky bit " \
                                     "(mode 0777), so another user could replace heapscope's files; chmod o-w or chmod +t it"
    assert_empty Dir.children(@dir)
    assert_equal 3, @writer.stats[:failed]
    # With the sticky bit (as /tmp and /var/tmp have) others can no longer touch heapscope's files.
    File.chmod(0o1777, @dir)
    assert_regular_profile(@writer.write_now)
    # Group-writable is trusted like the owner (umask 002 gives every new directory g+w).
    File.chmod(0o775, @dir)
    assert_regular_profile(@writer.write_now)
  end

  def test_heapscope_write_refuses_an_unsafe_directory
    File.chmod(0o777, @dir)
    error = assert_raises(Heapscope::UnsafeDirectoryError) { Heapscope.write_atomically(File.join(@dir, "heap.pb.gz"), "x") }
    assert_match(/\Arefusing to write into #{Regexp.escape(@dir)}: every user may write there and it has no sticky bit/, error.message)
    assert_empty Dir.children(@dir)
  end

  def skip_unless_root
    skip "needs root (chown to another user)" unless Process.euid.zero?
  end

  # /var/tmp/heap from the docs: /var/tmp lets anyone create "heap" first, as their own directory
  # or as a symlink to a directory of their choice.
  def test_directory_or_symlink_owned_by_another_user_is_refused
    skip_unless_root
    File.chown(NOBODY, NOBODY, @dir)
    error = assert_raises(Heapscope::UnsafeDirectoryError) { Heapscope.write_atomically(File.join(@dir, "heap.pb.gz"), "x") }
    assert_equal "refusing to write into #{@dir}: it belongs to another user (uid #{NOBODY}), who could replace " \
                 "or read heapscope's files; use a directory of your own", error.message
    File.chown(0, 0, @dir)
    link = File.join(@tmp, "heap")
    File.symlink(@dir, link)
    File.lchown(NOBODY, NOBODY, link)
    error = assert_raises(Heapscope::UnsafeDirectoryError) { Heapscope.write_atomically(File.join(link, "heap.pb.gz"), "x") }
    assert_match(/\Arefusing to write into #{Regexp.escape(link)}: it is a symlink owned by another user \(uid #{NOBODY}\)/, error.message)
    File.lchown(0, 0, link)
    assert Heapscope.write_atomically(File.join(link, "heap.pb.gz"), "x"), "a root-owned symlink is followed"
    assert_empty Dir.children(@dir).grep(/\.tmp-/)
  end

  def test_autostart_says_why_the_final_profile_is_refused
    skip_unless_native
    skip_unless_root
    sticky = File.join(@tmp, "var-tmp")
    Dir.mkdir(sticky)
    File.chmod(0o1777, sticky)
    heap = File.join(sticky, "heap")
    Dir.mkdir(heap, 0o755) # made first by the attacker, who can read and replace everything in it
    File.chown(NOBODY, NOBODY, heap)
    env = ruby_env("HEAPSCOPE_DIR" => heap, "HEAPSCOPE_APP_NAME" => "app", "HEAPSCOPE_INTERVAL" => "3600")
    out, err, status = Timeout.timeout(60) { Open3.capture3(env, RbConfig.ruby, "-e", "puts :ran") }
    assert_equal [true, "ran\n"], [status.success?, out], err
    lines = err.lines.map(&:chomp)
    assert_equal 2, lines.size, err
    assert_match(/\Aheapscope: cannot write profiles to #{Regexp.escape(heap)}: Heapscope::UnsafeDirectoryError: refusing to write into #{Regexp.escape(heap)}: /, lines[0])
    assert_match(%r{\Aheapscope: final profile not written to #{Regexp.escape(heap)}/app-\d+-\d{8}T\d{6}\.\d{3}Z-final\.heap\.pb\.gz: refusing to write into #{Regexp.escape(heap)}: it belongs to another user \(uid #{NOBODY}\), who could replace or read heapscope's files; use a directory of your own \(Heapscope::UnsafeDirectoryError\)\z}, lines[1])
    assert_empty Dir.children(heap)
  end

  def test_a_file_at_the_temp_name_is_neither_opened_nor_removed
    # Forces a collision (the name is really 64 random bits): a symlink already at the temp name
    # makes the exclusive create fail; it is not followed, truncated or unlinked.
    require "minitest/mock"
    path = File.join(@dir, "out.bin")
    planted = File.join(@dir, ".out.bin.tmp-#{Process.pid}-#{"0" * 16}")
    File.symlink(@secret, planted)
    SecureRandom.stub(:hex, "0" * 16) do
      assert_raises(Errno::EEXIST) { Heapscope.write_atomically(path, "ours") }
    end
    assert_secret_intact
    assert File.symlink?(planted), "someone else's file is left where it was"
    refute File.exist?(path)
    assert_equal path, Heapscope.write_atomically(path, "ours")
    assert_equal "ours", File.binread(path)
  end
end
