# frozen_string_literal: true

require_relative "test_http_helper"

# Fork-awareness of the surfaces, with the real profiler: a plain fork and puma's cluster mode.
# Each child must restart the listener (on the next port) and the writer, name its files and
# label its profiles with its own pid, and still see the live objects it inherited.
class TestForkSurfaces < Minitest::Test
  include SurfacesTestHelper

  CONFIG_RU = File.join(ROOT, "examples/surfaces/config.ru")
  PUMA_CONFIG = File.join(ROOT, "examples/surfaces/puma_cluster.rb")

  FORK_SCRIPT = <<~'RUBY'
    dir = ARGV[0]
    $parent_objs = Array.new(4000) { |i| "parent-#{i}-" * 6 } # PARENT
    GC.start
    pid = fork do
      $child_objs = Array.new(4000) { |i| "child-#{i}-" * 6 } # CHILD
      GC.start
      puts "child #{Process.pid}"
      $stdout.flush
      sleep 0.05 until File.exist?(File.join(dir, "go"))
    end
    puts "parent #{Process.pid}"
    $stdout.flush
    Process.wait(pid)
  RUBY

  def setup
    skip_unless_native
    @tmp = Dir.mktmpdir("heapscope-fork")
  end

  def teardown
    reap_children
    FileUtils.rm_rf(@tmp) if @tmp
  end

  # {[file basename, line] => inuse_objects} of a gzipped profile.
  def sites(bytes)
    Heapscope::Pprof.decode(bytes).samples.each_with_object(Hash.new(0)) do |sample, acc|
      leaf = sample.frames.find { |f| f.line.positive? }
      acc[[File.basename(leaf.file), leaf.line]] += sample.value("inuse_objects") if leaf
    end
  end

  def line_of(text, marker)
    text.lines.index { |l| l.include?(marker) } + 1
  end

  def test_plain_fork
    script = File.join(@tmp, "forker.rb")
    File.write(script, FORK_SCRIPT)
    dir = File.join(@tmp, "profiles")
    port = free_port_pair
    env = ruby_env("HEAPSCOPE_HTTP" => "127.0.0.1:#{port}", "HEAPSCOPE_DIR" => dir, "HEAPSCOPE_INTERVAL" => "0.3",
                   "HEAPSCOPE_SAMPLE_EVERY" => "50", "HEAPSCOPE_SAMPLING" => "always", "HEAPSCOPE_APP_NAME" => "forker")
    main, out, err = spawn_child(env, RbConfig.ruby, script, @tmp, dir: @tmp)
    pids = wait_for("both processes") do
      found = File.read(out).scan(/^(parent|child) (\d+)$/).to_h
      found.size == 2 && found.transform_values(&:to_i)
    end
    assert_equal main, pids["parent"]
    child = pids["child"]
    wait_for("the child's listener") { File.read(err).include?("(pid #{child})") }
    assert_includes File.read(err), "heapscope: serving http://127.0.0.1:#{port}/debug/pprof/ (pid #{main})"
    assert_includes File.read(err), "heapscope: serving http://127.0.0.1:#{port + 1}/debug/pprof/ (pid #{child})"

    parent_line = [File.basename(script), line_of(FORK_SCRIPT, "# PARENT")]
    child_line = [File.basename(script), line_of(FORK_SCRIPT, "# CHILD")]
    status, headers, body = http_get(port + 1, "/debug/pprof/heap?gc=1")
    assert_equal 200, status
    assert_equal child.to_s, headers["x-heapscope-pid"]
    assert_includes Heapscope::Pprof.decode(body).comments.join("\n"), "pid #{child}"
    child_sites = sites(body)
    assert_operator child_sites[child_line], :>, 1000, "the child's own objects: #{child_sites}"
    assert_operator child_sites[parent_line], :>, 1000, "objects inherited from the parent are still tracked"

    _, headers, body = http_get(port, "/debug/pprof/heap?gc=1")
    assert_equal main.to_s, headers["x-heapscope-pid"]
    parent_sites = sites(body)
    assert_operator parent_sites[parent_line], :>, 1000
    assert_equal 0, parent_sites[child_line], "the parent never had the child's objects"

    wait_for("a periodic file from the child") { Dir.glob("forker-#{child}-*.heap.pb.gz", base: dir).any? }
    File.write(File.join(@tmp, "go"), "")
    Timeout.timeout(30) { Process.wait(main) }
    @children.delete(main)
    finals = Dir.glob("forker-*-final.heap.pb.gz", base: dir)
    assert_equal [main, child].sort, finals.map { |n| n[/\Aforker-(\d+)-/, 1].to_i }.sort, finals.inspect
    child_final = sites(File.binread(File.join(dir, finals.find { |n| n.start_with?("forker-#{child}-") })))
    assert_operator child_final[child_line], :>, 1000
    assert_includes File.read(err), "heapscope: final profile written to #{dir}/forker-#{child}-"
  end

  def test_puma_cluster_workers_have_their_own_profiles
    begin
      puma = Gem.bin_path("puma", "puma")
    rescue Gem::Exception
      skip "the puma gem is not installed (bundle install)"
    end
    base = free_port
    app_port = free_port
    env = ruby_env("HEAPSCOPE_HTTP" => "127.0.0.1:#{base}", "HEAPSCOPE_SAMPLE_EVERY" => "50", "HEAPSCOPE_SAMPLING" => "always")
    master, out, err = spawn_child(env, RbConfig.ruby, puma, "-C", PUMA_CONFIG, "-b", "tcp://127.0.0.1:#{app_port}",
                                   CONFIG_RU, dir: @tmp)
    workers = wait_for("two workers serving profiles", timeout: 40) do
      found = File.read(err).scan(%r{serving http://127\.0\.0\.1:(\d+)/debug/pprof/ \(pid (\d+)\)})
                  .map { |p, pid| [pid.to_i, p.to_i] }.to_h
      found.delete(master)
      found.size == 2 && found
    end
    text = File.read(CONFIG_RU)
    ru = File.basename(CONFIG_RU)
    preloaded = [ru, line_of(text, "# PRELOADED")]
    even = [ru, line_of(text, "# EVEN")]
    odd = [ru, line_of(text, "# ODD")]
    seen = workers.map do |pid, port|
      assert_operator port, :>, base, "workers listen above the master's port"
      status, headers, body = http_get(port, "/debug/pprof/heap?gc=1")
      assert_equal 200, status
      assert_equal pid.to_s, headers["x-heapscope-pid"]
      assert_includes Heapscope::Pprof.decode(body).comments.join("\n"), "pid #{pid}"
      s = sites(body)
      assert_operator s[preloaded], :>, 1000, "worker #{pid} still tracks what the master preloaded"
      [s[even] > 1000 ? :even : nil, s[odd] > 1000 ? :odd : nil].compact
    end
    assert_equal [[:even], [:odd]], seen.sort, "each worker shows its own objects only"
    # Through the app's own port, the middleware answers from whichever worker took the request.
    status, headers, = http_get(app_port, "/debug/pprof/heap")
    assert_equal 200, status
    assert_includes workers.keys, headers["x-heapscope-pid"].to_i
    refute_match(/\[BUG\]|Error/, File.read(err))
    assert_match(/Worker 1 \(PID: \d+\) booted/, File.read(out))
  end
end
