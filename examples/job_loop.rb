# frozen_string_literal: true

# A job runner's loop under heapscope, in plain Ruby. Sidekiq and other runners take the same three
# steps (docs/surfaces.md, "Job runners"): start once when the worker boots, write profiles from a
# background thread, write a final one at shutdown. One job class leaks; its line is the top live site.
#
#   ruby -Ilib examples/job_loop.rb [DIR] [JOBS] [SAMPLING]
#   heapscope top DIR/jobs-*-final.heap.pb.gz
require "heapscope"

dir = ARGV[0] || "heapscope-profiles"
jobs = Integer(ARGV[1] || 20_000)
options = { sample_every: 100 }
options[:sampling] = ARGV[2].to_sym if ARGV[2] # windowed or always; default: the Ruby's default

# 1. At boot.
Heapscope.start(**options)
writer = Heapscope::PeriodicWriter.new(dir: dir, interval: 5, app_name: "jobs").start

# 3. At shutdown (Sidekiq: config.on(:shutdown)).
at_exit do
  writer.stop
  path, error = writer.write_final
  puts(error ? "final profile not written: #{error.message}" : "final profile: #{path}")
end

class ResizeImage
  def perform(id)
    Array.new(40) { |i| "pixel #{id}/#{i}" }.size # garbage: dies with the job
  end
end

class AuditLog
  ENTRIES = []

  def perform(id)
    ENTRIES << "audit entry #{id} " * 4 # JOB LEAK: every entry is kept forever
  end
end

# 2. The runner's loop: a queue and a worker thread.
queue = Queue.new
worker = Thread.new do
  while (job = queue.pop)
    klass, arg = job
    # Which job made it: each job's samples carry job=<its class> (go tool pprof -tagfocus job=AuditLog).
    Heapscope.with_labels(job: klass.name) { klass.new.perform(arg) }
  end
end
jobs.times { |i| queue << [i.even? ? ResizeImage : AuditLog, i] }
queue << nil
worker.join
puts "ran #{jobs} jobs, #{AuditLog::ENTRIES.size} audit entries kept"
