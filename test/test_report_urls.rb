# frozen_string_literal: true

require_relative "test_http_helper"
require "stringio"
require "heapscope/surfaces/http_server"
require "heapscope/report/cli"
require_relative "support/hostile_server"

# Issue 33, item 2: top, diff, leaks and flamegraph read http(s) URLs wherever they read a file
# (lib/heapscope/report/profile_url.rb): against the standalone listener (with and without a token,
# in this process with a fake source, and a real profiled child), and against hostile servers, each
# of which must end in one line on stderr, exit 2, within the --timeout given (checked in a child
# running exe/heapscope, with its peak RSS).
class TestReportUrls < Minitest::Test
  include SurfacesTestHelper
  include HostileServer

  TOKEN = "url-reader-token-0123456789"
  EXE = File.join(ROOT, "exe", "heapscope")
  # Peak RSS (KiB) of the exe/heapscope child, written when it exits.
  PROBE = 'at_exit { File.write(ENV.fetch("HS_PROBE"), File.read("/proc/self/status")[/VmHWM:\s*(\d+)/, 1]) }; ' \
          "$0 = ARGV.shift; load $0"
  Result = Struct.new(:status, :out, :err, :seconds, :rss_mb)

  def setup
    @tmp = Dir.mktmpdir("heapscope-urls")
    @servers = []
  end

  def teardown
    @servers.each(&:stop)
    stop_hostile_servers
    reap_children
    FileUtils.rm_rf(@tmp)
  end

  # --- a live listener --------------------------------------------------------------------------

  def test_top_diff_leaks_and_flamegraph_read_the_listener
    port = serve.port
    heap = "http://127.0.0.1:#{port}/debug/pprof/heap"

    status, out, err = cli("top", heap)
    assert_equal [0, ""], [status, err]
    assert_includes out, "File: #{heap}"
    assert_match(/^\s*\S+ \S+\s+\d.*leak app\.rb:12$/, out)
    # A bare server, and its /debug/pprof, mean the heap profile (as `go tool pprof HOST:PORT` means one).
    ["http://127.0.0.1:#{port}", "http://127.0.0.1:#{port}/debug/pprof/"].each do |url|
      status, out, err = cli("top", url, "--json")
      assert_equal [0, ""], [status, err], url
      assert_includes JSON.parse(out)["entries"].map { |e| e["function"] }, "leak", url
    end

    # The fake source grows the leak by 100 bytes a call: each fetch is a new snapshot.
    status, out, err = cli("diff", heap, heap, "--json")
    assert_equal [0, ""], [status, err]
    grew = JSON.parse(out)["grew"].first
    assert_equal ["leak app.rb:12", 100], [grew["name"], grew["change"]]

    status, out, err = cli("leaks", heap, heap, heap, "--json")
    assert_equal [0, ""], [status, err]
    data = JSON.parse(out)
    assert_equal [heap] * 3, data["profiles"].map { |p| p["file"] }
    assert_equal "leak app.rb:12", data["sites"].first["name"]

    page = File.join(@tmp, "heap.html")
    status, out, err = cli("flamegraph", heap, "-o", page)
    assert_equal [0, ""], [status, err]
    assert_match(/\Awrote #{Regexp.escape(page)} \(\d+ KiB\)\n\z/, out)
    assert_includes File.read(page), "app.rb"
    # Without -o, the page is named after the server and the profile, in the current directory.
    Dir.chdir(@tmp) do
      assert_equal 0, cli("flamegraph", heap).first
      assert File.file?("127.0.0.1_#{port}-heap.html")
      assert_equal 0, cli("diff", heap, heap, "--html").first
      assert File.file?("127.0.0.1_#{port}-heap-diff.html")
    end
  end

  def test_the_token_comes_from_the_listeners_variable
    port = serve(token: TOKEN).port
    heap = "http://127.0.0.1:#{port}/debug/pprof/heap"
    status, out, err = cli("top", heap)
    assert_equal [2, ""], [status, out]
    assert_equal "heapscope top: #{heap}: answered 401: missing or wrong Authorization: Bearer token " \
                 "(set HEAPSCOPE_HTTP_TOKEN to the listener's token)\n", err
    status, _, err = cli("top", heap, env: { "HEAPSCOPE_HTTP_TOKEN" => "#{TOKEN}-wrong" })
    assert_equal 2, status
    assert_match(/answered 401: .*\(is HEAPSCOPE_HTTP_TOKEN the listener's token\?\)$/, err)
    status, out, err = cli("top", heap, env: { "HEAPSCOPE_HTTP_TOKEN" => TOKEN })
    assert_equal [0, ""], [status, err]
    assert_includes out, "leak app.rb:12"
    status, _, err = cli("leaks", heap, heap, "--json", env: { "HEAPSCOPE_HTTP_TOKEN" => TOKEN })
    assert_equal [0, ""], [status, err]
  end

  # user:password@ goes as Basic auth (a mount behind basic auth) and is never shown.
  def test_a_password_in_the_url_is_sent_and_hidden
    seen = []
    url = hostile_server do |c, request|
      seen << request[/^Authorization: [^\r\n]*/i]
      c.write("HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nnope\n")
    end
    status, _, err = cli("top", url.sub("http://", "http://me:s3cret@"))
    assert_equal 2, status
    assert_equal ["Authorization: Basic #{["me:s3cret"].pack("m0")}"], seen
    refute_includes err, "s3cret"
    assert_includes err, "http://me:***@127.0.0.1:"
  end

  # A real profiled process (the example service, under RUBYOPT=-rheapscope/auto) read over HTTP.
  def test_top_finds_the_leak_in_a_profiled_child
    skip_unless_native
    port = free_port
    env = ruby_env("HEAPSCOPE_HTTP" => "127.0.0.1:#{port}", "HEAPSCOPE_SAMPLE_EVERY" => "100",
                   "HEAPSCOPE_SAMPLING" => "always")
    service = File.join(ROOT, "examples/surfaces/leaky_service.rb")
    _pid, out, = spawn_child(env, RbConfig.ruby, service, "60", dir: @tmp)
    wait_for("the service to be ready") { File.read(out).include?("ready") }
    leak_line = File.readlines(service).index { |l| l.include?("# LEAK") } + 1
    r = heapscope("top", "http://127.0.0.1:#{port}/debug/pprof/heap?gc=1", "--by", "line", "-n", "3")
    assert_equal [0, ""], [r.status, r.err]
    assert_includes r.out, "leaky_service.rb:#{leak_line}"
  end

  # --- hostile servers: one line, exit 2, on time, in bounded memory ---------------------------------

  def test_hostile_servers_fail_with_one_line_on_time
    cases = {
      # Headers that never end: the deadline.
      slow_headers: [proc { |c| c.write("HTTP/1.1 200 OK\r\n"); loop { c.write("X-Drip: 1\r\n"); sleep 0.3 } },
                     /: no complete answer within 1 s \(--timeout SECONDS raises it\)\z/],
      # A body that never ends, of text: refused at its first bytes.
      endless_text: [proc { |c| c.write("HTTP/1.1 200 OK\r\n\r\n"); loop { c.write("x" * 65_536) } },
                     /: the answer is not a pprof profile \(neither gzip nor profile\.proto, starts "xxxx/],
      # A body that never ends and starts like gzip: the size limit.
      endless_gzip: [proc { |c| c.write("HTTP/1.1 200 OK\r\n\r\n\x1f\x8b".b); loop { c.write("\0" * 65_536) } },
                     /: the answer's body is over the 2 MiB limit \(--max-size SIZE raises it\)\z/],
      huge_length: [proc { |c| c.write("HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n"); sleep 30 },
                    /: the answer's body is 99999999999 bytes, over the 2 MiB limit \(--max-size SIZE raises it\)\z/],
      garbage: [proc { |c| c.write("HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n<html>hi</ht>") },
                /: the answer is not a pprof profile \(an HTML page, starts "<html>/],
      short_garbage: [proc { |c| c.write("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc") },
                      /: the answer is not a pprof profile \(neither gzip nor profile\.proto, starts "abc"/],
      server_error: [proc { |c| c.write("HTTP/1.1 500 Oops\r\nContent-Length: 11\r\n\r\nit broke\nx\n") },
                     /: answered 500: it broke\z/],
      # An error whose body never ends: its first 64 KiB are its reason.
      endless_error: [proc { |c| c.write("HTTP/1.1 503 Busy\r\n\r\nbusy now\n"); loop { c.write("y" * 65_536) } },
                      /: answered 503: busy now\z/],
      not_http: [proc { |c| c.write("SSH-2.0-OpenSSH\r\n") }, /: the answer is not HTTP: "SSH-2\.0-OpenSSH"\z/],
    }
    cases.each do |name, (answer, expected)|
      url = hostile_server { |c, _| answer.call(c) }
      %w[top flamegraph].each do |command|
        r = heapscope(command, "#{url}/debug/pprof/heap", "--timeout", "1", "--max-size", "2M",
                      *(command == "flamegraph" ? ["-o", File.join(@tmp, "x.html")] : []))
        label = "#{command} #{name}"
        assert_equal [2, ""], [r.status, r.out], "#{label}: #{r.err}"
        assert_equal 1, r.err.lines.size, "#{label}: one line: #{r.err.inspect}"
        assert_match(%r{\Aheapscope #{command}: #{Regexp.escape(url)}/debug/pprof/heap}, r.err, label)
        assert_match(expected, r.err.chomp, label)
        assert_operator r.seconds, :<, 5, label
        assert_operator r.rss_mb, :<, 150, label
      end
    end
  end

  # diff and leaks fail on their first bad URL the same way; a good file among them changes nothing.
  def test_diff_and_leaks_name_the_url_that_failed
    good = "http://127.0.0.1:#{serve.port}/debug/pprof/heap"
    bad = hostile_server { |c, _| c.write("HTTP/1.1 500 Oops\r\nContent-Length: 5\r\n\r\nbad!\n") }
    status, out, err = cli("diff", good, bad)
    assert_equal [2, "", "heapscope diff: #{bad}: answered 500: bad!\n"], [status, out, err]
    status, out, err = cli("leaks", good, good, bad)
    assert_equal [2, "", "heapscope leaks: #{bad}: answered 500: bad!\n"], [status, out, err]
    status, _, err = cli("top", "ftp://x/heap")
    assert_equal [2, "heapscope top: ftp://x/heap: no such file\n"], [status, err]
    status, _, err = cli("top", good, "--timeout", "0")
    assert_equal [2, "heapscope top: --timeout must be a positive number of seconds, got 0.0\n"], [status, err]
  end

  private

  def serve(**options)
    app = Heapscope::Rack.new(source: FakeSource.new, gc_limiter: Heapscope::Rack::GcLimiter.new)
    server = Heapscope::HttpServer.new(host: "127.0.0.1", port: 0, app: app, **options).start
    @servers << server
    server
  end

  # Runs a report in this process; returns [status, stdout, stderr]. env is set around the run.
  def cli(command, *args, env: {})
    saved = env.to_h { |k, _| [k, ENV[k]] }
    env.each { |k, v| ENV[k] = v }
    ENV.delete("HEAPSCOPE_HTTP_TOKEN") unless env.key?("HEAPSCOPE_HTTP_TOKEN")
    out = StringIO.new
    err = StringIO.new
    status = Heapscope::Report::CLI.run(command, args, out: out, err: err)
    [status, out.string, err.string]
  ensure
    saved&.each { |k, v| v.nil? ? ENV.delete(k) : ENV[k] = v }
  end

  # Runs exe/heapscope in a child (killed after 60 s); its time and peak RSS are part of the result.
  def heapscope(*args)
    probe = File.join(@tmp, "probe-#{rand(1 << 30)}")
    out = File.join(@tmp, "out-#{rand(1 << 30)}")
    err = "#{out}.err"
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    env = { "HS_PROBE" => probe, "HEAPSCOPE_HTTP_TOKEN" => nil, "http_proxy" => nil, "HTTP_PROXY" => nil }
    pid = Process.spawn(env, RbConfig.ruby, "-I#{LIB}", "-e", PROBE, EXE, *args,
                        out: out, err: err, rlimit_as: 4 << 30, pgroup: true)
    status = Timeout.timeout(60) { Process.wait2(pid).last }
    seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    Result.new(status.exitstatus, File.read(out), File.read(err), seconds, File.read(probe).to_i / 1024)
  rescue Timeout::Error
    Process.kill("KILL", -pid)
    Process.wait(pid)
    flunk "heapscope #{args.join(" ")} did not end in 60 s"
  end
end
