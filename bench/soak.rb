# frozen_string_literal: true

# bench/soak.rb: heapscope's own memory under steady churn must stay flat. A request-like loop allocates
# short-lived objects at many sites, keeps a bounded working set (replacing old entries), and takes a
# profile every 30 s, as a scraper would. Every 10 s it records Heapscope.stats[:recorder_bytes] and the
# tracked-object count. At the end it compares the last third of the run with the middle third: the
# recorder's bytes must not grow by more than 10% (the first third is warm-up: tables grow to their
# working size). Exit status 1 if they do.
#
#   bundle exec ruby -Ilib bench/soak.rb [minutes=10]
require "heapscope"

minutes = Float(ARGV[0] || 10)
Heapscope.start # the defaults, as in production
working_set = Array.new(20_000)
sites = Array.new(200) { |i| ->(n) { { id: n, name: "item-#{n}-#{i}", tags: Array.new(i % 7) { |t| "t#{t}" } } } }
deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + minutes * 60
next_report = next_profile = 0
readings = []
n = 0
while (now = Process.clock_gettime(Process::CLOCK_MONOTONIC)) < deadline
  500.times do
    n += 1
    working_set[n % working_set.size] = sites[n % sites.size].call(n)
    "garbage #{n}" * 3
  end
  if now >= next_profile
    Heapscope.profile
    next_profile = now + 30
  end
  next unless now >= next_report

  s = Heapscope.stats
  readings << s[:recorder_bytes]
  printf("%6.0fs recorder=%.2f MB tracked=%d stacks=%d samples=%d\n", minutes * 60 - (deadline - now),
         s[:recorder_bytes] / 1e6, s[:tracked_objects], s[:stacks], s[:samples_taken])
  next_report = now + 10
end
third = readings.size / 3
middle = readings[third, third].max
last = readings.last(third).max
printf("middle third max %.2f MB, last third max %.2f MB: %s\n", middle / 1e6, last / 1e6, last <= middle * 1.1 ? "flat" : "GROWING")
exit(last <= middle * 1.1 ? 0 : 1)
