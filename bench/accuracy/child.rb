# frozen_string_literal: true

# One job of the accuracy suite, in a fresh process (bench/accuracy/run starts these; see README.md):
#
#   ruby -Ilib bench/accuracy/child.rb WORKDIR JOB CASE MODE RUN
#
# MODE default: Heapscope.start(sample_every: S), the default sampling; always: the same with
# sampling: :always. Either runs the case, writes the profile (gc: true), and writes
# WORKDIR/runs/CASE.MODE.RUN.json: the estimates per site (estimates.rb), the truth when the case
# counts its own, the case's notes and heapscope's stats. MODE trace: the truth of a library case
# (trace.rb), into WORKDIR/truth/CASE.json. Settings come from WORKDIR/plan.json.
require "json"
require "fileutils"
require "heapscope"
require_relative "case"
require_relative "estimates"
require_relative "trace"

def measure(kase, mode, plan, profile_path)
  t0 = Accuracy.now
  kase.setup
  options = { sample_every: plan["sample_every"] }
  # An explicit sample_every turns the overhead budget off ("exact means exact"), so the default mode is
  # given heapscope's default budget back: it is what sets the window share (window_share: :budget) and
  # may lower the rate, as in a user's Heapscope.start. :always stays at its fixed rate, a baseline no
  # budget thins. --max-overhead gives both modes its value.
  options[:max_overhead] = Heapscope::START_DEFAULTS[:max_overhead] if mode == "default"
  options[:sampling] = :always if mode == "always"
  options[:window_share] = plan["window_share"] == "budget" ? :budget : plan["window_share"] if plan["window_share"] && mode != "always"
  options[:max_overhead] = plan["max_overhead"] == "off" ? nil : plan["max_overhead"] if plan["max_overhead"]
  options[:focus] = plan["focus"] if plan["focus"]
  GC.start(full_mark: true, immediate_sweep: true)
  t1 = Accuracy.now
  Heapscope.start(**options)
  kase.measure_work
  t2 = Accuracy.now
  Heapscope.write(profile_path, gc: true)
  # Every counter, whatever the sampler has (JSON-safe: symbols as strings, no nested surfaces).
  stats = Heapscope.stats.reject { |_, v| v.is_a?(Hash) }.to_h { |k, v| [k.to_s, v.is_a?(Symbol) ? v.to_s : v] }
  Heapscope.stop
  truth = kase.truth # after the profile's full GC: what it counted as live is what is live
  t3 = Accuracy.now
  info = kase.site_info
  estimates, describe, census = Accuracy::Estimates.read(profile_path, kase.files, label_sites: kase.label_sites,
                                                                                   classes: info.values.map { |i| i["class"] }.compact.uniq)
  # heapscope's own time (the hook's measured cost per allocation it saw, sampling, sync jobs: what the
  # overhead budget counts) as a share of the work's CPU time.
  kase.notes["own_cpu_share"] = (stats["own_ns"].to_f / 1e9 / kase.notes["work_cpu_s"]).round(4) if stats["own_ns"] && kase.notes["work_cpu_s"].to_f.positive?
  kase.notes.update("setup_s" => (t1 - t0).round(3), "profile_and_truth_s" => (t3 - t2).round(3),
                    "report_s" => (Accuracy.now - t3).round(3))
  { "truth" => truth, "names" => kase.site_names, "estimates" => estimates, "report_sampling" => describe,
    "stats" => stats, "notes" => kase.notes, "census" => census, "site_info" => info }
end

workdir, job, name, mode, run = ARGV
abort "usage: child.rb WORKDIR JOB CASE MODE RUN" unless run
plan = JSON.parse(File.read(File.join(workdir, "plan.json")))
t0 = Accuracy.now
base = "#{name}.#{mode}.#{run}"
out = mode == "trace" ? File.join(workdir, "truth", "#{name}.json") : File.join(workdir, "runs", "#{base}.json")
FileUtils.mkdir_p(File.dirname(out))
result = { "case" => name, "mode" => mode, "run" => Integer(run) }
begin
  kase = Accuracy.fetch_case(name).new(plan["scale"])
  if mode == "trace"
    result.merge!(Accuracy::Trace.run(kase))
  else
    FileUtils.mkdir_p(File.join(workdir, "profiles"))
    profile = File.join(workdir, "profiles", "#{base}.pb.gz")
    result.merge!(measure(kase, mode, plan, profile))
    File.delete(profile) unless plan["keep_profiles"]
  end
  status = 0
rescue Exception => e # whatever it was (a LoadError, a crash of the case): one line in the results
  result["error"] = "#{e.class}: #{e.message.lines.first.to_s.strip} (#{e.backtrace&.first})"
  status = 1
end
result["seconds"] = (Accuracy.now - t0).round(2)
result["cpu_s"] = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID).round(2) # boot included
json = begin
  JSON.generate(result)
rescue JSON::GeneratorError => e # a NaN somewhere: the run counts as failed, with the reason
  status = 1
  result = result.slice("case", "mode", "run", "seconds", "cpu_s").merge("error" => "result is not JSON: #{e.message[0, 200]}")
  JSON.generate(result)
end
File.write("#{out}.tmp", json)
File.rename("#{out}.tmp", out)
$stderr.puts format("[%<job>s/%<total>d] %<case>-11s %<mode>-7s run %<run>-3s %<s>6.1f s%<error>s",
                    job: job, total: plan["jobs_total"], case: name, mode: mode, run: run, s: result["seconds"],
                    error: result["error"] ? "  ERROR #{result["error"]}" : "")
exit status
