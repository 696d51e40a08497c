# frozen_string_literal: true

# bench/labels_cost.rb: what labels cost (lib/heapscope/labels.rb, ext/heapscope/labels.c), in one
# process so the ratios hold on a noisy machine. Alternating rounds of the same allocation loop:
#   - the sampled path, with every allocation sampled (sample_every 1, :always): without labels, inside
#     with_labels (the hook reads the fiber-local set id), and with label_threads (plus the thread's name
#     from the kernel and one set lookup per sample);
#   - the unsampled path (sample_every 1000, :always): without and with labels in force; the hook's
#     countdown does not look at labels, so the two should not differ beyond noise;
#   - the call itself: with_labels of a set seen before, and RackLabels' per-request lookup.
#
#   bundle exec ruby -Ilib bench/labels_cost.rb [ALLOCATIONS_PER_ROUND]
require "heapscope"

N = Integer(ARGV[0] || 200_000)
ROUNDS = 7

def clock = Process.clock_gettime(Process::CLOCK_MONOTONIC)

def loop_ns(n)
  t = clock
  i = 0
  while i < n
    Object.new
    i += 1
  end
  (clock - t) * 1e9 / n
end

# Median ns per allocation for each variant, rounds interleaved.
def compare(variants)
  results = variants.keys.to_h { |name| [name, []] }
  ROUNDS.times do
    variants.each do |name, (options, labels)|
      Heapscope.start(**options)
      GC.start
      results[name] << (labels ? Heapscope.with_labels(**labels) { loop_ns(N) } : loop_ns(N))
      Heapscope.stop
    end
  end
  results.transform_values { |times| times.sort[ROUNDS / 2] }
end

Thread.current.name = "bench-main"
sampled = compare(
  "no labels" => [{ sample_every: 1, sampling: :always }, nil],
  "with_labels" => [{ sample_every: 1, sampling: :always }, { endpoint: "GET /users/:id", job: "X" }],
  "with_labels + label_threads" => [{ sample_every: 1, sampling: :always, label_threads: true }, { endpoint: "GET /users/:id" }],
)
unsampled = compare(
  "no labels" => [{ sample_every: 1000, sampling: :always }, nil],
  "with_labels" => [{ sample_every: 1000, sampling: :always }, { endpoint: "GET /users/:id" }],
)

labels = { endpoint: "GET /users/:id" }
Heapscope.with_labels(**labels) {}
calls = 200_000
t = clock
calls.times { Heapscope.with_labels(**labels) {} }
with_labels_ns = (clock - t) * 1e9 / calls
Heapscope::RackLabels.id_for("GET", "/users/42")
t = clock
calls.times { Heapscope::Labels.switch(Heapscope::Labels.switch(Heapscope::RackLabels.id_for("GET", "/users/42"))) }
rack_ns = (clock - t) * 1e9 / calls

puts "Ruby #{RUBY_VERSION}, #{N} allocations per round, median of #{ROUNDS} interleaved rounds"
puts "sampled path (every allocation sampled), ns per allocation:"
base = sampled["no labels"]
sampled.each { |name, ns| puts format("  %-28s %8.1f ns  %.3fx", name, ns, ns / base) }
puts "unsampled path (1 in 1000 sampled), ns per allocation:"
base = unsampled["no labels"]
unsampled.each { |name, ns| puts format("  %-28s %8.1f ns  %.3fx", name, ns, ns / base) }
puts format("Heapscope.with_labels of a known set: %.0f ns per call (block and restore included)", with_labels_ns)
puts format("RackLabels lookup and switch of a known path: %.0f ns per request", rack_ns)
