# frozen_string_literal: true

# What focusing classes buys on the accuracy suite (issue 32's acceptance): two results files of
# bench/accuracy/run over the same cases, one without --focus and one with it, compared row by row.
#
#   bench/accuracy/run --cases lifetimes --runs 40 --json tmp/plain.json --no-fail
#   bench/accuracy/run --cases lifetimes --runs 40 --focus Accuracy::Sites::FifoValue=25 --json tmp/focused.json --no-fail
#   ruby -Ilib bench/accuracy/compare.rb tmp/plain.json tmp/focused.json
#
# For every row judged in both runs, per mode: the focused run's z (unbiased: |z| <= 4) and the spread
# ratio, unfocused spread / focused spread. A focused class's rows must narrow by at least 0.8 x
# sqrt(sample_every / rate) (stratified sampling's promise, within 20%); in windowed mode the rate in
# force is no denser than 1 / window_share (docs/configuration.md, focus), and windows add clustering a
# denser rate cannot remove, so the windowed ratio is reported beside the promise, judged only under
# :always. Other classes' rows should be unchanged: their ratio is reported (with 40 runs two spreads of
# one sampler differ by up to about 1.4x by chance alone). Exit 1 when a judged criterion fails.
require "json"
require_relative "stats"

plain_path, focused_path = ARGV
abort "usage: compare.rb PLAIN.json FOCUSED.json" unless focused_path
plain = JSON.parse(File.read(plain_path))
focused = JSON.parse(File.read(focused_path))
focus = focused.dig("plan", "focus") or abort "compare.rb: #{focused_path} was run without --focus"
rates = focus.split(",").to_h { |pair| name, rate = pair.split("="); [name.strip, Integer(rate)] }
every = focused.dig("plan", "sample_every")
abort "compare.rb: the two runs differ in sample_every" unless plain.dig("plan", "sample_every") == every

class_of = ->(row) { row["name"] && "Accuracy::Sites::#{row["name"].split("_").map(&:capitalize).join}" }
failures = []
puts "focus #{focus}, sample_every #{every}; #{focused.dig("plan", "ruby")}"
puts format("%-34s %-14s %-8s %7s %7s %8s %8s  %s", "site", "type", "mode", "z", "spread", "ratio", "promise", "verdict")
focused["cases"].each do |fc|
  pc = plain["cases"].find { |c| c["case"] == fc["case"] } or next
  fc["rows"].each do |fr|
    next unless fr["judged"]

    pr = pc["rows"].find { |r| r["site"] == fr["site"] && r["type"] == fr["type"] }
    next unless pr && pr["judged"]

    rate = rates[class_of.(fr)]
    %w[default always].each do |mode|
      f = fr[mode]
      p = pr[mode]
      ratio = f["spread"].to_f.positive? ? p["spread"].to_f / f["spread"] : nil
      promise = rate ? Math.sqrt(every.fdiv(rate)) : 1.0
      verdict = []
      verdict << "biased" unless Accuracy::Stats.z_ok?(f)
      if rate && mode == "always" && (ratio.nil? || ratio < 0.8 * promise)
        verdict << "narrowed less than 0.8 x sqrt(#{every}/#{rate})"
      end
      failures << "#{fr["name"]} #{fr["type"]} #{mode}: #{verdict.join(", ")}" unless verdict.empty?
      label = "#{fr["name"]}#{rate ? " (focused 1 in #{rate})" : ""}"
      puts format("%-34s %-14s %-8s %7s %6.0f%% %8s %8.2f  %s", label, fr["type"], mode,
                  f["z"] ? format("%+.1f", f["z"]) : "inf", 100 * f["spread"].to_f, ratio ? format("%.2f", ratio) : "-",
                  promise, verdict.empty? ? "ok" : "FAIL #{verdict.join(", ")}")
    end
  end
end
puts failures.empty? ? "every judged criterion passed" : "#{failures.size} FAILED"
exit(failures.empty? ? 0 : 1)
