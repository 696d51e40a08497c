# frozen_string_literal: true

# What `heapscope ui` keeps of a windowed profile for its error bands: the whole heap's error and a
# label filter's are read from their parts by variance group, as `heapscope top --label` reads a
# selection (sets and sites that share windows are correlated, so their errors in quadrature read
# narrow); the same after the summary cache.

require_relative "test_report_helper"
require "tmpdir"
require "heapscope/ui/sources"

class TestUISummary < Minitest::Test
  include ReportHelper

  USERS = [["Users#show", "app/users.rb", 3]].freeze
  POSTS = [["Posts#index", "app/posts.rb", 7]].freeze
  Filter = Heapscope::Report::Labels::Filter

  def setup
    @dir = Dir.mktmpdir("heapscope-ui-summary")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # Two label sets of one endpoint, sampled in the same windows (the same group pattern): the filter
  # endpoint=users is their sum, whose error is its summed parts' (twice one set's, not sqrt(2) times).
  def windowed_profile
    prof = heapscope_profile([], sample_every: 100, time_nanos: 1_800_000_000 * 10**9)
    prof.comments << "sampling=windowed share=0.04 sample_every=100 current_sample_every=100 rate_lowered=false " \
                     "windows=400 hook_on_share=0.04 allocations=400000 skipped_own=0 variance=groups"
    prof.comments << "variance_groups=16 group_allocations=#{Array.new(16, 1000).join(",")}"
    parts = ->(by_group) { by_group.to_h { |g, v| ["inuse_space_vg#{g}", v] } }
    pattern = (0...16).to_h { |g| [g, g.even? ? 10_000 : 6_000] }
    prof.add_sample(frames: USERS, values: [0, 0, 640, 128_000],
                    labels: { "endpoint" => "users", "worker" => "w1", "class" => "String" }.merge(parts.call(pattern)))
    prof.add_sample(frames: POSTS, values: [0, 0, 640, 128_000],
                    labels: { "endpoint" => "users", "worker" => "w2", "class" => "String" }.merge(parts.call(pattern)))
    prof.add_sample(frames: POSTS, values: [0, 0, 500, 50_000],
                    labels: { "endpoint" => "posts", "worker" => "w1", "class" => "Hash" }.merge(parts.call(3 => 50_000)))
    path = File.join(@dir, "app-1-20270115T080000Z.heap.pb.gz")
    File.binwrite(path, prof.to_pprof)
    path
  end

  def test_windowed_label_filter_and_total_are_read_from_their_parts
    path = windowed_profile
    prof = Heapscope::Report::Sites.load(path)
    ti = prof.sample_type_names.index("inuse_space")
    sampling = Heapscope::Report::Sampling.new(prof)
    by_endpoint = Heapscope::Report::Sites.aggregate(prof, "label:endpoint")
    users = by_endpoint["users"].flat
    whole = users.dup
    by_endpoint.each { |name, row| Heapscope::Report::Sites.add(whole, row.flat) unless name == "users" }
    want_users = sampling.absolute_error(users, ti)
    want_total = sampling.absolute_error(whole, ti)
    one_set = sampling.absolute_error(Heapscope::Report::Sites.aggregate(prof, "label:worker")["w2"].flat, ti)
    assert_in_delta 2 * one_set, want_users, 1e-6 * want_users # the two sets are perfectly correlated

    table = Heapscope::UI::SiteTable.new
    fresh = Heapscope::UI::Summarize.call(prof, table, name: path, fallback_time: 0)
    cache = Heapscope::UI::SummaryCache.new(File.join(@dir, "cache"))
    stamp = [File.mtime(path).to_f, File.size(path)]
    cache.write(path, stamp, fresh, table)
    cached = cache.read(path, stamp, table)
    refute_nil cached, "the summary was not read back"
    [fresh, cached].each do |summary|
      value, error, rest = summary.labelled([Filter.new("endpoint", "users")])
      assert_equal [users[ti], 0], [value, rest]
      assert_in_delta want_users, error, 1e-6 * want_users
      assert_in_delta want_total, summary.total_error, 1e-6 * want_total
      # One set alone is that set's own error.
      _, error = summary.labelled([Filter.new("worker", "w2")])
      assert_in_delta one_set, error, 1e-6 * one_set
    end
  end

  # A cached label set whose parts do not fit the design is a miss (read as none, the filter would
  # fall back to the quadrature without saying so).
  def test_cached_label_set_parts_that_do_not_fit_are_a_miss
    path = windowed_profile
    table = Heapscope::UI::SiteTable.new
    prof = Heapscope::Report::Sites.load(path)
    summary = Heapscope::UI::Summarize.call(prof, table, name: path, fallback_time: 0)
    cache = Heapscope::UI::SummaryCache.new(File.join(@dir, "cache"))
    stamp = [File.mtime(path).to_f, File.size(path)]
    cache.write(path, stamp, summary, table)
    file = Dir[File.join(@dir, "cache", "*.json")].first
    good = JSON.parse(File.read(file))
    [
      ->(d) { d["label_sets"][0][3] = d["label_sets"][0][3].first(15) },
      ->(d) { d["label_sets"][0][3] = "x" },
      ->(d) { d["design"]["allocations"] = "x" },
      ->(d) { d["design"]["total"] = 0 }, # would divide by zero: NaN in the timeline's JSON
      ->(d) { d["design"] = nil }, # parts without a design
    ].each_with_index do |tamper, i|
      data = JSON.parse(JSON.generate(good))
      tamper.call(data)
      File.write(file, JSON.generate(data))
      assert_nil cache.read(path, stamp, table), "tampering #{i} was read"
    end
  end
end
