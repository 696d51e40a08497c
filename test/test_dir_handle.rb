# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/atomic_write"
require "heapscope/surfaces/output_dir"
require "heapscope/surfaces/periodic_writer"
require "fileutils"

# Heapscope::Native::DirHandle (ext/heapscope/dirhandle.c), the descriptor every operation on
# heapscope's output directory goes through, and OutputDir, which keeps one open.
class TestDirHandle < Minitest::Test
  include SurfacesTestHelper

  def setup
    skip_unless_native
    @dir = Dir.mktmpdir("heapscope-dirhandle")
    @handle = Heapscope::AtomicWrite.open_directory(@dir)
  end

  def teardown
    @handle&.close
    FileUtils.rm_rf(@dir) if @dir
  end

  def test_names_must_be_one_component
    ["", ".", "..", "a/b", "/etc"].each do |name|
      error = assert_raises(ArgumentError) { @handle.stat(name) }
      assert_equal "heapscope: #{name.inspect} is not a name inside a directory", error.message
    end
    assert_raises(ArgumentError) { @handle.unlink("a\0b") }
    assert_raises(TypeError) { @handle.stat(:sym) }
    assert_raises(ArgumentError) { @handle.mkdir("x", -1) }
    assert_raises(TypeError) { @handle.write_replace(".t", "x", nil, 0o644) }
    assert_raises(ArgumentError) { @handle.stat("a", "b") }
    assert_empty Dir.children(@dir)
  end

  # read: a regular file's bytes through the descriptor; never through a symlink, never a FIFO (which
  # would block), never past the limit (the ui's summary cache reads with it).
  def test_read_takes_only_regular_files_within_the_limit
    File.binwrite(File.join(@dir, "a.json"), "{\"x\":1}")
    assert_equal "{\"x\":1}", @handle.read("a.json", 100)
    assert_equal Encoding::ASCII_8BIT, @handle.read("a.json", 100).encoding
    assert_raises(Errno::EFBIG) { @handle.read("a.json", 3) }
    secret = File.join(@dir, "secret")
    File.write(secret, "not yours")
    File.symlink(secret, File.join(@dir, "link.json"))
    assert_raises(Errno::ELOOP) { @handle.read("link.json", 100) }
    File.mkfifo(File.join(@dir, "fifo.json"))
    assert_raises(Errno::EINVAL) { Timeout.timeout(5) { @handle.read("fifo.json", 100) } }
    assert_raises(Errno::ENOENT) { @handle.read("missing.json", 100) }
    assert_raises(ArgumentError) { @handle.read("../x", 100) }
    assert_raises(ArgumentError) { @handle.read("a.json", -1) }
  end

  def test_write_replace_returns_the_file_written_and_replaces_a_symlink
    outside = File.join(@dir, "outside")
    File.write(outside, "keep")
    File.symlink(outside, File.join(@dir, "out"))
    stat = @handle.write_replace(".out.tmp", "out", "new bytes", 0o600)
    path = File.join(@dir, "out")
    assert File.lstat(path).file?, "the symlink was replaced"
    assert_equal [stat.dev, stat.ino, 9], [File.stat(path).dev, File.stat(path).ino, stat.size]
    assert_equal 0o600, File.stat(path).mode & 0o777
    assert_equal "keep", File.read(outside)
    assert_equal ["out", "outside"], @handle.entries.sort
  end

  def test_a_failed_rename_removes_only_its_own_temp_file_and_names_the_file
    Dir.mkdir(File.join(@dir, "sub"))
    File.write(File.join(@dir, "sub", "x"), "")
    error = assert_raises(Errno::EISDIR) { @handle.write_replace(".t", "sub", "x", 0o644) }
    assert_equal "Is a directory @ renameat - #{@dir}/sub", error.message
    assert_equal ["sub"], Dir.children(@dir)
    # A name already taken is never opened: the entry stays as it was.
    File.write(File.join(@dir, ".t"), "theirs")
    error = assert_raises(Errno::EEXIST) { @handle.write_replace(".t", "out", "x", 0o644) }
    assert_equal "File exists @ openat - #{@dir}/.t", error.message
    assert_equal "theirs", File.read(File.join(@dir, ".t"))
  end

  def test_open_dir_never_follows_a_symlink
    Dir.mkdir(File.join(@dir, "real"))
    File.symlink(File.join(@dir, "real"), File.join(@dir, "link"))
    # Linux says ENOTDIR for a symlink opened with O_DIRECTORY|O_NOFOLLOW, other systems ELOOP.
    assert_raises(Errno::ENOTDIR, Errno::ELOOP) { @handle.open_dir("link") }
    File.write(File.join(@dir, "file"), "")
    assert_raises(Errno::ENOTDIR) { @handle.open_dir("file") }
    sub = @handle.open_dir("real")
    assert_equal "#{@dir}/real", sub.path
    sub.close
  end

  def test_a_closed_handle_raises_and_close_is_idempotent
    @handle.close
    @handle.close
    assert @handle.closed?
    error = assert_raises(IOError) { @handle.entries }
    assert_equal "heapscope: directory handle #{@dir} is closed", error.message
  end

  def open_descriptors
    Dir.children("/proc/self/fd").size
  end

  # Each handle's descriptor is closed when the handle is garbage collected.
  def test_handles_left_to_the_gc_do_not_leak_descriptors
    skip "no /proc/self/fd" unless File.directory?("/proc/self/fd")
    GC.start
    before = open_descriptors
    2000.times { Heapscope::AtomicWrite.open_directory(@dir) }
    GC.start
    assert_operator open_descriptors, :<, before + 100
  end

  # A forked child opens its own descriptor (OutputDir.after_fork) and its closing it leaves the
  # parent's alone; both write into the directory.
  def test_forked_child_and_parent_both_keep_writing
    out = Heapscope::OutputDir.new(@dir).open_if_present
    out.write("parent-1", "p")
    pid = fork do
      out.after_fork
      out.write("child", "c")
      out.close
      exit!(0)
    end
    Process.wait(pid)
    assert $?.success?
    out.write("parent-2", "p")
    assert_equal %w[child parent-1 parent-2], Dir.children(@dir).sort
    out.close
  end

  # A directory removed after it was opened is opened again from its path (and created again),
  # instead of writes vanishing into a directory nobody can reach.
  def test_a_removed_directory_is_opened_again_from_its_path
    out = Heapscope::OutputDir.new(File.join(@dir, "out")).open_if_present
    out.write("a", "1")
    FileUtils.rm_rf(File.join(@dir, "out"))
    out.write("b", "2")
    assert_equal ["b"], Dir.children(File.join(@dir, "out"))
    out.close
  end

  # A directory made writable by every user after it was opened is refused (by its descriptor)
  # until it is fixed.
  def test_a_directory_made_unsafe_after_opening_is_refused_until_fixed
    out = Heapscope::OutputDir.new(File.join(@dir, "out")).open_if_present
    out.write("a", "1")
    File.chmod(0o777, File.join(@dir, "out"))
    assert_raises(Heapscope::UnsafeDirectoryError) { out.write("b", "2") }
    File.chmod(0o755, File.join(@dir, "out"))
    out.write("c", "3")
    assert_equal %w[a c], Dir.children(File.join(@dir, "out")).sort
    out.close
  end
end
