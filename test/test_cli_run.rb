# frozen_string_literal: true

require_relative "test_http_helper"
require "open3"
require "json"
require "heapscope/cli"
require "heapscope/env_config"

# exe/heapscope: help texts, every usage error (exit 2 and its one line), and `run` on a real
# Ruby process whose final profile go tool pprof reads.
class TestCliRun < Minitest::Test
  include SurfacesTestHelper

  EXE = File.join(ROOT, "exe/heapscope")
  SERVICE = File.join(ROOT, "examples/surfaces/leaky_service.rb")

  def setup
    @tmp = Dir.mktmpdir("heapscope-cli")
  end

  def teardown
    FileUtils.rm_rf(@tmp)
  end

  # Runs exe/heapscope in a child process; returns [stdout, stderr, exit status].
  def heapscope(*args, env: {})
    out, err, status = Timeout.timeout(90) do
      Open3.capture3({ "RUBYOPT" => nil, "HEAPSCOPE_DIR" => nil }.merge(env), RbConfig.ruby, EXE, *args, chdir: @tmp)
    end
    [out, err, status.exitstatus]
  end

  def test_help_is_complete
    out, err, code = heapscope("--help")
    assert_equal [0, ""], [code, err]
    %w[run top flamegraph diff leaks --version].each { |word| assert_includes out, word }
    assert_equal out, heapscope("help").first
    out, _, code = heapscope("run", "--help")
    assert_equal 0, code
    Heapscope::CLI::RUN_FLAGS.each_key { |flag| assert_includes out, flag }
    Heapscope::EnvConfig::VARIABLES.each_key { |var| assert_includes out, var }
    assert_match(/heapscope #{Regexp.escape(Heapscope::VERSION)}/, heapscope("--version").first)
  end

  def test_docs_cover_every_variable_flag_and_status
    doc = File.read(File.join(ROOT, "docs/surfaces.md"))
    Heapscope::EnvConfig::VARIABLES.each_key { |var| assert_includes doc, "`#{var}`" }
    Heapscope::CLI::RUN_FLAGS.each_key { |flag| assert_includes doc, flag }
    http = File.read(File.join(ROOT, "docs/http-endpoints.md")) # the HTTP endpoints' own page
    %w[gc seconds debug].each { |param| assert_includes http, "| `#{param}` |" }
    [200, 400, 401, 404, 405, 408, 413, 414, 429, 431, 500, 503].each { |code| assert_includes http, "| #{code} |" }
  end

  def test_usage_errors_exit_2_with_one_line
    {
      [] => "heapscope: missing command (see heapscope --help)",
      ["frobnicate"] => 'heapscope: unknown command "frobnicate" (see heapscope --help)',
      ["run"] => "heapscope run: missing the command to run (heapscope run [FLAGS] -- CMD ARGS...)",
      ["run", "--"] => "heapscope run: missing the command to run (heapscope run [FLAGS] -- CMD ARGS...)",
      ["run", "--bogus", "--", "ruby"] => "heapscope run: unknown flag --bogus",
      ["run", "--dir"] => "heapscope run: --dir needs a value (--dir DIR)",
      ["run", "--dir", "--", "ruby"] => "heapscope run: --dir needs a value (--dir DIR)",
      ["run", "--keep=1", "--keep=2", "--", "ruby"] => "heapscope run: --keep given more than once",
      ["run", "--sample-every", "abc", "--", "ruby"] =>
        'heapscope run: --sample-every "abc" is invalid: must be an integer from 1 to 2147483647',
      ["run", "--sample-every=0", "--", "ruby"] =>
        'heapscope run: --sample-every "0" is invalid: must be an integer from 1 to 2147483647',
      ["run", "--interval", "-1", "--", "ruby"] =>
        'heapscope run: --interval "-1" is invalid: must be a number of seconds from 0.1 to 86400',
      ["run", "--keep", "none", "--", "ruby"] => 'heapscope run: --keep "none" is invalid: must be an integer from 1 to 1000000',
      ["run", "--dump-rss", "lots", "--", "ruby"] =>
        'heapscope run: --dump-rss "lots" is invalid: must be a positive size like 1.5G, 512M or 800MiB (binary units)',
      ["run", "--signal", "TERM", "--", "ruby"] => 'heapscope run: --signal "TERM" is invalid: must be one of USR1, USR2, HUP',
      ["run", "--http", "nowhere", "--", "ruby"] =>
        'heapscope run: --http "nowhere" is invalid: must be HOST:PORT, [IPV6]:PORT or PORT',
      ["run", "--http", "0.0.0.0:6060", "--", "ruby"] =>
        'heapscope run: --http "0.0.0.0:6060" is invalid: 0.0.0.0 is not a loopback address: set HEAPSCOPE_HTTP_TOKEN to serve it',
      ["run", "--app-name", "a b", "--", "ruby"] => 'heapscope run: --app-name "a b" is invalid: use 1 to 100 of A-Z a-z 0-9 _ . -',
      ["run", "--max-frames", "0", "--", "ruby"] => 'heapscope run: --max-frames "0" is invalid: must be an integer from 1 to 3000',
      ["run", "--min-age", "x", "--", "ruby"] => 'heapscope run: --min-age "x" is invalid: must be an integer from 0 to 2147483647',
      ["run", "--sampling", "--", "ruby"] => "heapscope run: --sampling needs a value (--sampling MODE)",
      ["run", "--sampling", "sometimes", "--", "ruby"] =>
        'heapscope run: --sampling "sometimes" is invalid: must be one of windowed, always',
      ["run", "--sampling=always", "--sampling=windowed", "--", "ruby"] => "heapscope run: --sampling given more than once",
      ["run", "--window-share", "--", "ruby"] => "heapscope run: --window-share needs a value (--window-share FRACTION)",
      ["run", "--window-share", "0", "--", "ruby"] =>
        'heapscope run: --window-share "0" is invalid: must be a number above 0 and at most 1, or budget',
      ["run", "--window-share=1.5", "--", "ruby"] =>
        'heapscope run: --window-share "1.5" is invalid: must be a number above 0 and at most 1, or budget',
      ["run", "--window-share", "off", "--", "ruby"] =>
        'heapscope run: --window-share "off" is invalid: must be a number above 0 and at most 1, or budget',
      ["run", "--max-overhead", "--", "ruby"] => "heapscope run: --max-overhead needs a value (--max-overhead FRACTION)",
      ["run", "--max-overhead", "0", "--", "ruby"] =>
        'heapscope run: --max-overhead "0" is invalid: must be a number above 0 and at most 1, or off',
      ["run", "--max-overhead=lots", "--", "ruby"] =>
        'heapscope run: --max-overhead "lots" is invalid: must be a number above 0 and at most 1, or off',
    }.each do |args, line|
      out, err, code = heapscope(*args)
      assert_equal [2, "", "#{line}\n"], [code, out, err], args.inspect
    end
  end

  def test_in_process_dispatch_returns_statuses
    out = StringIO.new
    err = StringIO.new
    assert_equal 0, Heapscope::CLI.run(["--help"], out: out, err: err)
    assert_equal 2, Heapscope::CLI.run(["run", "--nope"], out: out, err: err)
    assert_equal "heapscope run: unknown flag --nope\n", err.string
  end

  def test_command_not_found_is_127
    _, err, code = heapscope("run", "--", "no-such-command-heapscope")
    assert_equal 127, code
    assert_match(/^heapscope run: cannot run "no-such-command-heapscope": No such file or directory/, err)
  end

  def test_run_writes_a_final_profile_that_go_tool_pprof_reads
    skip_unless_native
    dir = File.join(@tmp, "out")
    out, err, code = heapscope("run", "--dir", dir, "--sample-every", "100", "--interval", "0.2", "--",
                               RbConfig.ruby, SERVICE, "1")
    assert_equal 0, code, err
    assert_equal "ready\n", out
    final = err[/^heapscope: final profile: (\S+)$/, 1]
    assert final, err
    assert_match(%r{\A#{Regexp.escape(dir)}/leaky_service-\d+-\d{8}T\d{6}\.\d{3}Z-final\.heap\.pb\.gz\z}, final)
    assert_match(/^heapscope: read it with: heapscope top #{Regexp.escape(final)}/, err)
    # Issue 12: it says at start what it profiles and where it writes, and names the final path once.
    assert_match(/\Aheapscope run: profiling #{Regexp.escape(RbConfig.ruby)} \S+leaky_service\.rb 1 \(every Ruby process it starts\); final profiles go to #{Regexp.escape(dir)}\n/, err)
    assert_equal 1, err.scan(/^heapscope: final profile: /).size, err
    refute_match(/final profile written to/, err, "the child does not print it a second time")
    periodic = Dir.children(dir).reject { |n| n.include?("-final") }
    assert_operator periodic.size, :>=, 2, "--interval 0.2 over a 1 s run writes periodic files: #{Dir.children(dir)}"

    skip_unless_go
    # Ranked by objects: by bytes the one Array holding the leaked strings leads whenever the sampler
    # picked it (docs/reading-profiles.md, sampling error).
    top, perr, status = Open3.capture3({ "HOME" => @tmp }, "go", "tool", "pprof", "-top", "-lines",
                                       "-sample_index=inuse_objects", final)
    assert status.success?, perr
    leak_line = File.readlines(SERVICE).index { |l| l.include?("# LEAK") } + 1
    row = top.lines.drop_while { |l| !l.include?("flat%") }[1]
    assert_includes row, "leaky_service.rb:#{leak_line}", top
  end

  # --focus reaches the child (HEAPSCOPE_FOCUS), names a class its script defines only later (pending at
  # autostart, focused when its body opens), and its objects are counted exactly at rate 1 while the
  # rest is sampled 1 in 100000: go tool pprof reads 3000 at the line.
  def test_run_focus_counts_a_class_defined_after_start_exactly
    skip_unless_native
    script = File.join(@tmp, "orders.rb")
    File.write(script, <<~RUBY)
      class Order
        def initialize(i) = @i = i
      end
      $keep = Array.new(3000) { |i| Order.new(i) } # ORDERS
      $noise = Array.new(3000) { |i| "s\#{i}" }
    RUBY
    dir = File.join(@tmp, "out")
    _out, err, code = heapscope("run", "--dir", dir, "--sampling", "always", "--sample-every", "100000",
                                "--focus", "Order=1", "--", RbConfig.ruby, script)
    assert_equal 0, code, err
    final = err[/^heapscope: final profile: (\S+)$/, 1]
    assert final, err
    out, err, code = heapscope("top", final, "--sample", "inuse_objects", "--json")
    assert_equal 0, code, err
    data = JSON.parse(out)
    assert_includes data["sampling"], "focus: Order 1 in 1"
    order = data["census"]["rows"].find { |r| r["name"] == "Order" }
    assert_equal [3000, 3000, 0], order.values_at("exact", "at_sites", "error"), order.inspect

    skip_unless_go
    top, perr, status = Open3.capture3({ "HOME" => @tmp }, "go", "tool", "pprof", "-top", "-lines",
                                       "-sample_index=inuse_objects", final)
    assert status.success?, perr
    row = top.lines.find { |l| l.include?("orders.rb:4") }
    assert row, top
    assert_equal "3000", row.split.first, top
  end

  def test_run_passes_the_exit_status_and_the_default_dir
    skip_unless_native
    _, err, code = heapscope("run", "--", RbConfig.ruby, "-e", "$keep = Array.new(1000) { 'x' * 50 }; exit 3")
    assert_equal 3, code
    assert_match(%r{^heapscope: final profile: #{Regexp.escape(File.realpath(@tmp))}/heapscope-profiles/}, err)
  end

  # Issue 11, item 12: the directory is shared (the default ./heapscope-profiles, or --dir); other
  # processes' finals in it, old or written during the run, are not this run's profiles.
  def test_run_reports_only_the_finals_of_its_own_processes
    skip_unless_native
    dir = File.join(@tmp, "shared")
    Dir.mkdir(dir)
    # A final profile from just before (the old report took any from up to 1 s before the start)...
    File.write(File.join(dir, "other-1-20260101T000000.000Z-final.heap.pb.gz"), "x")
    # ...and another application writing its own final into the same directory during the run.
    other = Process.spawn(ruby_env("HEAPSCOPE_DIR" => dir, "HEAPSCOPE_APP_NAME" => "neighbour"),
                          RbConfig.ruby, "-e", "sleep 0.3", err: File::NULL)
    out, err, code = heapscope("run", "--dir", dir, "--app-name", "mine", "--", RbConfig.ruby, "-e", "puts $$; sleep 1.5")
    Process.wait(other)
    assert_equal 0, code, err
    pid = out.to_i
    assert_equal 1, Dir.children(dir).grep(/\Aneighbour-.*-final/).size, "the neighbour wrote its final during the run"
    finals = err.scan(/^heapscope: final profile: (\S+)$/).flatten
    assert_equal 1, finals.size, err
    assert_match(%r{\A#{Regexp.escape(dir)}/mine-#{pid}-\d{8}T\d{6}\.\d{3}Z-final\.heap\.pb\.gz\z}, finals.first)
  end

  # Every Ruby process the command starts is profiled, and its final is reported.
  def test_run_reports_the_finals_of_child_processes_too
    skip_unless_native
    dir = File.join(@tmp, "out")
    script = "puts $$; $stdout.flush; system(RbConfig.ruby, '-e', 'puts $$')"
    out, err, code = heapscope("run", "--dir", dir, "--", RbConfig.ruby, "-e", script)
    assert_equal 0, code, err
    pids = out.split.map(&:to_i)
    assert_equal 2, pids.size, out
    finals = err.scan(/^heapscope: final profile: (\S+)$/).flatten
    assert_equal pids.sort, finals.map { |f| File.basename(f)[/\A\w+-(\d+)-/, 1].to_i }.sort, err
  end

  def test_run_passes_sampling_flags_to_the_child
    skip_unless_native
    script = "p Heapscope.config.values_at(:sampling, :window_share); p Heapscope.stats[:sampling]"
    out, err, code = heapscope("run", "--sampling", "always", "--window-share=0.5", "--dir", @tmp, "--",
                               RbConfig.ruby, "-e", script)
    assert_equal [0, "[:always, 0.5]\n:always\n"], [code, out], err
    # A flag wins over the environment.
    out, err, code = heapscope("run", "--sampling", "always", "--dir", @tmp, "--", RbConfig.ruby, "-e", script,
                               env: { "HEAPSCOPE_SAMPLING" => "windowed", "HEAPSCOPE_WINDOW_SHARE" => "0.125" })
    assert_equal [0, "[:always, 0.125]\n:always\n"], [code, out], err
  end

  # --max-overhead reaches the child (off turns the budget off); --sample-every alone turns it off too,
  # so the rate asked for is the rate recorded (issue 17, item 4).
  def test_run_max_overhead_and_exact_sample_every
    skip_unless_native
    script = "p Heapscope.config.values_at(:sample_every, :max_overhead)"
    {
      ["--max-overhead", "off"] => "[1000, nil]\n",
      ["--max-overhead=0.25"] => "[1000, 0.25]\n",
      ["--sample-every", "1"] => "[1, nil]\n",
      ["--sample-every", "1", "--max-overhead", "0.05"] => "[1, 0.05]\n",
      [] => "[1000, 0.01]\n",
    }.each do |flags, expected|
      out, err, code = heapscope("run", *flags, "--dir", @tmp, "--", RbConfig.ruby, "-e", script)
      assert_equal [0, expected], [code, out], "#{flags.inspect}: #{err}"
    end
  end

  def test_run_with_http_serves_while_running
    skip_unless_native
    port = free_port
    script = "require 'net/http'; print Net::HTTP.get_response(URI('http://127.0.0.1:#{port}/debug/pprof/heap')).code"
    out, err, code = heapscope("run", "--http", port.to_s, "--dir", @tmp, "--", RbConfig.ruby, "-e", script)
    assert_equal [0, "200"], [code, out], err
    assert_includes err, "heapscope: serving http://127.0.0.1:#{port}/debug/pprof/"
  end

  def test_report_commands_are_delegated
    begin
      require "heapscope/report/cli"
    rescue LoadError
      skip "lib/heapscope/report/cli.rb is not there yet"
    end
    _, err, code = heapscope("top", File.join(@tmp, "missing.pb.gz"))
    refute_equal 0, code
    assert_includes err, "missing.pb.gz"
  end
end
