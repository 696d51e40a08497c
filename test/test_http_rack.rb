# frozen_string_literal: true

require_relative "test_http_helper"
require "heapscope/surfaces/rack"

# Heapscope::Rack with a fake profile source: routing, every query-parameter rule and status,
# headers, the text top list and delta profiles.
class TestHttpRack < Minitest::Test
  include SurfacesTestHelper

  def setup
    @source = FakeSource.new
    # A limiter of its own: ?gc=1 in one test must not be rate-limited by another's.
    @app = Heapscope::Rack.new(source: @source, gc_limiter: Heapscope::Rack::GcLimiter.new)
  end

  def get(path, query = "", app: @app, method: "GET", script_name: "")
    app.call("REQUEST_METHOD" => method, "SCRIPT_NAME" => script_name, "PATH_INFO" => path, "QUERY_STRING" => query)
  end

  def body_of(response)
    response[2].to_a.join
  end

  def test_heap_is_gzipped_pprof_with_download_headers
    status, headers, body = get("/debug/pprof/heap")
    assert_equal 200, status
    assert_equal "application/octet-stream", headers["content-type"]
    assert_equal 'attachment; filename="heap.pb.gz"', headers["content-disposition"]
    assert_equal Process.pid.to_s, headers["x-heapscope-pid"]
    data = body.join
    assert_equal data.bytesize.to_s, headers["content-length"]
    prof = Heapscope::Pprof.decode(data)
    assert_includes prof.sample_type_names, "inuse_space"
    assert_equal [[false, :heap]], @source.calls
  end

  def test_allocs_and_gc_flag_reach_the_source
    status, headers, = get("/debug/pprof/allocs", "gc=1")
    assert_equal 200, status
    assert_equal 'attachment; filename="allocs.pb.gz"', headers["content-disposition"]
    assert_equal [[true, :allocs]], @source.calls
    get("/debug/pprof/heap", "gc=0")
    assert_equal [false, :heap], @source.calls.last
  end

  def test_bad_parameters_are_400_with_the_reason
    cases = {
      "gc=2" => 'gc must be 0 or 1, got "2"',
      "gc=yes" => 'gc must be 0 or 1, got "yes"',
      "gc=" => 'gc must be 0 or 1, got ""',
      "debug=x" => 'debug must be 0 or 1, got "x"',
      "seconds=0" => 'seconds must be an integer from 1 to 300, got "0"',
      "seconds=301" => 'seconds must be an integer from 1 to 300, got "301"',
      "seconds=-5" => 'seconds must be an integer from 1 to 300, got "-5"',
      "seconds=abc" => 'seconds must be an integer from 1 to 300, got "abc"',
      "seconds=1.5" => 'seconds must be an integer from 1 to 300, got "1.5"',
      "seconds=" => 'seconds must be an integer from 1 to 300, got ""',
      "seconds=5&debug=1" => "seconds and debug=1 cannot be combined: a delta profile is only served as pprof",
      "gc=1&gc=0" => "parameter gc given more than once",
      "seconds=%zz" => "the query string is not valid percent-encoding",
    }
    cases.each do |query, reason|
      status, headers, body = get("/debug/pprof/heap", query)
      assert_equal 400, status, query
      assert_equal "text/plain; charset=utf-8", headers["content-type"]
      assert_equal "#{reason}\n", body.join, query
    end
    assert_empty @source.calls, "no profile may be taken for a bad request"
  end

  def test_unknown_parameters_are_ignored_like_go
    status, = get("/debug/pprof/heap", "foo=bar&debug=0")
    assert_equal 200, status
  end

  def test_not_running_is_503
    @source.running = false
    status, _, body = get("/debug/pprof/heap")
    assert_equal 503, status
    assert_match(/heapscope is not running/, body.join)
    assert_equal 503, get("/debug/pprof/allocs", "seconds=1").first
  end

  def test_unknown_profile_is_404_and_post_is_405
    status, _, body = get("/debug/pprof/goroutine")
    assert_equal 404, status
    assert_match(/unknown profile "goroutine"/, body.join)
    status, headers, = get("/debug/pprof/heap", method: "POST")
    assert_equal 405, status
    assert_equal "GET, HEAD", headers["allow"]
  end

  def test_head_has_headers_but_no_body
    status, headers, body = get("/debug/pprof/heap", method: "HEAD")
    assert_equal 200, status
    assert_equal "application/octet-stream", headers["content-type"]
    assert_empty body.to_a
  end

  def test_index_page_links_the_profiles
    [["/debug/pprof/", ""], ["/debug/pprof", ""]].each do |path, _|
      status, headers, body = get(path)
      assert_equal 200, status
      assert_equal "no-store", headers["cache-control"]
      assert_match %r{text/html}, headers["content-type"]
      assert_includes body.join, "/debug/pprof/heap?debug=1"
      assert_includes body.join, "/debug/pprof/allocs?debug=1"
    end
  end

  # Issue 33: the index linked retainers?debug=1, which answers 400 (site is required). Every link
  # it has answers 200; retainers and examples are explained in text instead.
  def test_every_link_on_the_index_answers
    links = get("/debug/pprof/").last.join.scan(/href="([^"]*)"/).flatten
    assert_equal %w[/debug/pprof/heap?debug=1 /debug/pprof/allocs?debug=1 /debug/pprof/memstats], links
    links.each do |link|
      path, query = link.split("?", 2)
      assert_equal 200, get(path, query.to_s).first, link
    end
    index = get("/debug/pprof/").last.join
    assert_includes index, "retainers?site=FILE:LINE"
    assert_includes index, "examples?site=FILE:LINE"
  end

  def test_debug_text_ranks_sites
    status, headers, body = get("/debug/pprof/heap", "debug=1")
    assert_equal 200, status
    assert_equal "text/plain; charset=utf-8", headers["content-type"]
    text = body.join
    lines = text.lines
    assert_match(/heapscope heap profile, pid #{Process.pid}/, lines[0])
    assert_match(/^Total: 600 B; showing 3 of 3 sites/, text)
    leak = lines.index { |l| l.include?("app.rb:12") }
    steady = lines.index { |l| l.include?("app.rb:20") }
    assert leak && steady && steady < leak, "the larger site (steady, 500B) comes first:\n#{text}"
    # The error column: "?" here, the fake profile says nothing about its sampling. The rows are
    # `heapscope top`'s (test_report_debug_parity.rb).
    assert_match(/^500 B\s+83\.3%\s+83\.3%\s+500 B\s+83\.3%\s+\?\s+steady app\.rb:20$/, text)
    assert_includes text, "Type: inuse_space, by line, sorted by flat; sampling rate unknown"
    assert_match(/allocs profile/, body_of(get("/debug/pprof/allocs", "debug=1")))
  end

  def test_heap_delta_is_the_difference_over_the_window
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    status, headers, body = get("/debug/pprof/heap", "seconds=1")
    elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    assert_equal 200, status
    assert_operator elapsed, :>=, 1.0
    assert_equal 'attachment; filename="heap-delta-1s.pb.gz"', headers["content-disposition"]
    prof = Heapscope::Pprof.decode(body.join)
    # The fake grows the leak site by one object of 100 bytes per call; the steady site does not change.
    assert_equal 1, prof.samples.size
    sample = prof.samples.first
    assert_equal "leak", sample.frames.first.function
    assert_equal 100, sample.value("inuse_space")
    assert_equal 1, sample.value("inuse_objects")
    assert_equal 1_000_000_000, prof.duration_nanos
  end

  def test_heap_delta_can_be_negative
    shrinking = Class.new(FakeSource) do
      def profile(gc: false, type: :heap)
        @n = (@n || 3) - 1
        prof = Heapscope::Pprof::Profile.new(sample_types: [%w[inuse_objects count], %w[inuse_space bytes]])
        prof.add_sample(frames: [["cache", "app.rb", 7]], values: [@n, @n * 64], labels: { "class" => "Hash" })
        prof.to_pprof
      end
    end.new
    _, _, body = get("/debug/pprof/heap", "seconds=1", app: Heapscope::Rack.new(source: shrinking))
    sample = Heapscope::Pprof.decode(body.join).samples.first
    assert_equal(-64, sample.value("inuse_space"))
  end

  def test_only_one_delta_at_a_time
    first = Thread.new { get("/debug/pprof/allocs", "seconds=2") }
    wait_for("the first delta to start") { @source.calls.size >= 1 }
    status, headers, body = get("/debug/pprof/heap", "seconds=1")
    assert_equal 429, status
    assert_equal "1", headers["retry-after"]
    assert_match(/another delta profile is being computed/, body.join)
    assert_equal 200, first.value.first
    # The lock is released afterwards.
    assert_equal 200, get("/debug/pprof/heap", "seconds=1").first
  end

  def test_middleware_passes_other_paths_and_mounts_anywhere
    inner = ->(_env) { [200, { "content-type" => "text/plain" }, ["app"]] }
    middleware = Heapscope::Rack.new(inner, source: @source)
    assert_equal "app", body_of(get("/users", app: middleware))
    assert_equal 200, get("/debug/pprof/heap", app: middleware).first
    assert_equal 1, @source.calls.size
    # As an app mounted with map("/admin/prof"): only PATH_INFO is its own.
    status, = get("/heap", script_name: "/admin/prof")
    assert_equal 200, status
    # At the root, only /debug/pprof is heapscope's.
    assert_equal 404, get("/heap").first
    # As an app under map("/debug/pprof").
    status, = get("/allocs", script_name: "/debug/pprof")
    assert_equal 200, status
  end

  def test_source_errors_are_500_not_raised
    broken = FakeSource.new
    def broken.profile(**)
      raise IOError, "disk on fire"
    end
    status, _, body = get("/debug/pprof/heap", app: Heapscope::Rack.new(source: broken))
    assert_equal 500, status
    assert_match(/IOError: disk on fire/, body.join)
  end

  # The responses obey the Rack spec, checked by the rack gem's own Rack::Lint (test-only gem).
  def test_responses_pass_rack_lint
    begin
      require "rack"
      require "rack/lint"
      require "rack/mock"
    rescue LoadError
      skip "the rack gem is not installed (bundle install)"
    end
    inner = ->(_env) { [200, { "content-type" => "text/plain" }, ["app"]] }
    app = ::Rack::Lint.new(Heapscope::Rack.new(inner, source: @source))
    request = ::Rack::MockRequest.new(app)
    {
      "/debug/pprof/heap" => 200, "/debug/pprof/allocs?debug=1" => 200, "/debug/pprof/" => 200,
      "/debug/pprof/heap?gc=7" => 400, "/debug/pprof/nope" => 404, "/other" => 200, "/debug/pprof/heap?gc=1" => 200,
    }.each do |path, status|
      assert_equal status, request.get(path, lint: true).status, path
    end
    assert_equal 200, request.head("/debug/pprof/heap", lint: true).status
    assert_equal 405, request.post("/debug/pprof/heap", lint: true).status
  end
end
