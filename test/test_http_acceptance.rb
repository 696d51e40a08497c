# frozen_string_literal: true

require_relative "test_http_helper"

# Acceptance: real processes under RUBYOPT=-rheapscope/auto, read by `go tool pprof` over HTTP.
#   - the standalone listener (HEAPSCOPE_HTTP) of examples/surfaces/leaky_service.rb (and its ?gc=1
#     rate limit),
#   - Heapscope::Rack as middleware in examples/surfaces/config.ru under rackup + puma.
class TestHttpAcceptance < Minitest::Test
  include SurfacesTestHelper

  SERVICE = File.join(ROOT, "examples/surfaces/leaky_service.rb")
  CONFIG_RU = File.join(ROOT, "examples/surfaces/config.ru")

  def setup
    skip_unless_native
    @tmp = Dir.mktmpdir("heapscope-accept")
  end

  def teardown
    reap_children
    FileUtils.rm_rf(@tmp) if @tmp
  end

  def line_of(path, marker)
    File.readlines(path).index { |l| l.include?(marker) } + 1
  end

  def start_service(extra_env = {})
    port = free_port
    # Every allocation seen (always mode): these tests are about the surfaces, and a second of a young
    # process has too few GCs for windows to rank sites reliably (test_windowed_accuracy.rb judges those).
    env = ruby_env("HEAPSCOPE_HTTP" => "127.0.0.1:#{port}", "HEAPSCOPE_SAMPLE_EVERY" => "100",
                   "HEAPSCOPE_SAMPLING" => "always").merge(extra_env)
    _pid, out, err = spawn_child(env, RbConfig.ruby, SERVICE, "60", dir: @tmp)
    wait_for("the service to be ready") { File.read(out).include?("ready") }
    assert_match(%r{heapscope: serving http://127\.0\.0\.1:#{port}/debug/pprof/}, File.read(err))
    port
  end

  def test_go_tool_pprof_finds_the_leak_over_the_standalone_listener
    skip_unless_go
    port = start_service
    leak = "leaky_service.rb:#{line_of(SERVICE, "# LEAK")}"

    # Ranked by objects: by bytes, the one Array that holds the leaked strings (Cache#initialize) leads
    # whenever the sampler picked it (1 run in sample_every), since it stands for sample_every arrays as
    # big as itself. By bytes the leak line is only looked up.
    heap = pprof_top("http://127.0.0.1:#{port}/debug/pprof/heap", "inuse_objects")
    assert_includes top_row(heap), leak, heap
    heap_bytes = pprof_top("http://127.0.0.1:#{port}/debug/pprof/heap", "inuse_space")
    assert_match(/Type: inuse_space/, heap_bytes)
    assert_includes heap_bytes, leak, heap_bytes

    allocs = pprof_top("http://127.0.0.1:#{port}/debug/pprof/allocs", "alloc_space")
    assert_match(/Type: alloc_space/, allocs)
    assert_includes allocs, leak
    assert_includes allocs, "leaky_service.rb:#{line_of(SERVICE, "# garbage")}", "allocs shows the garbage site too"
    refute_includes heap, "leaky_service.rb:#{line_of(SERVICE, "# garbage")}", "heap does not list freed garbage"

    # ?gc=1 and a real delta: the service keeps leaking, so the leak line grows over the window.
    delta = pprof_top("http://127.0.0.1:#{port}/debug/pprof/heap?seconds=1&gc=1", "inuse_objects")
    assert_includes top_row(delta), leak, delta
  end

  def test_debug_text_and_statuses_from_a_real_process
    port = start_service
    status, headers, body = http_get(port, "/debug/pprof/heap?debug=1")
    assert_equal 200, status
    pid = headers["x-heapscope-pid"]
    assert_match(/\Aheapscope heap profile, pid #{pid}, /, body)
    rows = body.lines.drop_while { |l| !l.include?("flat%") }
    # The leak leads by bytes, or comes second behind the Array that holds it when the sampler picked
    # that Array (see test_go_tool_pprof_finds_the_leak_over_the_standalone_listener). The rows are
    # `heapscope top`'s: the line, named after its Ruby method, not the C function (String#*) it called.
    leak_row = /\s.*leaky_service\.rb:#{line_of(SERVICE, "# LEAK")}$/
    assert(rows[1..2].any? { |row| row.match?(leak_row) }, rows.first(4).join)
    assert_equal 400, http_get(port, "/debug/pprof/heap?seconds=1&debug=1").first
    assert_equal 400, http_get(port, "/debug/pprof/allocs?seconds=600").first
    # Two deltas at once: the second is refused.
    slow = Thread.new { http_get(port, "/debug/pprof/heap?seconds=2", timeout: 20) }
    sleep 0.5
    assert_equal 429, http_get(port, "/debug/pprof/allocs?seconds=1").first
    assert_equal 200, slow.value.first
  end

  # ?gc=1 forces at most one full GC per 10 s in the process; the next ones are served without one.
  def test_gc_is_rate_limited_in_a_real_process
    port = start_service
    notes = Array.new(3) do
      status, headers, body = http_get(port, "/debug/pprof/heap?gc=1")
      assert_equal 200, status
      refute_empty body
      headers["x-heapscope-gc"]
    end
    assert_equal "forced", notes[0]
    assert_match(/\Askipped; retry-after=(9|10)\z/, notes[1])
    status, headers, body = http_get(port, "/debug/pprof/heap?gc=1&debug=1")
    assert_equal 200, status
    assert_match(/\Askipped; /, headers["x-heapscope-gc"])
    assert_match(/^# gc=1 skipped: at most one forced GC per 10s in this process/, body)
  end

  def test_rack_middleware_under_rackup_and_puma
    skip_unless_go
    port, err = start_rackup(ruby_env("HEAPSCOPE_SAMPLE_EVERY" => "50", "HEAPSCOPE_SAMPLING" => "always"), CONFIG_RU)
    20.times { assert_equal 200, http_get(port, "/leak").first }
    leak = "config.ru:#{line_of(CONFIG_RU, "# REQUEST LEAK")}"
    # By bytes puma's threads (each Thread's memsize includes its VM stack) outweigh 10,000 small
    # strings, so rank by objects for the top row and only look the line up by bytes.
    heap = pprof_top("http://127.0.0.1:#{port}/debug/pprof/heap?gc=1", "inuse_objects")
    assert_includes top_row(heap), leak, heap
    assert_includes pprof_top("http://127.0.0.1:#{port}/debug/pprof/heap", "inuse_space"), leak
    assert_includes pprof_top("http://127.0.0.1:#{port}/debug/pprof/allocs", "alloc_space"), leak
    status, _, body = http_get(port, "/debug/pprof/heap?gc=2")
    assert_equal 400, status
    assert_equal "gc must be 0 or 1, got \"2\"\n", body
    refute_match(/Error|error/, File.read(err).lines.grep_v(/heapscope: serving/).join)
  end
end
