# frozen_string_literal: true

require "minitest/autorun"
require "open3"
require_relative "support/ractor_cases"

# Ractors (issue items 3 and 4), each case in fresh Ruby processes (test/support/ractor_cases.rb says
# what each checks): nested Ractor.new once heapscope is required (a Ractor::UnsafeError before), a
# supervisor Ractor under autostart with the periodic files and the listener, a Ractor made through a
# Method captured before heapscope loaded (a segfault inside Ruby 3.1 before, heapscope left on with
# Ractors running on 3.3+), in each sampling mode and while windows open and close, and what a restart
# does afterwards. bench/ractors.rb runs every case 10 times. HEAPSCOPE_RACTOR_RUNS sets the runs here.
class TestHardeningRactors < Minitest::Test
  RUNS = Integer(ENV.fetch("HEAPSCOPE_RACTOR_RUNS", "2"))

  RactorCases.names.each do |name|
    define_method("test_#{name}") do
      RUNS.times do |run|
        errors, out, err = RactorCases.run(name)
        assert_empty errors, "#{name}, run #{run + 1} of #{RUNS}:\n--- stdout\n#{out}--- stderr\n#{err[0, 3000]}"
      end
    end
  end

  # The Ruby 3.1 pause (ext/heapscope/ractors.h) must not switch heapscope off for a full GC by the C
  # API that starts no Ractor: out of descriptors, Ruby's IO calls rb_gc() and retries. Profiling goes on.
  def test_a_c_api_gc_without_a_ractor_leaves_profiling_on
    skip "the pause exists on Ruby 3.1 and 3.2 only" unless Gem::Version.new(RUBY_VERSION) < Gem::Version.new("3.3")
    out, err, status = Open3.capture3({ "RUBYOPT" => nil }, RbConfig.ruby, "-I#{RactorCases::ROOT}/lib", "-e", <<~'RUBY')
      require "heapscope"
      Heapscope.start(sample_every: 10)
      Process.setrlimit(:NOFILE, 64)
      files = []
      begin
        loop { files << File.open(RbConfig.ruby) }
      rescue Errno::EMFILE
      end
      files.each(&:close)
      keep = 10_000.times.map { |i| "after #{i}" }
      s = Heapscope.stats
      puts "pauses=#{s[:ractor_pauses]} running=#{Heapscope.running?} samples=#{s[:samples_taken]} off=#{s[:off_reason].inspect}"
    RUBY
    assert status.success?, err
    assert_match(/pauses=[1-9]\d* running=true samples=\d+ off=nil/, out, err)
    refute_includes err, RactorCases::WARNING
  end
end
