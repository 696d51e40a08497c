# frozen_string_literal: true

# request: request-like work under deep stacks. Each request descends 50 to 150 frames (middleware-like
# layers that each allocate a little), then renders a template-ish page: interpolation, escaping, joins.
# A sampling profiler pays for the stack walk on every sample here.
module Bench
  module Request
    ITEMS = Array.new(20) { |i| { title: "Item <#{i}> & co", price: i * 3 + 1, tags: %w[a b c].first(1 + i % 3) } }.freeze
    ESCAPES = { "&" => "&amp;", "<" => "&lt;", ">" => "&gt;", '"' => "&quot;" }.freeze

    def self.escape(s)
      s.gsub(/[&<>"]/, ESCAPES)
    end

    def self.render(req)
      out = +"<html><head><title>Page #{req[:id]}</title></head><body>\n<ul>\n"
      ITEMS.each do |item|
        out << "  <li class=\"item\">" << escape(item[:title]) << " - $" << item[:price].to_s
        out << " [" << item[:tags].join(", ") << "]</li>\n"
      end
      out << "</ul>\n<p>user=#{escape(req[:user])} path=#{req[:path]}</p></body></html>\n"
      out
    end

    # One layer of the "middleware stack": allocates an env copy entry, then calls the next layer.
    def self.layer(req, depth)
      env = { depth: depth, name: "layer#{depth}" }
      return [200, env, render(req)] if depth.zero?

      status, _env, body = layer(req, depth - 1)
      [status, env, body]
    end

    def self.call(i)
      req = { id: i, user: "u<#{i % 13}>", path: "/items/#{i}" }
      layer(req, 50 + (i * 37) % 101) # 50..150 frames deep
    end
  end
end

Bench::Workloads.define(:request, sizes: { full: 3_000, quick: 250, callgrind: 300 },
                                  summary: "50-150 frame deep call chains, each ending in template string building") do |n|
  bytes = 0
  n.times { |i| bytes += Bench::Request.call(i)[2].bytesize }
  bytes
end
