# frozen_string_literal: true

# bench/ui_timeline.rb: how long `heapscope ui` takes to show the timeline of a folder of PROFILES
# periodic profiles of SITES sites each (issue 33: 500 x 5,000 under 2 s). Makes the folder once
# (heapscope-style profiles, named as the periodic writer names them, one site leaking; kept under
# tmp/ for the next run), then times, in this process, from starting the server to the first complete
# GET /api/timeline answer:
#   cold  a new server whose summary cache (HEAPSCOPE_UI_CACHE, kept in tmp/ beside the folder) is
#         empty: every profile decoded once (only on the first run, or with --cold: it takes minutes)
#   warm  a new server over the same folder with its summary cache filled (the usual case: the cache
#         outlives the server)
#   again the same server asked again (the page's next poll)
#
#   bundle exec ruby -Ilib bench/ui_timeline.rb [PROFILES] [SITES] [--cold] [--no-yjit]
require "heapscope/pprof"
require "heapscope/ui/server"
require "net/http"
require "json"
require "fileutils"

# As exe/heapscope does (Ruby 3.3+), unless --no-yjit.
yjit = !ARGV.include?("--no-yjit") && defined?(RubyVM::YJIT.enable)
RubyVM::YJIT.enable if yjit

numbers = ARGV.reject { |a| a.start_with?("--") }
profiles = Integer(numbers[0] || 500)
sites = Integer(numbers[1] || 5000)
root = File.expand_path("..", __dir__)
dir = File.join(root, "tmp", "ui-bench-#{profiles}x#{sites}")
types = [%w[alloc_objects count], %w[alloc_space bytes], %w[inuse_objects count], %w[inuse_space bytes]]
start = Time.utc(2026, 1, 1).to_i

# One profile: site 0 leaks (grows each snapshot), the others hold a steady amount with some noise.
make = lambda do |k|
  prof = Heapscope::Pprof::Profile.new(sample_types: types, period_type: %w[space bytes], period: 1,
                                       time_nanos: (start + 60 * k) * 1_000_000_000,
                                       comments: ["heapscope sample_every=1000"])
  rng = Random.new(k)
  sites.times do |i|
    live = i.zero? ? 1_000 * (k + 1) : 50 + rng.rand(20)
    frames = [["Mod#{i % 97}#work#{i}", "app/mod#{i % 211}.rb", 10 + i], ["Caller#{i % 53}#run", "app/caller#{i % 53}.rb", 20],
              ["main", "app/main.rb", 1]]
    prof.add_sample(frames: frames, values: [live * 2, live * 2_000, live, live * 1_000],
                    labels: { "class" => i.odd? ? "String" : "Array", "gc_age" => 4 })
  end
  name = Time.at(start + 60 * k).utc.strftime("bench-4242-%Y%m%dT%H%M%S.000Z.heap.pb.gz")
  File.binwrite(File.join(dir, name), prof.to_pprof)
end

unless Dir.exist?(dir) && Dir.children(dir).size == profiles
  FileUtils.rm_rf(dir)
  FileUtils.mkdir_p(dir)
  t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  # Two processes, as the machine has two cores.
  pids = 2.times.map { |w| fork { (w...profiles).step(2) { |k| make.call(k) } } }
  pids.each { |pid| Process.wait(pid) }
  warn format("made %d profiles of %d sites in %s (%.1f s, %.0f KB each)", profiles, sites, dir,
              Process.clock_gettime(Process::CLOCK_MONOTONIC) - t, File.size(Dir[File.join(dir, "*")].first) / 1024.0)
end

# The summary cache is kept beside the folder: a cold run (its first, or with --cold) takes minutes.
cache = "#{dir}-cache"
FileUtils.rm_rf(cache) if ARGV.include?("--cold")
cold_run = !Dir.exist?(cache) || Dir.empty?(cache)
ENV["HEAPSCOPE_UI_CACHE"] = cache

# Seconds from starting a server to its first complete timeline, and that answer's size; and seconds
# to the first answer that spans the whole series (first and last snapshot) with at least SPAN points:
# the page draws what is summarized, so that is when a user first sees the whole shape.
SPAN = [16, profiles].min
first_view = nil
timed = lambda do |server = nil|
  t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  server ||= Heapscope::UI::Server.new(Heapscope::UI::Sources.new(folders: [dir]), port: 0).start
  body = nil
  first_view = nil
  loop do
    body = Net::HTTP.get(URI("http://127.0.0.1:#{server.http.port}/api/timeline"))
    answer = JSON.parse(body)
    times = answer["series"].first&.fetch("snapshots")&.map { |p| p["time"] } || []
    if !first_view && times.size >= SPAN && times.min == start && times.max == start + 60 * (profiles - 1)
      first_view = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
    end
    break if answer["pending"].zero?

    sleep 0.1
  end
  series = JSON.parse(body)["series"].first
  raise "expected #{profiles} snapshots, got #{series["snapshots"].size}: #{series["errors"]}" unless series["snapshots"].size == profiles
  raise "the leak is not found" unless series["leaks"].first["name"].include?("work0 ")

  [Process.clock_gettime(Process::CLOCK_MONOTONIC) - t, body.bytesize, server]
end

cold = nil
if cold_run
  cold, _, server = timed.call
  cold_view = first_view
  server.stop
end
warm, bytes, server = timed.call
again, = timed.call(server)
server.stop
rss = File.read("/proc/self/status")[/VmHWM:\s+(\d+)/, 1].to_i / 1024
puts format("%d profiles x %d sites%s: %swarm (summary cache) %.2f s, again %.2f s; timeline %d KB; peak RSS %d MiB",
            profiles, sites, yjit ? " (YJIT)" : "",
            cold ? format("cold %.1f s (whole span, %d points, at %.1f s), ", cold, SPAN, cold_view) : "",
            warm, again, bytes / 1024, rss)
