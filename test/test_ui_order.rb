# frozen_string_literal: true

# The order `heapscope ui` summarizes a folder in (Sources.refining: coarse to fine over time, every
# series in turn), and the helper processes' share of it (Prefetch: dealt out in turn, handed back
# through the summary cache without the server waiting on a file a helper still works on).

require_relative "test_report_helper"
require "etc"
require "tmpdir"
require "fileutils"
require "heapscope/pprof"
require "heapscope/ui/sources"

class TestUIOrder < Minitest::Test
  Snapshot = Heapscope::UI::Sources::Snapshot

  def test_halving_order_is_every_index_once
    (0..130).each do |n|
      assert_equal (0...n).to_a, Heapscope::UI::Sources.halving_order(n).sort, "n=#{n}"
    end
  end

  # After its first 2 + 2^j - 1 entries, no gap between chosen points is wider than (n - 1) / 2^j,
  # rounded up: the whole span is drawn at once, and every step halves the widest gap.
  def test_halving_order_spans_first_and_halves_the_gaps
    [5, 17, 100, 500, 501].each do |n|
      order = Heapscope::UI::Sources.halving_order(n)
      assert_equal [0, n - 1], order.first(2)
      (1..4).each do |j|
        chosen = order.first(1 + 2**j).sort
        widest = chosen.each_cons(2).map { |a, b| b - a }.max
        assert_operator widest, :<=, ((n - 1) / 2.0**j).ceil, "n=#{n}, after #{chosen.size} points"
      end
    end
  end

  # Files are ordered by time (mtime, then name) whatever order the listing gave; two series take turns.
  def test_refining_orders_by_time_and_takes_series_in_turn
    a = (0...9).map { |i| Snapshot.new("a#{i}", "A", "/p/a#{i}", [100.0 + i, 1]) }
    b = (0...3).map { |i| Snapshot.new("b#{i}", "B", "/p/b#{i}", [200.0 + i, 1]) }
    order = Heapscope::UI::Sources.refining((a + b).shuffle(random: Random.new(3))).map(&:id)
    assert_equal %w[a0 b0 a8 b2 a4 b1], order.first(6)
    assert_equal (a + b).map(&:id).sort, order.sort
  end

  # With a cache and two cores, a child summarizes every second file; the server's own share is never
  # the child's, and the child's come back through the cache equal to what the server would make.
  def test_prefetch_deals_files_out_in_turn_and_hands_them_back
    skip "one core: Prefetch starts no child" if Etc.nprocessors < 2
    Dir.mktmpdir("heapscope-ui-order") do |dir|
      jobs = (0...16).map do |k|
        path = File.join(dir, format("p%02d.heap.pb.gz", k))
        File.binwrite(path, profile(k))
        [path, [File.mtime(path).to_f, File.size(path)]]
      end
      cache = Heapscope::UI::SummaryCache.new(File.join(dir, "cache"))
      prefetch = Heapscope::UI::Prefetch.start(jobs, cache, max_size: Heapscope::Pprof::DEFAULT_MAX_SIZE)
      refute_nil prefetch
      children = [Etc.nprocessors - 1, Heapscope::UI::Prefetch::MAX_CHILDREN].min
      table = Heapscope::UI::SiteTable.new
      jobs.each_with_index do |(path, stamp), i|
        got = prefetch.take(path, stamp, table)
        if (i % (children + 1)).zero?
          assert_nil got, "file #{i} is the server's own"
          next
        end
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
        while got == Heapscope::UI::Prefetch::LATER && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
          sleep 0.02
          got = prefetch.take(path, stamp, table)
        end
        assert_kind_of Heapscope::UI::Summary, got, "file #{i} from the child"
        prof = Heapscope::Report::Sites.load(path)
        want = Heapscope::UI::Summarize.call(prof, table, name: path, fallback_time: stamp[0])
        assert_equal [want.total, want.values, want.ids], [got.total, got.values, got.ids], "file #{i}"
      end
    ensure
      prefetch&.stop
    end
  end

  private

  # A small profile: 40 sites, site 0 growing with k.
  def profile(k)
    types = [%w[inuse_objects count], %w[inuse_space bytes]]
    prof = Heapscope::Pprof::Profile.new(sample_types: types, period_type: %w[space bytes], period: 1,
                                         time_nanos: (1_800_000_000 + 60 * k) * 1_000_000_000,
                                         comments: ["heapscope sample_every=1000"])
    40.times do |i|
      live = i.zero? ? 100 * (k + 1) : 50 + i
      prof.add_sample(frames: [["work#{i}", "app/w.rb", 10 + i], ["main", "app/main.rb", 1]],
                      values: [live, live * 100], labels: { "class" => "String" })
    end
    prof.to_pprof
  end
end
