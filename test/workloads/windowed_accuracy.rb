# frozen_string_literal: true

# One run of an accuracy workload under heapscope's default (windowed) sampling, for
# test/test_windowed_accuracy.rb and bench/accuracy.rb. Every site allocates instances of its own
# class, so a profile's class label names the site; the truth is known by construction.
#
#   ruby -Ilib test/workloads/windowed_accuracy.rb WORKLOAD OUT_DIR [start options as JSON]
#
# Writes OUT_DIR/allocs.pb.gz and OUT_DIR/heap.pb.gz, and prints one JSON line: the truth
# ({"allocs" => {class => count}, "live" => {class => count}}) and Heapscope.stats.
require "json"
require "heapscope"

class SiteA; end
class SiteB; end
class SiteC; end
class SiteD; end
class Chunked < String; end
class Doc < Hash; end
class Row < Array; end
class Cell < String; end
class Meta < Hash; end

# Makes 20,000 JSON-like documents, each one Hash (Doc) holding 10 Arrays (Row) of 4 Strings (Cell) and
# a Symbol-keyed Hash (Meta), and yields each with its index; whoever keeps 2,000 of them sets the truth.
def json_documents(truth)
  20_000.times do |i|
    doc = Doc.new
    doc[:rows] = Array.new(10) { Row.new([Cell.new("a"), Cell.new("bb"), Cell.new("ccc"), Meta.new.merge!(id: i)]) }
    yield doc, i
  end
  truth[:allocs].update("Doc" => 20_000, "Row" => 200_000, "Cell" => 600_000, "Meta" => 200_000)
  truth[:live].update("Doc" => 2_000, "Row" => 20_000, "Cell" => 60_000, "Meta" => 20_000)
end

WORKLOADS = {
  # A, B, A, B...: the sampler must not alias with the alternation.
  "alternating" => lambda do |truth|
    600_000.times do
      SiteA.new
      SiteB.new
    end
    truth[:allocs].update("SiteA" => 600_000, "SiteB" => 600_000)
  end,

  # A slow phase without allocations, then one allocation at A, a burst of 1,000 at B and 100 at C: time
  # says nothing about where allocations happen. (C was 10 a burst, 10 samples a run: such skewed,
  # few-sample runs failed the 4-standard-error test twice, at z -5.6 of 16 runs in CI and z -4.1 of 48
  # in a full local run, while 480 runs put its mean at -4.5%, z -1.9. With 100, 120 runs: -1.1%, z -0.34.)
  "bursty" => lambda do |truth|
    x = 0
    1_000.times do
      20_000.times { x += 1 }
      SiteA.new
      1_000.times { SiteB.new }
      100.times { SiteC.new }
    end
    truth[:allocs].update("SiteA" => 1_000, "SiteB" => 1_000_000, "SiteC" => 100_000)
  end,

  # GCs triggered by malloc growth: strings grown with << to 1 MB start most GCs, right inside the
  # code that grows them; 1,000 small objects per string elsewhere.
  "malloc_gc" => lambda do |truth|
    chunk = ("x" * 16_384).freeze
    1_200.times do
      buffer = Chunked.new
      64.times { buffer << chunk }
      1_000.times { SiteA.new }
    end
    truth[:allocs].update("Chunked" => 1_200, "SiteA" => 1_200_000)
  end,

  # JSON-like documents (json_documents below). Every 10th document is kept for good (a leak: how long an
  # object lives does not depend on when in a GC interval it was made), the rest are garbage at once.
  "mixed_json" => lambda do |truth|
    leaked = []
    json_documents(truth) { |doc, i| leaked << doc if (i % 10).zero? }
    leaked
  end,

  # A cache of the last 2,000 JSON-like documents (FIFO): each lives about one GC interval, so whether
  # it is alive at the end depends on when in its GC interval it was made, and windows sit at the start
  # of their interval. Allocations are estimated without bias; live objects are not (see the test).
  "json_cache" => lambda do |truth|
    docs = []
    json_documents(truth) do |doc, _i|
      docs << doc
      docs.shift if docs.size > 2_000
    end
    docs
  end,

  # Phases longer than a window: objects kept at A, then at B, then at C, then garbage at D; only the
  # last 150,000 of A and 20,000 of B stay alive (bounded live sets, like caches), all of C.
  "phases" => lambda do |truth|
    keep = { a: [], b: [], c: [] }
    limits = { a: 150_000, b: 20_000, c: 3_000 }
    300.times do
      1_000.times { keep[:a] << SiteA.new }
      100.times { keep[:b] << SiteB.new }
      10.times { keep[:c] << SiteC.new }
      3_000.times { SiteD.new }
      keep.each { |kind, list| list.shift(list.size - limits[kind]) if list.size > limits[kind] }
    end
    truth[:allocs].update("SiteA" => 300_000, "SiteB" => 30_000, "SiteC" => 3_000, "SiteD" => 900_000)
    truth[:live].update("SiteA" => 150_000, "SiteB" => 20_000, "SiteC" => 3_000)
    keep
  end,
}.freeze

name, out_dir, options = ARGV
workload = WORKLOADS.fetch(name) { abort "unknown workload #{name.inspect} (known: #{WORKLOADS.keys.join(", ")})" }
Heapscope.start(**JSON.parse(options || "{}", symbolize_names: true).transform_values { |v| v.is_a?(String) ? v.to_sym : v })
truth = { allocs: {}, live: {} }
kept = workload.call(truth)
GC.start # every live object in the heap profile has survived a GC (min_age 1)
File.binwrite(File.join(out_dir, "allocs.pb.gz"), Heapscope.profile(type: :allocs))
File.binwrite(File.join(out_dir, "heap.pb.gz"), Heapscope.profile)
stats = Heapscope.stats
puts JSON.generate(truth: truth, stats: stats.slice(:sampling, :hook_on_share, :requested_share, :windows_opened, :windows_skipped,
                                                     :realized_share, :mean_window_ns, :hook_cost_ns, :sync_latency_max_ns, :samples_taken,
                                                     :allocations, :gc_registrations_deferred))
kept&.clear
