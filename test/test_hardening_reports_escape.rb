# frozen_string_literal: true

# Issue 11, item 11: names in a profile are the writer's bytes, and each output escapes them for where
# they land. Terminal text (top, diff, leaks, error lines): control characters, C1 controls, bidi
# overrides and line separators become visible escapes, so a name cannot recolour or retitle the
# terminal, move the cursor, or fake a row. JSON (--json): still valid JSON, no raw C1 or bidi
# characters. HTML: text and attributes entity-escaped, and the data inside <script> with <, >, & and
# U+2028/2029 as \uXXXX (the page itself is checked in a browser by test_report_flamegraph.rb).

require_relative "test_report_helper"
require "json"
require "stringio"
require "heapscope/report/cli"

class TestHardeningReportsEscape < Minitest::Test
  include ReportHelper

  EVIL = "evil\e]0;owned\a\e[31mred\e[0m\r\nfake 99.9%  row\u202egnp.exe\u2028\u009b2J\x7f"
  # No byte a terminal acts on (C0 except the newlines between our own lines, DEL) and no such character
  # (C1, separators, bidi controls).
  UNSAFE = /[\x00-\x09\x0b-\x1f\x7f\u0080-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/.freeze

  def setup
    @dir = Dir.mktmpdir("heapscope-escape")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def profile(name, rows, minute: 0)
    path = File.join(@dir, name)
    prof = heapscope_profile(rows, time_nanos: (1_800_000_000 + 60 * minute) * 10**9)
    File.binwrite(path, prof.to_pprof)
    path
  end

  def test_terminal_output_escapes_control_characters
    rows = ->(k) { [[[[EVIL, "app/\e[2Jx.rb", 7], ["main", "main.rb", 1]], [k, 100 * k, k, 100 * k], { "class" => "K\e[5m" }]] }
    a = profile("a.pb.gz", rows.call(1))
    b = profile("b.pb.gz", rows.call(3), minute: 1)
    [%W[top #{a}], %W[top #{a} --by function], %W[top #{a} --by class], %W[diff #{a} #{b}], %W[leaks #{a} #{b}]].each do |cmd, *args|
      status, out, err = run_cli(cmd, *args)
      assert_equal [0, ""], [status, err], "#{cmd} #{args.join(" ")}"
      refute_match UNSAFE, out, "#{cmd}: raw control characters reach the terminal"
      row = out.lines.find { |l| l.include?("evil") || l.include?("K\\e") }
      assert row, "#{cmd}: the name is shown:\n#{out}"
      next if cmd == "top" && args.include?("class")

      # The name stays on its own row, its characters visible.
      assert_includes row, "evil\\e]0;owned\\x07\\e[31mred\\e[0m\\r\\nfake 99.9%  row\\u202Egnp.exe\\u2028\\u009B2J\\x7F"
      refute(out.lines.any? { |l| l.start_with?("fake") }, "#{cmd}: a name made a row of its own")
    end
    _, out, = run_cli("top", a, "--by", "class")
    assert_includes out, "K\\e[5m"

    # Error lines: one line whatever the path or the flag holds.
    status, out, err = run_cli("top", "/nonexistent/\e[31mx\ny.pb.gz")
    assert_equal [2, ""], [status, out]
    assert_equal "heapscope top: /nonexistent/\\e[31mx\\ny.pb.gz: no such file\n", err
    status, _, err = run_cli("top", a, "--sample", "\e]0;t\a")
    assert_equal 2, status
    assert_equal 1, err.lines.size
    refute_match UNSAFE, err
  end

  def test_json_output_is_valid_and_terminal_safe
    a = profile("a.pb.gz", [[[[EVIL, "app/x.rb", 7]], [1, 100, 1, 100]]])
    b = profile("b.pb.gz", [[[[EVIL, "app/x.rb", 7]], [3, 300, 3, 300]]], minute: 1)
    [%W[top #{a} --json], %W[diff #{a} #{b} --json], %W[leaks #{a} #{b} --json]].each do |cmd, *args|
      status, out, = run_cli(cmd, *args)
      assert_equal 0, status
      refute_match UNSAFE, out, "#{cmd} --json"
      data = JSON.parse(out)
      rows = data["entries"] || data["grew"] || data["sites"]
      assert_equal "#{EVIL} app/x.rb:7", rows.first["name"], "#{cmd}: JSON still holds the exact name"
    end
  end

  def test_html_data_cannot_leave_its_script_element
    names = ["<!--<script>", "</script><img src=x onerror=alert(1)>", "a\u2028b\u2029c", "&amp;\"'"]
    path = File.join(@dir, "x<b>&\".pb.gz")
    File.binwrite(path, heapscope_profile([[names.map.with_index { |n, i| [n, "f.rb", i + 1] }, [1, 100, 1, 100]]]).to_pprof)
    status, html, err = run_cli("flamegraph", path, "-o", "-")
    assert_equal [0, ""], [status, err]
    data = html[%r{<script type="application/json" id="hs-data">(.*?)</script>}m, 1]
    assert data, "the data script is intact"
    refute_match(/[<>&\u2028\u2029]/, data, "the JSON inside <script> has no character the HTML parser reads")
    frames = JSON.parse(data)["frames"].map(&:first)
    names.each { |n| assert_includes frames, n }
    assert_equal 2, html.scan(/<script\b/).size, "no script element but ours"
    # The path is in the title, heading and meta: text, escaped.
    assert_includes html, "<title>heapscope flame graph: x&lt;b&gt;&amp;&quot;.pb.gz</title>"
    refute_includes html, "x<b>"
  end
end
