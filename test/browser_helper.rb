# frozen_string_literal: true

# A headless Chromium for the tests that open a flame graph page (test_report_flamegraph.rb,
# test_report_labels.rb): CDP, a small Chrome DevTools protocol client over TCPSocket (stdlib only), and
# BrowserHelper, which starts one browser per test and drives the page (navigate, evaluate, mouse, keys).
# Holds no tests itself.

require "socket"
require "json"
require "uri"
require "timeout"
require "tmpdir"
require "fileutils"

# CDP is a minimal Chrome DevTools protocol client: one websocket to the browser, flat sessions per page.
class CDP
  attr_reader :events

  def initialize(ws_url)
    uri = URI(ws_url)
    @sock = TCPSocket.new(uri.host, uri.port)
    key = [Random.bytes(16)].pack("m0")
    @sock.write("GET #{uri.path} HTTP/1.1\r\nHost: #{uri.host}:#{uri.port}\r\nUpgrade: websocket\r\n" \
                "Connection: Upgrade\r\nSec-WebSocket-Key: #{key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
    status = @sock.gets
    raise "websocket handshake failed: #{status.inspect}" unless status&.include?(" 101 ")

    loop { break if @sock.gets == "\r\n" }
    @next_id = 0
    @events = []
  end

  # Sends a command and waits for its result (raising on a protocol error); events seen meanwhile are kept.
  def call(method, params = {}, session: nil, timeout: 20)
    id = (@next_id += 1)
    msg = { id: id, method: method, params: params }
    msg[:sessionId] = session if session
    send_text(JSON.generate(msg))
    deadline = now + timeout
    loop do
      m = JSON.parse(read_message(deadline))
      if m["id"] == id
        raise "#{method} failed: #{m["error"].inspect}" if m["error"]

        return m["result"]
      end
      @events << m
    end
  end

  # Waits for an event by name (already received or still to come).
  def wait_event(name, timeout: 20)
    deadline = now + timeout
    loop do
      i = @events.index { |e| e["method"] == name }
      return @events.delete_at(i) if i

      @events << JSON.parse(read_message(deadline))
    end
  end

  def close
    @sock.close
  rescue IOError
    nil
  end

  private

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # Client frames are masked (RFC 6455 5.3).
  def send_text(text)
    data = text.b
    mask = Random.bytes(4)
    len = data.bytesize
    head = if len < 126 then [0x81, 0x80 | len].pack("CC")
           elsif len < 65_536 then [0x81, 0x80 | 126, len].pack("CCn")
           else [0x81, 0x80 | 127, len].pack("CCQ>")
           end
    masked = data.bytes.each_with_index.map { |b, i| b ^ mask.getbyte(i & 3) }.pack("C*")
    @sock.write(head + mask + masked)
  end

  # Reads one whole message (joining fragments), answering pings.
  def read_message(deadline)
    payload = +"".b
    loop do
      b0, b1 = read_exact(2, deadline).unpack("CC")
      len = b1 & 0x7f
      if len == 126
        len = read_exact(2, deadline).unpack1("n")
      elsif len == 127
        len = read_exact(8, deadline).unpack1("Q>")
      end
      mask = (b1 & 0x80).zero? ? nil : read_exact(4, deadline)
      data = read_exact(len, deadline)
      data = data.bytes.each_with_index.map { |b, i| b ^ mask.getbyte(i & 3) }.pack("C*") if mask
      case b0 & 0x0f
      when 0x8 then raise "the browser closed the websocket"
      when 0x9 then next # ping: Chromium does not send them to clients; ignore if it does
      when 0xa then next
      end
      payload << data
      return payload.force_encoding(Encoding::UTF_8) if (b0 & 0x80).positive?
    end
  end

  def read_exact(n, deadline)
    buf = +"".b
    while buf.bytesize < n
      left = deadline - now
      raise "timed out waiting for the browser" if left <= 0 || !IO.select([@sock], nil, nil, left)

      chunk = @sock.read_nonblock(n - buf.bytesize, exception: false)
      raise "the browser closed the connection" if chunk.nil?

      buf << chunk unless chunk == :wait_readable
    end
    buf
  end
end

# Included by a Minitest::Test whose setup calls start_browser(BrowserHelper.chromium) (the test sets
# @dir first; the browser's log goes there) and whose teardown calls stop_browser.
module BrowserHelper
  CHROMIUM_FLAGS = %w[--headless --no-sandbox --disable-gpu --disable-background-networking
                      --disable-component-update --disable-sync --no-first-run --mute-audio
                      --remote-debugging-port=0 --window-size=1200,800].freeze

  # Finds chromium, installing Debian's package when missing and root (as bin/setup would).
  def self.chromium
    @chromium ||= begin
      find = -> { %w[chromium chromium-browser].map { |c| `command -v #{c} 2>/dev/null`.strip }.find { |p| !p.empty? } }
      path = find.call
      if path.nil? && Process.uid.zero?
        system({ "DEBIAN_FRONTEND" => "noninteractive" }, "apt-get install -y -qq chromium",
               out: File::NULL, err: File::NULL)
        path = find.call
      end
      path
    end
  end

  private

  def start_browser(path)
    @profile_dir = Dir.mktmpdir("heapscope-chromium")
    @log = File.join(@dir, "chromium.log")
    @pid = Process.spawn(path, *CHROMIUM_FLAGS, "--user-data-dir=#{@profile_dir}", "about:blank",
                         out: File::NULL, err: @log, pgroup: true)
    url = nil
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
    until url
      flunk "chromium did not start:\n#{File.read(@log)}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      sleep 0.1
      url = File.read(@log)[%r{DevTools listening on (ws://\S+)}, 1] if File.exist?(@log)
    end
    @cdp = CDP.new(url)
    target = @cdp.call("Target.createTarget", { url: "about:blank" })["targetId"]
    @session = @cdp.call("Target.attachToTarget", { targetId: target, flatten: true })["sessionId"]
    %w[Page.enable Runtime.enable Log.enable].each { |m| @cdp.call(m, {}, session: @session) }
    @cdp.call("Emulation.setDeviceMetricsOverride", { width: 1200, height: 800, deviceScaleFactor: 1, mobile: false },
              session: @session)
  end

  def stop_browser
    @cdp&.call("Browser.close", {}, timeout: 5)
  rescue StandardError
    nil
  ensure
    @cdp&.close
    if @pid
      begin
        Timeout.timeout(5) { Process.wait(@pid) }
      rescue Timeout::Error
        Process.kill("KILL", -@pid) # the process group we created for it
        Process.wait(@pid)
      rescue Errno::ECHILD
        nil
      end
    end
    FileUtils.rm_rf(@profile_dir) if @profile_dir
  end

  def open_page(path)
    @cdp.events.clear
    @cdp.call("Page.navigate", { url: "file://#{path}" }, session: @session)
    @cdp.wait_event("Page.loadEventFired")
  end

  def eval_js(expr)
    r = @cdp.call("Runtime.evaluate", { expression: expr, returnByValue: true }, session: @session)
    raise "JS failed: #{r["exceptionDetails"].inspect}" if r["exceptionDetails"]

    r["result"]["value"]
  end

  # [x, y, width, height] of the first drawn frame of a function.
  def rect_of(name)
    r = eval_js("(function(){var g=document.querySelector('#hs-svg g[data-name=\"#{name}\"]');if(!g)return null;" \
                "var r=g.querySelector('rect').getBoundingClientRect();return [r.x,r.y,r.width,r.height]})()")
    assert r, "#{name} is not drawn"
    r
  end

  def mouse(type, box, click: 0)
    params = { type: type, x: box[0] + box[2] / 2, y: box[1] + box[3] / 2 }
    params.merge!(button: "left", clickCount: click) if click.positive?
    @cdp.call("Input.dispatchMouseEvent", params, session: @session)
  end

  def key(name)
    %w[keyDown keyUp].each do |t|
      @cdp.call("Input.dispatchKeyEvent", { type: t, key: name, code: name, windowsVirtualKeyCode: 27 }, session: @session)
    end
  end

  def assert_no_console_errors
    errors = @cdp.events.select do |e|
      e["method"] == "Runtime.exceptionThrown" ||
        (e["method"] == "Runtime.consoleAPICalled" && %w[error assert].include?(e.dig("params", "type"))) ||
        (e["method"] == "Log.entryAdded" && e.dig("params", "entry", "level") == "error")
    end
    assert_empty errors, "console errors: #{errors.map { |e| e["params"].inspect[0, 300] }.join("\n")}"
  end
end
