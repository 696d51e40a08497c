# frozen_string_literal: true

require_relative "../../markdown_docs"

module Accuracy
  module Cases
    # kramdown (a pure-Ruby Markdown library from the registry) parsing and rendering Markdown documents
    # to HTML: each step parses one generated document of about 100 KB (headers, paragraphs with
    # emphasis, links and code spans, lists, code blocks, tables, block quotes) and renders it; the
    # parsed trees and the HTML of the last documents are kept, as a cache of rendered pages would.
    class Kramdown < LibraryCase
      register "kramdown", "kramdown parsing and rendering 100 KB Markdown documents, the last trees kept"

      WORDS = %w[heap profile sample window object ruby garbage collector thread fiber string array hash
                 allocation live site stride interval estimate variance weight cluster record].freeze
      KEPT = 10
      DOCS = 5 # distinct documents, parsed in turn

      def gems
        %w[kramdown]
      end

      def iterations
        scaled(12)
      end

      def setup
        LibraryCase.require_gems("kramdown")
        @docs = Array.new(DOCS) { |i| markdown(i) }
        ::Kramdown::Document.new(markdown(99, sections: 8)).to_html # loads what kramdown loads lazily
        @kept = Array.new(KEPT)
      end

      def step(i)
        doc = ::Kramdown::Document.new(@docs[i % @docs.size])
        @kept[i % KEPT] = [doc, doc.to_html]
      end

      # A deterministic document: the same i gives the same text in every process.
      def markdown(i, sections: 160)
        MarkdownDocs.document(i, sections: sections, seed: 1000 + i, words: WORDS, emphasis_one_in: 9)
      end
    end
  end
end
