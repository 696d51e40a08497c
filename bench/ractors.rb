# frozen_string_literal: true

# bench/ractors.rb: every Ractor case of test/support/ractor_cases.rb (nested Ractor.new, a supervisor
# under autostart with the listener and periodic files, a Ractor made through a captured
# Ractor.method(:new) in each sampling mode and while windows open, a restart afterwards), each in RUNS
# fresh processes (default 10). Prints passes per case and the first failure's output; exit status 1
# if any run failed. test/test_hardening_ractors.rb runs the same cases fewer times.
#
#   bundle exec ruby -Ilib bench/ractors.rb [RUNS=10]
#   bin/rubies run 3.4 bash -c 'bin/setup >/dev/null && bundle exec ruby -Ilib bench/ractors.rb'
require_relative "../test/support/ractor_cases"

runs = Integer(ARGV.fetch(0, 10))
failed = false
puts "ruby #{RUBY_VERSION}, #{runs} fresh processes per case"
RactorCases.names.each do |name|
  first_failure = nil
  passes = runs.times.count do
    errors, out, err = RactorCases.run(name)
    first_failure ||= "#{errors.join("; ")}\n--- stdout\n#{out}--- stderr\n#{err[0, 2000]}" unless errors.empty?
    errors.empty?
  end
  failed ||= passes < runs
  puts format("  %-26s %2d/%d", name, passes, runs)
  puts first_failure.gsub(/^/, "    ") if first_failure
end
exit(failed ? 1 : 0)
