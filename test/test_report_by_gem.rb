# frozen_string_literal: true

# --by gem and --by file in top, diff and leaks: which frame decides a sample's gem, the group names
# (gems from their paths, on this machine or another, git checkouts, (app), (stdlib), (ruby)), the
# error of a grouped row, and docs/recipes.md's memory-per-gem-at-boot recipe run for real on an app
# whose Gemfile lists rack and minitest. Expected numbers are worked out in the comments.

require_relative "test_report_helper"
require "json"
require "shellwords"
require "timeout"
require "heapscope/report/cli"

class TestReportByGem < Minitest::Test
  include ReportHelper

  ROOT = File.expand_path("..", __dir__)
  EXE = File.join(ROOT, "exe/heapscope")
  MIN = 60 * 10**9
  T0 = 1_800_000_000 * 10**9
  VARIANCE = "sampling=always share=1 sample_every=1 current_sample_every=1 rate_lowered=false windows=0 variance=labels"

  # This machine's gem directory, and another machine's vendored bundle: the same gem either way.
  RACK = "/var/lib/gems/3.1.0/gems/rack-3.2.8/lib/rack/utils.rb"
  RACK_ELSEWHERE = "/home/deploy/app/vendor/bundle/ruby/3.3.0/gems/rack-3.2.8/lib/rack/request.rb"
  KRAMDOWN = "/usr/local/bundle/gems/kramdown-2.5.2/lib/kramdown/parser/kramdown.rb"
  NOKOGIRI = "/usr/local/bundle/gems/nokogiri-1.18.10-x86_64-linux-gnu/lib/nokogiri/xml/document.rb"
  GIT = "/usr/local/bundle/bundler/gems/mygem-0123456789ab/lib/mygem.rb"
  # Another machine's Ruby: the standard library by the shape of its path.
  SET = "/opt/rubies/ruby-3.3.0/lib/ruby/3.3.0/set.rb"
  RUBYGEMS = "/opt/rubies/ruby-3.3.0/lib/ruby/3.3.0/rubygems/specification.rb"
  USERS = "/srv/app/app/controllers/users_controller.rb"
  USER = "/srv/app/app/models/user.rb"
  MAIN = ["<main>", "/srv/app/config.ru", 1].freeze

  # 100,000 live bytes. By gem (the innermost frame that is not Ruby's own decides):
  #   rack 3.2.8       40,000 (String#* called in utils.rb) + 20,000 (the other machine's path) + 2,000
  #                    (Array#each in <internal:array> and Set#each in set.rb, called by rack) = 62,000;
  #                    variance 3000² + 4000² = 5000²
  #   kramdown 2.5.2   15,000 (Set#add in set.rb, called by kramdown); variance 1200²
  #   (app)            8,000 (Kernel#tap, <internal:kernel>, called by User#initialize)
  #   nokogiri 1.18.10 6,000; mygem git:0123456789ab 3,000; (stdlib) 5,000 (RubyGems alone);
  #   (ruby) 1,000 (a C function with no Ruby caller)
  # cum: (app) 94,000 (every stack under <main>), (stdlib) 22,000 (the three stacks through set.rb
  # and rubygems), (ruby) 11,000, mygem 9,000 (nokogiri's caller too).
  def gems_profile(rack: 40_000, rack_var: 3000**2)
    rows = [
      [[["String#*", RACK, 40], ["Rack::Utils.escape", RACK, 40], ["UsersController#show", USERS, 5], MAIN],
       [1, 1, 1, rack], { "class" => "String", "inuse_space_var" => rack_var }],
      [[["Rack::Request#params", RACK_ELSEWHERE, 10], ["UsersController#show", USERS, 6], MAIN],
       [1, 1, 1, 20_000], { "class" => "Hash", "inuse_space_var" => 4000**2 }],
      [[["Set#add", SET, 500], ["Kramdown::Parser::Kramdown#parse", KRAMDOWN, 30], ["UsersController#show", USERS, 7], MAIN],
       [1, 1, 1, 15_000], { "class" => "Hash", "inuse_space_var" => 1200**2 }],
      [[["Kernel#tap", "<internal:kernel>", 90], ["User#initialize", USER, 3], MAIN], [1, 1, 1, 8_000], { "class" => "User" }],
      [[["Gem::Specification#initialize", RUBYGEMS, 100], ["Kernel#require", RUBYGEMS, 30]], [1, 1, 1, 5_000], { "class" => "Array" }],
      [[["Thread#initialize", "", 0]], [1, 1, 1, 1_000], { "class" => "Thread" }],
      [[["Nokogiri::XML::Document#initialize", NOKOGIRI, 10], ["MyGem.build", GIT, 4], MAIN], [1, 1, 1, 6_000], { "class" => "Object" }],
      [[["MyGem.build", GIT, 5], MAIN], [1, 1, 1, 3_000], { "class" => "String" }],
      [[["Array#each", "<internal:array>", 1], ["Set#each", SET, 200], ["Rack::Utils.parse", RACK, 90], MAIN],
       [1, 1, 1, 2_000], { "class" => "Array" }],
    ]
    prof = heapscope_profile(rows)
    prof.comments << VARIANCE
    prof
  end

  def setup
    @dir = Dir.mktmpdir("heapscope-by-gem")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def column(rows, key)
    rows.to_h { |r| [r["name"], r[key]] }
  end

  def test_top_by_gem_counts_for_the_first_frame_outside_ruby
    data = json("top", write("app.pb.gz", gems_profile), "--by", "gem", "--all")
    assert_equal "gem", data["by"]
    assert_equal({ "rack 3.2.8" => 62_000, "kramdown 2.5.2" => 15_000, "(app)" => 8_000, "nokogiri 1.18.10" => 6_000,
                   "(stdlib)" => 5_000, "mygem git:0123456789ab" => 3_000, "(ruby)" => 1_000 }, column(data["entries"], "flat"))
    assert_equal %w[rack kramdown (app) nokogiri (stdlib) mygem (ruby)], data["entries"].map { |e| e["name"].split.first }
    cum = column(data["entries"], "cum")
    assert_equal [94_000, 22_000, 11_000, 9_000, 62_000], cum.values_at("(app)", "(stdlib)", "(ruby)", "mygem git:0123456789ab", "rack 3.2.8")
    # The grouped rows carry their samples' variances summed: rack's error is sqrt(3000² + 4000²).
    rel = column(data["entries"], "relative_error")
    assert_in_delta 5000.0 / 62_000, rel["rack 3.2.8"], 1e-4
    assert_in_delta 1200.0 / 15_000, rel["kramdown 2.5.2"], 1e-4
    assert_equal 0.0, rel["(app)"]
    row = data["entries"][0]
    assert_equal ["rack 3.2.8", "", 0], row.values_at("function", "file", "line")

    _, out, = run_cli("top", write("app.pb.gz", gems_profile), "--by", "gem")
    assert_includes out, "Type: inuse_space, by gem, sorted by flat"
    assert_match(/^60\.5 KiB +62\.0% +62\.0% +60\.5 KiB +62\.0% +±8% +rack 3\.2\.8$/, out)
  end

  def test_top_by_file_uses_the_leaf_frames_file
    data = json("top", write("app.pb.gz", gems_profile), "--by", "file", "-n", "100")
    assert_equal "file", data["by"]
    # The leaf's file, as --by line picks it (String#* is at its caller's line in utils.rb); a frame
    # without a file by its function.
    assert_equal({ RACK => 40_000, RACK_ELSEWHERE => 20_000, SET => 15_000, "<internal:kernel>" => 8_000,
                   NOKOGIRI => 6_000, RUBYGEMS => 5_000, GIT => 3_000, "<internal:array>" => 2_000, "Thread#initialize" => 1_000 },
                 column(data["entries"].reject { |e| e["flat"].zero? }, "flat"))
    cum = column(data["entries"], "cum")
    assert_equal [42_000, 17_000, 75_000, 94_000], cum.values_at(RACK, SET, USERS, "/srv/app/config.ru")
    assert_equal [RACK, "", RACK, 0], data["entries"][0].values_at("name", "function", "file", "line")
    assert_in_delta 3000.0 / 40_000, column(data["entries"], "relative_error")[RACK], 1e-4
  end

  def test_diff_by_gem_judges_a_gem_with_its_combined_error
    base = write("base.pb.gz", gems_profile(rack: 10_000, rack_var: 1000**2))
    newer = write("new.pb.gz", gems_profile)
    data = json("diff", base, newer, "--by", "gem")
    # rack grew by 30,000 (its String#* line); error sqrt(1000² + 4000² + 3000² + 4000²) = 6480.7:
    # more than twice it, so not noise. No other gem changed.
    assert_equal [["rack 3.2.8", 32_000, 62_000, 30_000, false]],
                 data["grew"].map { |r| r.values_at("name", "base", "new", "change", "noise") }
    assert_equal Math.sqrt(1000**2 + 4000**2 + 3000**2 + 4000**2).round(1), data["grew"][0]["error"]
    assert_equal [], data["shrank"]
    assert_equal [["#{RACK}", 30_000]], json("diff", base, newer, "--by", "file")["grew"].map { |r| r.values_at("name", "change") }
  end

  # rack grows by 10,000 a minute, half in each of two files; kramdown holds steady at 15,000.
  def test_leaks_by_gem_sums_a_gems_files
    paths = (0..4).map do |k|
      rows = [[[["Rack::Utils.escape", RACK, 40], MAIN], [1, 1, 1, 5_000 * (k + 1)], { "gc_age" => 8 }],
              [[["Rack::Request#params", RACK_ELSEWHERE, 10], MAIN], [1, 1, 1, 5_000 * (k + 1)], { "gc_age" => 8 }],
              [[["Set#add", SET, 500], ["Kramdown::Parser::Kramdown#parse", KRAMDOWN, 30], MAIN], [1, 1, 1, 15_000], { "gc_age" => 8 }]]
      write("s#{k}.pb.gz", heapscope_profile(rows, time_nanos: T0 + k * MIN))
    end
    sites = json("leaks", *paths, "--by", "gem")["sites"]
    assert_equal [["rack 3.2.8", 10_000.0, "leak", [10_000, 20_000, 30_000, 40_000, 50_000]]],
                 sites.map { |s| s.values_at("name", "rate_per_minute", "verdict", "values") }
    assert_equal [RACK, RACK_ELSEWHERE].sort, json("leaks", *paths, "--by", "file")["sites"].map { |s| s["name"] }.sort
  end

  def test_by_takes_unique_prefixes_and_names_the_choices
    path = write("app.pb.gz", gems_profile)
    assert_equal "gem", json("top", path, "--by", "g")["by"]
    assert_equal "file", json("top", path, "--by", "fi")["by"]
    assert_equal [2, "", "heapscope top: invalid argument: --by f (one of line, function, class, file, gem or label:KEY)\n"],
                 run_cli("top", path, "--by", "f")
    status, out, = run_cli("top", "--help")
    assert_equal 0, status
    assert_includes out, "--by line|function|class|file|gem|label:KEY"
    assert_includes out, "gem: the first frame outside Ruby's own code decides"
  end

  # docs/recipes.md's two commands, as written there, on an app whose Gemfile lists rack and minitest
  # (both in heapscope's own bundle, so they resolve without a network): each gem's row holds what its
  # files left alive at boot.
  def test_boot_recipe_gives_each_gems_memory
    %w[rack minitest].each { |g| skip "#{g} is not installed" if Gem::Specification.find_all_by_name(g).empty? }
    doc = File.read(File.join(ROOT, "docs/recipes.md"))
    run_line = doc[/^    (heapscope run .*)$/, 1]
    top_line = doc[/^    (heapscope top FINAL --by gem)\b/, 1]
    assert run_line && top_line, "docs/recipes.md lost its recipe"
    app = File.join(@dir, "app")
    FileUtils.mkdir_p(app)
    File.write(File.join(app, "Gemfile"), "source \"https://rubygems.org\"\ngem \"rack\"\ngem \"minitest\"\n")

    # heapscope and ruby as this test runs them; outside heapscope's own bundle, in the app's.
    argv = Shellwords.split(run_line).drop(1)
    argv[argv.index("--") + 1] = RbConfig.ruby
    # The gem directories this test sees, so the app's bundle resolves from them: where the suite's
    # gems live is this process's Gem.path (a private bundle path on the CI Rubies, whose plain
    # environment has no rack), not the environment with_unbundled_env restores.
    env = { "BUNDLE_GEMFILE" => File.join(app, "Gemfile"), "RUBYOPT" => nil, "HEAPSCOPE_DIR" => nil,
            "GEM_PATH" => Gem.path.join(File::PATH_SEPARATOR) }
    out, err, status = unbundled do
      Timeout.timeout(120) { Open3.capture3(env, RbConfig.ruby, EXE, *argv, chdir: app) }
    end
    assert status.success?, "#{out}\n#{err}"
    final = err[/^heapscope: final profile: (\S+)$/, 1]
    assert final, err

    versions = File.read(File.join(app, "Gemfile.lock")).scan(/^    (rack|minitest) \(([^)]+)\)$/).to_h
    data = json(*Shellwords.split(top_line.sub("FINAL", final.shellescape)).drop(1), "-n", "100")
    rows = data["entries"].to_h { |e| [e["name"], e] }
    %w[rack minitest].each do |gem|
      row = rows["#{gem} #{versions.fetch(gem)}"]
      assert row, "no #{gem} row in #{rows.keys}"
      assert_operator row["flat"], :>, 0, gem
      assert_operator row["objects"], :>, 0, gem
    end
    # Bundler.require is called from -e: the app is at the root of the boot's stacks.
    assert_operator rows.fetch("(app)")["cum"], :>, data["total"] / 2
  end

  def unbundled(&block)
    defined?(Bundler) ? Bundler.with_unbundled_env(&block) : block.call
  end
end
