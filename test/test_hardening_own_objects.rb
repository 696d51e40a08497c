# frozen_string_literal: true

# heapscope's own objects never appear in a user's profile (issue 17, item 5): a listener socket once
# weighed 31% of a heap. Its threads exclude themselves from sampling (Heapscope.internal_thread), and
# its work on a user's thread (a /debug/pprof request through the Rack middleware, building and writing
# profiles, starting surfaces) runs in Heapscope.internal, which restores the thread afterwards.
# Sampling 1 in 1 (exact: the budget is off), so any object of heapscope's that were sampled would be
# there. Relies on the core's thread exclusion (Native._exclude_thread, _include_thread).

require_relative "core_helper"
require_relative "test_http_helper"
require "open3"

class TestHardeningOwnObjects < Minitest::Test
  include CoreHelper
  include SurfacesTestHelper

  Inner = Struct.new(:n)
  Outer = Struct.new(:n)
  After = Struct.new(:n)
  InThread = Struct.new(:n)

  def setup
    skip "the C extension is not loaded" unless Heapscope::InternalThreads.supported?
    @tmp = Dir.mktmpdir("heapscope-own")
  end

  def teardown
    FileUtils.rm_rf(@tmp) if @tmp
    super
  end

  def count(prof, klass)
    prof.samples.sum { |s| s.labels["class"] == klass.name ? s.value("alloc_objects") : 0 }
  end

  def test_internal_blocks_nest_and_restore_the_thread
    Heapscope.start(sample_every: 1)
    keep = []
    Heapscope.internal do
      Heapscope.internal { keep << Array.new(1000) { Inner.new(1) } }
      keep << Array.new(1000) { Outer.new(1) } # still inside the outer block
    end
    assert_raises(RuntimeError) { Heapscope.internal { raise "boom" } }
    keep << Array.new(1000) { After.new(1) } # included again, even after the raise
    prof = heap_profile
    assert_equal [0, 0, 1000], [count(prof, Inner), count(prof, Outer), count(prof, After)]
    refute_empty keep
  end

  # More threads than the core's table holds (32), one after another: each gives its slot back when
  # it ends, so every one of them is excluded.
  def test_heapscope_threads_are_excluded_and_give_their_slot_back
    Heapscope.start(sample_every: 1)
    keep = Queue.new
    40.times { Thread.new { Heapscope.internal_thread { keep << Array.new(100) { InThread.new(1) } } }.join }
    assert_equal 0, count(heap_profile, InThread)
    assert_equal 40, keep.size
    # A thread of the application's is sampled as usual.
    Thread.new { keep << Array.new(100) { InThread.new(1) } }.join
    assert_equal 100, count(heap_profile, InThread)
  end

  # The real surfaces under autostart: listener (requests to it), periodic writer (files every 0.1 s),
  # the Rack middleware serving ?debug=1 on the application's thread, and final writes. Not one sample
  # may have a frame in lib/heapscope: the application's code never calls into it here except through
  # Heapscope.profile, and the app behind the middleware allocates nothing.
  def test_the_surfaces_own_objects_never_reach_the_profile
    skip_unless_native
    port = free_port
    script = <<~RUBY
      require "socket"
      APP = ->(_env) { RESPONSE }
      RESPONSE = [200, {}.freeze, [].freeze].freeze
      ENV_HEAP = { "PATH_INFO" => "/debug/pprof/heap", "QUERY_STRING" => "debug=1", "REQUEST_METHOD" => "GET", "SCRIPT_NAME" => "" }.freeze
      ENV_APP = { "PATH_INFO" => "/app", "QUERY_STRING" => "", "REQUEST_METHOD" => "GET", "SCRIPT_NAME" => "" }.freeze
      middleware = Heapscope::Rack.new(APP)
      keep = []
      20.times do
        sock = TCPSocket.new("127.0.0.1", #{port})
        sock.write("GET /debug/pprof/heap?debug=1 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        keep << sock.read
        sock.close
        keep << middleware.call(ENV_HEAP)
        middleware.call(ENV_APP)
        sleep 0.02
      end
      Heapscope.write("#{@tmp}/own.pb.gz", gc: true)
      puts keep.size
    RUBY
    env = ruby_env("HEAPSCOPE_SAMPLE_EVERY" => "1", "HEAPSCOPE_HTTP" => port.to_s, "HEAPSCOPE_DIR" => @tmp,
                   "HEAPSCOPE_INTERVAL" => "0.1", "HEAPSCOPE_APP_NAME" => "own")
    out, err, status = Timeout.timeout(120) { Open3.capture3(env, RbConfig.ruby, "-e", script) }
    assert status.success?, err
    assert_equal "40\n", out
    assert_operator Dir.glob(File.join(@tmp, "own-*.heap.pb.gz")).size, :>=, 3, "the writer wrote files"
    prof = Heapscope::Pprof.read(File.join(@tmp, "own.pb.gz"))
    assert_operator prof.samples.size, :>, 0, "the application's own objects (the answers it kept) are there"
    # heapscope's: the innermost frame that is neither Ruby's own library nor internal is in lib/. (An
    # allocation of the app behind the middleware has Rack#call further out: that one is the app's.)
    stdlib = RbConfig::CONFIG["rubylibdir"]
    ours = prof.samples.select do |s|
      own = s.frames.find { |f| !f.file.start_with?(stdlib) && !f.file.start_with?("<internal") && !f.file.empty? }
      own&.file&.start_with?(LIB)
    end
    assert_empty ours.map { |s| [s.labels["class"], s.frames.first(3).map(&:to_s).join(" <- ")] }.uniq.first(10)
    refute(prof.samples.any? { |s| %w[TCPServer Thread Heapscope::HttpServer].include?(s.labels["class"]) })
  end
end
