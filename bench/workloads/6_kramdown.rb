# frozen_string_literal: true

require_relative "../markdown_docs"

# kramdown: a real library doing real work. The kramdown gem (pure Ruby, from the registry; the Gemfile's
# bench group) parses Markdown documents of about 10 KB (headers, paragraphs with emphasis, links and code
# spans, lists, code blocks, tables, block quotes) and renders each to HTML; the trees and HTML of the last
# 4 stay alive, as a cache of rendered pages would. The allocation sites, stack depths and object mix are
# kramdown's, not ours. The documents are generated from a fixed seed before the measured region.
module Bench
  module Kramdown
    WORDS = %w[heap profile sample window object ruby garbage collector thread fiber string array hash
               allocation live site stride interval estimate weight].freeze
    DOCS = 4
    KEPT = 4

    class << self
      attr_reader :docs

      # Loads the gem and builds the inputs (bench/cell.rb calls this before the warm-up). kramdown is a
      # system gem on some machines and only in the bundle (bench group) on others: plain require first.
      def prepare
        begin
          require "kramdown"
        rescue LoadError
          require "bundler"
          ENV["BUNDLE_GEMFILE"] ||= File.expand_path("../../Gemfile", __dir__)
          Bundler.setup(:default, :bench)
          require "kramdown"
        end
        @docs = Array.new(DOCS) { |i| markdown(i) }
      end

      # The same i gives the same text in every process.
      def markdown(i, sections: 20)
        MarkdownDocs.document(i, sections: sections, seed: 7 + i, words: WORDS, emphasis_one_in: 8)
      end
    end
  end
end

Bench::Workloads.define(:kramdown, sizes: { full: 20, quick: 4, callgrind: 60 },
                                   summary: "the kramdown gem: parse 10 KB Markdown documents and render them to HTML, the last 4 kept",
                                   prepare: -> { Bench::Kramdown.prepare }) do |n|
  kept = Array.new(Bench::Kramdown::KEPT)
  n.times do |i|
    doc = ::Kramdown::Document.new(Bench::Kramdown.docs[i % Bench::Kramdown::DOCS])
    kept[i % Bench::Kramdown::KEPT] = [doc, doc.to_html]
  end
  kept
end
