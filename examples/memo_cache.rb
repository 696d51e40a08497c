# frozen_string_literal: true

# The leak hunt of docs/leak-hunting.md: a memoizing cache that never evicts (four leaking lines:
# a ~1.5 KB String, an Array of 12 Strings, a Hash, the key Array), plus request garbage and a
# bounded cache as distractors. Default settings; one heap snapshot per round into DIR, as the
# periodic writer would, then the retainers of the line given (if any), as an operator would ask.
#
#   ruby -Ilib examples/memo_cache.rb DIR [ROUNDS] [FILE:LINE]
#   heapscope leaks DIR
#
# MEMO_AUTO_FOCUS=0 turns automatic focus off (to compare: lib/heapscope/auto_focus.rb);
# MEMO_PER_ROUND sets the requests per round (default 2000: each leaks one cache entry).
require "heapscope"

class QuoteCache
  def initialize
    @memo = {}
  end

  # Memoizes a quote by its request parameters, forever.
  def quote(customer, product, region)
    key = [customer, product, region]                                   # the key Array
    @memo[key] ||= {                                                    # the Hash
      text: "quote for #{customer}/#{product}/#{region}: " + "x" * 1500, # the String
      lines: Array.new(12) { |i| "line #{i} of #{product}" },          # the Array of 12 Strings
    }
  end
end

# Keeps the last 2,000 entries: grows at first, then holds still.
class RecentSearches
  def initialize
    @recent = {}
  end

  def add(term)
    @recent[term] = "results for #{term}" * 4
    @recent.shift if @recent.size > 2000
  end
end

def handle(cache, searches, i)
  params = { "customer" => "c#{i}", "product" => "p#{i % 97}", "region" => "r#{i % 5}" } # garbage
  cache.quote(params["customer"], params["product"], params["region"])
  searches.add("term-#{i % 5000}")
  "response #{i}" * 10                                                 # garbage
end

dir = ARGV[0] or abort "usage: ruby -Ilib examples/memo_cache.rb DIR [ROUNDS] [FILE:LINE]"
rounds = Integer(ARGV[1] || 7)
Heapscope.start(auto_focus: ENV["MEMO_AUTO_FOCUS"] != "0")
cache = QuoteCache.new
searches = RecentSearches.new
i = 0
per_round = Integer(ENV["MEMO_PER_ROUND"] || 2_000)
rounds.times do |round|
  per_round.times do
    handle(cache, searches, i)
    i += 1
  end
  Heapscope.write(File.join(dir, format("memo-%02d.heap.pb.gz", round)), gc: true)
  sleep 1
end
if ARGV[2]
  require "heapscope/retainers"
  puts Heapscope::Retainers.text(Heapscope.retainers(ARGV[2], limit: 3, keys: false))
end
