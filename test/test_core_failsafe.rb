# frozen_string_literal: true

require_relative "core_helper"
require "open3"
require "rbconfig"

# The fail-safe: an internal error disables profiling with one warning; the application goes on.
class TestCoreFailsafe < Minitest::Test
  include CoreHelper

  SCRIPT = <<~RUBY
    require "heapscope"
    Heapscope.start(sample_every: 1, max_overhead: nil)
    keep = Array.new(100) { Object.new }
    Heapscope::Testing.corrupt_record   # what a liveness bug would leave behind
    GC.start                            # the GC hook finds it
    more = Array.new(100_000) { |i| "still running \#{i}" }   # the application is unaffected
    puts "running=\#{Heapscope.running?}"
    puts "reason=\#{Heapscope.stats[:disabled_reason]}"
    puts "errors=\#{Heapscope.stats[:internal_errors]}"
    begin
      Heapscope.profile
    rescue Heapscope::Error => e
      puts "profile=\#{e.message}"
    end
    Heapscope.start(sample_every: 1, max_overhead: nil)
    again = Array.new(10) { Object.new }
    GC.start
    puts "restarted=\#{Heapscope.running?} tracked=\#{Heapscope.stats[:tracked_objects] >= 10}"
    puts "kept=\#{keep.size + more.size + again.size}"
  RUBY

  def test_an_internal_error_disables_profiling_with_one_warning
    out, err, status = Open3.capture3(RbConfig.ruby, "-I#{File.expand_path("../lib", __dir__)}", "-e", SCRIPT)
    assert status.success?, "the process must survive: #{err}"
    warnings = err.lines.grep(/\Aheapscope: /)
    assert_equal 1, warnings.size, err
    assert_match(/heapscope: internal error \(a tracked record pointed at no object\); profiling is disabled, the application is unaffected/, warnings.first)
    assert_includes out, "running=false"
    assert_includes out, "reason=a tracked record pointed at no object"
    assert_includes out, "errors=1"
    assert_match(/profile=heapscope disabled itself after an internal error \(a tracked record pointed at no object\)/, out)
    assert_includes out, "restarted=true tracked=true"
    assert_includes out, "kept=100110"
  end

  def test_not_running_message_when_never_started
    error = assert_raises(Heapscope::Error) { Heapscope.profile(gc: true) }
    assert_match(/not running: call Heapscope.start/, error.message)
  end
end
