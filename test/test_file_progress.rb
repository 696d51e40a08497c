# frozen_string_literal: true

require "minitest/autorun"
require "open3"
require "rbconfig"
require "tmpdir"

# bin/test's progress lines (test/support/file_progress.rb): each skipped test says why at the end of
# the run, one line each, without --verbose (issue 33: "3 skips" said nothing).
class TestFileProgress < Minitest::Test
  PROGRESS = File.expand_path("support/file_progress", __dir__)

  def test_skips_say_why_at_the_end
    Dir.mktmpdir("heapscope-progress") do |dir|
      file = File.join(dir, "test_demo.rb")
      File.write(file, <<~RUBY)
        require "minitest/autorun"
        class TestDemo < Minitest::Test
          def test_needs_go = skip("go is not installed (go tool pprof)")
          def test_needs_rails = skip("railties is not installed\\nsecond line")
          def test_runs = assert(true)
        end
      RUBY
      out, err, status = Open3.capture3(RbConfig.ruby, "-r#{PROGRESS}", file, "--seed", "1")
      assert status.success?, err
      assert_match(/^\S*test_demo\.rb TestDemo [S.]{3}  ?\d+\.\d s$/, out)
      lines = out.lines.drop_while { |l| !l.start_with?("Skipped (2):") }
      assert_equal "Skipped (2):\n", lines[0]
      assert_equal ["  TestDemo#test_needs_go: go is not installed (go tool pprof)\n",
                    "  TestDemo#test_needs_rails: railties is not installed\n"], lines[1, 2].sort
    end
  end
end
