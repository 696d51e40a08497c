# frozen_string_literal: true

require "json"

# mixed: a JSON-like build/serialize loop: hashes, arrays and strings of several sizes built into records,
# a page of records serialized with JSON.generate, the way an API endpoint spends its allocations.
module Bench
  module Mixed
    TAGS = %w[ruby heap profiler pprof gc sample].freeze

    def self.record(i)
      {
        "id" => i,
        "name" => "user-#{i}",
        "email" => "user#{i}@example.com",
        "score" => i * 0.5,
        "active" => i.even?,
        "tags" => TAGS.first(1 + (i % TAGS.size)).map { |t| "#{t}:#{i % 7}" },
        "address" => { "street" => "#{i} Main St", "city" => "Springfield", "zip" => format("%05d", i % 99_999) },
        "history" => Array.new(i % 4) { |k| { "at" => 1_700_000_000 + k, "event" => "login" } },
      }
    end

    def self.page(first, count)
      records = Array.new(count) { |k| record(first + k) }
      JSON.generate({ "data" => records, "next" => first + count, "total" => count })
    end
  end
end

Bench::Workloads.define(:mixed, sizes: { full: 2_000, quick: 150, callgrind: 300 },
                                summary: "build 50-record pages of hashes/arrays/strings, JSON.generate each") do |n|
  bytes = 0
  n.times { |p| bytes += Bench::Mixed.page(p * 50, 50).bytesize }
  bytes
end
