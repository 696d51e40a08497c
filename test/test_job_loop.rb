# frozen_string_literal: true

require_relative "test_http_helper"
require "open3"

# examples/job_loop.rb, the job-runner recipe of docs/surfaces.md: its final profile, read by
# `go tool pprof`, ranks the leaking job's line first.
class TestJobLoop < Minitest::Test
  include SurfacesTestHelper

  EXAMPLE = File.join(ROOT, "examples/job_loop.rb")

  def setup
    skip_unless_native
    @tmp = Dir.mktmpdir("heapscope-jobs")
  end

  def teardown
    FileUtils.rm_rf(@tmp) if @tmp
  end

  def test_the_leaking_job_is_the_top_live_site
    skip_unless_go
    # Every sampled allocation seen: a run of a fraction of a second has too few windows to rank
    # sites reliably (test_windowed_accuracy.rb judges the windows).
    out, err, status = Open3.capture3({ "RUBYOPT" => nil }, RbConfig.ruby, "-I#{LIB}", EXAMPLE, @tmp, "20000", "always")
    assert status.success?, err
    assert_equal "", err
    final = Dir.glob(File.join(@tmp, "jobs-*-final.heap.pb.gz"))
    assert_equal 1, final.size, Dir.children(@tmp).inspect
    assert_includes out, "ran 20000 jobs, 10000 audit entries kept\nfinal profile: #{final.first}\n"
    leak = "job_loop.rb:#{File.readlines(EXAMPLE).index { |l| l.include?("# JOB LEAK") } + 1}"
    top = pprof_top(final.first, "inuse_objects")
    assert_includes top_row(top), leak, top
    # Each job carries its class as a label: the leak is AuditLog's, not ResizeImage's.
    assert_includes top_row(pprof_top(final.first, "inuse_objects", tagfocus: "job=AuditLog")), leak
    refute_includes pprof_top(final.first, "inuse_objects", tagfocus: "job=ResizeImage"), leak
  end
end
