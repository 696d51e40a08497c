# frozen_string_literal: true

# The flame graph page opened in a real browser: headless Chromium driven through the Chrome DevTools
# protocol (browser_helper.rb: a small websocket client over TCPSocket, stdlib only). Checks: a non-empty screenshot, no
# console errors, the leaking function and its share in the DOM, hover, search, zoom, the sample type
# switch, a Go profile drawn, and a 50k-sample profile that still renders quickly.
# Chromium is required: if it is missing and cannot be installed, these tests fail (they never skip).

require_relative "test_report_helper"
require_relative "browser_helper"
require "json"
require "zlib"
require "stringio"
require "heapscope/report/cli"

class TestReportFlamegraph < Minitest::Test
  include ReportHelper
  include BrowserHelper
  Pprof = Heapscope::Pprof
  LEAK = "LeakyCache#store"

  def setup
    @dir = Dir.mktmpdir("heapscope-flame")
    path = BrowserHelper.chromium
    flunk "chromium is required for the flame graph test: apt-get install chromium (bin/setup: HEAPSCOPE_EXTRA_PKGS=chromium:chromium)" unless path
    start_browser(path)
  end

  def teardown
    stop_browser
    FileUtils.rm_rf(@dir)
  end

  # 80% of the live bytes are held by LeakyCache#store, reached from two different callers.
  def leak_profile
    heapscope_profile([
                        [[[LEAK, "app/leaky.rb", 12], ["Worker#run", "app/worker.rb", 30], ["main", "app/main.rb", 3]],
                         [600, 6_000_000, 600, 6_000_000], { "class" => "String", "gc_age" => 8 }],
                        [[[LEAK, "app/leaky.rb", 12], ["Batch#run", "app/batch.rb", 8], ["main", "app/main.rb", 4]],
                         [200, 2_000_000, 200, 2_000_000], { "class" => "String", "gc_age" => 4 }],
                        [[["Parser#token", "app/parser.rb", 40], ["Worker#run", "app/worker.rb", 31], ["main", "app/main.rb", 3]],
                         [90_000, 9_000_000, 100, 1_000_000], { "class" => "Array", "gc_age" => 0 }],
                        [[["Config#load", "app/config.rb", 2], ["main", "app/main.rb", 1]],
                         [100, 1_000_000, 100, 1_000_000], { "class" => "Hash", "gc_age" => 16 }],
                      ], sample_every: 100)
  end

  def test_flamegraph_in_chromium
    profile = File.join(@dir, "heap.pb.gz")
    File.binwrite(profile, leak_profile.to_pprof)
    html = File.join(@dir, "heap.html")
    out = StringIO.new
    assert_equal 0, Heapscope::Report::CLI.run("flamegraph", [profile, "-o", html], out: out, err: $stderr)
    assert_match(/wrote #{Regexp.escape(html)}/, out.string)
    page = File.read(html)
    refute_match(%r{(src|href)=["']?https?://}, page, "the page must not load anything from the network")

    open_page(html)
    # The table under the graph: the leaking function with its share (8 MB of 10 MB live).
    top = eval_js("document.getElementById('hs-top').innerText")
    row = top.lines.find { |l| l.include?(LEAK) }
    assert row, "no #{LEAK} row in:\n#{top}"
    assert_includes row, "80.0%"
    assert_includes eval_js("document.getElementById('hs-status').textContent"), "inuse_space: total 9.5 MiB"

    # Hover: the tooltip names the function, its file:line and its share.
    box = rect_of(LEAK)
    mouse("mouseMoved", box)
    tip = eval_js("(function(){var t=document.getElementById('hs-tip');return t.style.display+'|'+t.textContent})()")
    assert tip.start_with?("block|"), tip
    assert_includes tip, LEAK
    assert_includes tip, "app/leaky.rb:12"
    assert_match(/inuse_space: 5\.7 MiB \(60\.0% of total\)/, tip)
    assert_includes tip, "inuse_objects: 600"

    # Search: typing highlights the matches and reports their share.
    eval_js("document.getElementById('hs-search').focus()")
    @cdp.call("Input.insertText", { text: "LeakyCache" }, session: @session)
    status = eval_js("document.getElementById('hs-status').textContent")
    assert_includes status, "matched 7.6 MiB (80.0% of total)"
    lit = eval_js("Array.from(document.querySelectorAll('#hs-svg g:not(.hs-dim)')).map(g => g.getAttribute('data-name')).join(',')")
    assert_equal [LEAK, LEAK], lit.split(",")
    assert_operator eval_js("document.querySelectorAll('#hs-svg g.hs-dim').length"), :>=, 5

    # Screenshot: something was drawn (many colours in the graph area, not a blank page).
    shot = @cdp.call("Page.captureScreenshot", { format: "png" }, session: @session)["data"]
    png = shot.unpack1("m")
    File.binwrite(File.join(@dir, "flame.png"), png)
    assert_operator png.bytesize, :>, 5000
    graph = eval_js("(function(){var r=document.getElementById('hs-svg').getBoundingClientRect();return [r.x,r.y,r.width,r.height]})()")
    clip = { x: graph[0], y: graph[1], width: [graph[2], 600].min, height: graph[3], scale: 1 }
    part = @cdp.call("Page.captureScreenshot", { format: "png", clip: clip }, session: @session)["data"].unpack1("m")
    assert_operator png_colors(part), :>=, 6, "the flame graph area looks empty"

    # Escape clears the search; clicking a frame zooms on it.
    key("Escape")
    assert_equal 0, eval_js("document.querySelectorAll('#hs-svg g.hs-dim').length")
    worker = rect_of("Worker#run")
    mouse("mousePressed", worker, click: 1)
    mouse("mouseReleased", worker, click: 1)
    assert_includes eval_js("document.getElementById('hs-status').textContent"), "zoomed on Worker#run"
    assert_in_delta eval_js("document.getElementById('hs-svg').getBoundingClientRect().width"), rect_of("Worker#run")[2], 2

    # Switching the sample type redraws with the other values: Parser#token leads alloc_space.
    eval_js("(function(){var s=document.getElementById('hs-type');s.value='1';s.dispatchEvent(new Event('change'))})()")
    first = eval_js("document.querySelector('#hs-top tr:nth-child(2) td.n').textContent")
    assert_includes first, "Parser#token"

    assert_no_console_errors
  end

  def test_go_profile_and_diff_page_render
    go = go_heap_profile(@dir)
    html = File.join(@dir, "go.html")
    assert_equal 0, Heapscope::Report::CLI.run("flamegraph", [go, "-o", html], out: StringIO.new, err: $stderr)
    open_page(html)
    row = eval_js("document.getElementById('hs-top').innerText").lines.find { |l| l.include?("main.leakyAlloc") }
    assert row, "main.leakyAlloc is missing from the Go profile's page"
    assert_operator row[/([\d.]+)%/, 1].to_f, :>, 95
    assert_operator eval_js("document.querySelectorAll('#hs-svg g').length"), :>=, 4

    # The diff page: growth in red, its table led by the grown site.
    base = File.join(@dir, "base.pb.gz")
    File.binwrite(base, heapscope_profile([[[["LeakyCache#store", "app/leaky.rb", 12]], [1, 10, 1, 1000]],
                                            [[["Shrinker#go", "app/s.rb", 1]], [1, 10, 1, 5000]]]).to_pprof)
    newer = File.join(@dir, "new.pb.gz")
    File.binwrite(newer, heapscope_profile([[[["LeakyCache#store", "app/leaky.rb", 12]], [1, 10, 1, 9000]],
                                             [[["Shrinker#go", "app/s.rb", 1]], [1, 10, 1, 1000]]]).to_pprof)
    diff_html = File.join(@dir, "diff.html")
    assert_equal 0, Heapscope::Report::CLI.run("diff", [base, newer, "--html", "-o", diff_html], out: StringIO.new, err: $stderr)
    open_page(diff_html)
    first = eval_js("document.querySelector('#hs-top tr:nth-child(2)').innerText")
    assert_includes first, "LeakyCache#store"
    assert_includes first, "+7.8 KiB"
    fill = eval_js("document.querySelector('#hs-svg g[data-name=\"LeakyCache#store\"] rect').getAttribute('fill')")
    r, g, b = fill.scan(/\d+/).map(&:to_i)
    assert r == 255 && g < 100 && b < 100, "grown frame should be deep red, is #{fill}"
    fill = eval_js("document.querySelector('#hs-svg g[data-name=\"Shrinker#go\"] rect').getAttribute('fill')")
    r, _g, b = fill.scan(/\d+/).map(&:to_i)
    assert b == 255 && r < 235, "shrunk frame should be blue, is #{fill}"
    assert_no_console_errors
  end

  # Errors (issue 17): from the variance labels, on hover and in the table; in a diff page the change's
  # error and the noise mark, by the rule of `heapscope diff`.
  def test_errors_show_on_hover_and_in_the_tables
    prof = leak_profile
    prof.comments << "sampling=windowed share=0.04 sample_every=100 current_sample_every=100 rate_lowered=false windows=9 variance=labels"
    prof.samples[0].labels["inuse_space_var"] = 600_000**2 # ±10% of 6,000,000
    prof.samples[1].labels["inuse_space_var"] = 400_000**2 # ±20% of 2,000,000
    html = File.join(@dir, "err.html")
    File.binwrite(profile = File.join(@dir, "err.pb.gz"), prof.to_pprof)
    assert_equal 0, Heapscope::Report::CLI.run("flamegraph", [profile, "-o", html], out: StringIO.new, err: $stderr)
    open_page(html)
    # The site's self value sums both stacks: sqrt(3.6e11 + 1.6e11) = 721k of 8 MB, ±9%.
    row = eval_js("document.getElementById('hs-top').innerText").lines.find { |l| l.include?(LEAK) }
    assert_match(/7\.6 MiB\s+80\.0%\s+±9%/, row)
    mouse("mouseMoved", rect_of(LEAK))
    tip = eval_js("document.getElementById('hs-tip').textContent")
    assert_match(/inuse_space: 5\.7 MiB \(60\.0% of total\) ±10%, self 5\.7 MiB ±10%/, tip)

    base = heapscope_profile([[[["LeakyCache#store", "app/leaky.rb", 12]], [1, 10, 1, 1000]],
                              [[["Shrinker#go", "app/s.rb", 1]], [1, 10, 1, 5000], { "inuse_space_var" => 2000**2 }]])
    newer = heapscope_profile([[[["LeakyCache#store", "app/leaky.rb", 12]], [1, 10, 1, 9000], { "inuse_space_var" => 100**2 }],
                               [[["Shrinker#go", "app/s.rb", 1]], [1, 10, 1, 1000]]])
    [base, newer].each { |pr| pr.comments << "sampling=always share=1 sample_every=1 current_sample_every=1 rate_lowered=false windows=0 variance=labels" }
    File.binwrite(b = File.join(@dir, "b.pb.gz"), base.to_pprof)
    File.binwrite(n = File.join(@dir, "n.pb.gz"), newer.to_pprof)
    diff_html = File.join(@dir, "errdiff.html")
    assert_equal 0, Heapscope::Report::CLI.run("diff", [b, n, "--html", "-o", diff_html], out: StringIO.new, err: $stderr)
    open_page(diff_html)
    rows = eval_js("document.getElementById('hs-top').innerText").lines
    assert_match(/\+7\.8 KiB ±100 B\s+LeakyCache#store/, rows.find { |l| l.include?("LeakyCache#store") })
    assert_match(/-3\.9 KiB ±2\.0 KiB noise\s+Shrinker#go/, rows.find { |l| l.include?("Shrinker#go") })
    mouse("mouseMoved", rect_of("LeakyCache#store"))
    assert_includes eval_js("document.getElementById('hs-tip').textContent"), "(+7.8 KiB ±100 B)"
    assert_no_console_errors
  end

  # Issue 11 item 11: "<!--<script>" in a frame name used to put the HTML parser into its "script data
  # double escaped" state, so the data script swallowed the rest of the page and nothing was drawn.
  # Names that try to end the script, inject markup or break JavaScript strings must show as text.
  def test_hostile_names_render_as_text
    names = ["<!--<script>", "</script><img src=x onerror=window.hsOwned=1>", "sep\u2028line\u2029para", "&lt;b&gt;\"'"]
    stack = names.each_with_index.map { |n, i| [n, "app/h.rb", i + 1] } + [["main", "app/main.rb", 1]]
    profile = File.join(@dir, "<i>hostile&amp;.pb.gz")
    File.binwrite(profile, heapscope_profile([[stack, [10, 1000, 10, 1000]], [[["Other#site", "o.rb", 2]], [1, 100, 1, 100]]]).to_pprof)
    html = File.join(@dir, "hostile.html")
    assert_equal 0, Heapscope::Report::CLI.run("flamegraph", [profile, "-o", html], out: StringIO.new, err: $stderr)
    open_page(html)
    drawn = eval_js("Array.from(document.querySelectorAll('#hs-svg g')).map(g => g.getAttribute('data-name'))")
    names.each { |n| assert_includes drawn, n, "#{n.inspect} is drawn, by its own name" }
    top = eval_js("document.getElementById('hs-top').textContent")
    assert_includes top, names[0]
    assert_equal 0, eval_js("document.querySelectorAll('img').length"), "no markup from a name"
    assert_nil eval_js("window.hsOwned"), "no script from a name"
    assert_equal "heapscope flame graph: <i>hostile&amp;.pb.gz", eval_js("document.querySelector('h1').textContent")
    assert_includes eval_js("document.getElementById('hs-status').textContent"), "inuse_space: total 1.1 KiB"
    box = rect_of(names[0])
    mouse("mouseMoved", box)
    assert_includes eval_js("document.getElementById('hs-tip').textContent"), names[0]
    assert_no_console_errors
  end

  # 50k samples with distinct stacks: the generator aggregates, the page draws in well under a second.
  def test_large_profile_stays_responsive
    prof = Pprof::Profile.new(sample_types: HEAPSCOPE_TYPES, comments: ["sample_every=1"])
    rng = Random.new(42)
    50_000.times do |i|
      frames = [["leaf#{i % 5000}", "gen.rb", i % 97 + 1], ["mid#{i % 300}", "gen.rb", 200 + i % 7],
                ["svc#{i % 20}", "svc.rb", 10], ["main", "main.rb", 1]]
      v = rng.rand(1..1000)
      prof.add_sample(frames: frames, values: [1, v, 1, v], labels: { "class" => "String", "gc_age" => i % 3 })
    end
    path = File.join(@dir, "big.pb.gz")
    File.binwrite(path, prof.to_pprof)
    html = File.join(@dir, "big.html")
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    assert_equal 0, Heapscope::Report::CLI.run("flamegraph", [path, "-o", html], out: StringIO.new, err: $stderr)
    gen = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
    assert_operator gen, :<, 20, "generating the page took #{gen.round(1)} s"
    assert_operator File.size(html), :<, 8 * 1024 * 1024
    open_page(html)
    ms = eval_js(<<~JS)
      (function(){var s=document.getElementById('hs-type'), t=performance.now();
        s.value='1'; s.dispatchEvent(new Event('change')); s.value='3'; s.dispatchEvent(new Event('change'));
        return (performance.now()-t)/2;})()
    JS
    assert_operator ms, :<, 1000, "a redraw took #{ms.round} ms"
    assert_operator eval_js("document.querySelectorAll('#hs-svg g').length"), :>, 20
    assert_no_console_errors
  end

  private

  # Number of distinct RGB colours in a PNG (8-bit RGB or RGBA, non-interlaced, as Chromium writes).
  def png_colors(png)
    raise "not a PNG" unless png.start_with?("\x89PNG".b)

    pos = 8
    idat = +"".b
    width = height = bpp = nil
    while pos < png.bytesize
      len, type = png.byteslice(pos, 8).unpack("Na4")
      data = png.byteslice(pos + 8, len)
      if type == "IHDR"
        width, height, depth, ctype = data.unpack("NNCC")
        raise "unexpected PNG format #{depth}/#{ctype}" unless depth == 8 && [2, 6].include?(ctype)

        bpp = ctype == 6 ? 4 : 3
      end
      idat << data if type == "IDAT"
      pos += 12 + len
    end
    raw = Zlib::Inflate.inflate(idat).bytes
    stride = width * bpp
    prev = Array.new(stride, 0)
    colors = {}
    height.times do |y|
      filter = raw[y * (stride + 1)]
      line = raw[y * (stride + 1) + 1, stride]
      line.each_index do |i|
        a = i >= bpp ? line[i - bpp] : 0
        b = prev[i]
        c = i >= bpp ? prev[i - bpp] : 0
        line[i] = (line[i] + case filter
                             when 0 then 0
                             when 1 then a
                             when 2 then b
                             when 3 then (a + b) / 2
                             when 4
                               p = a + b - c
                               pa = (p - a).abs
                               pb = (p - b).abs
                               pc = (p - c).abs
                               pa <= pb && pa <= pc ? a : (pb <= pc ? b : c)
                             end) & 0xff
      end
      (0...width).step(2) { |x| colors[line[x * bpp, 3]] = true }
      prev = line
    end
    colors.size
  end
end
