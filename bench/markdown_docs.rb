# frozen_string_literal: true

# Deterministic Markdown documents for the kramdown workloads (bench/workloads/6_kramdown.rb, the cost
# benchmark, and bench/accuracy/cases/08_kramdown.rb, the accuracy case): headers, paragraphs with
# emphasis, links and code spans, lists, code blocks, tables and block quotes. The same arguments give
# the same text in every process.
module MarkdownDocs
  module_function

  # Document number i: `sections` sections of words drawn from `words` by Random.new(seed), one word
  # in `emphasis_one_in` emphasised.
  def document(i, sections:, seed:, words:, emphasis_one_in:)
    rng = Random.new(seed)
    pick = ->(n) { Array.new(n) { w = words[rng.rand(words.size)]; rng.rand(emphasis_one_in).zero? ? "*#{w}*" : w }.join(" ") }
    out = +"# Document #{i}\n\n"
    sections.times do |s|
      out << "## Section #{s}: #{pick.(3)}\n\n"
      out << pick.(40) << " [a link](https://example.com/#{i}/#{s}) and `code #{s}`, **#{pick.(2)}**.\n\n"
      out << Array.new(4) { |k| "- item #{k}: #{pick.(6)}\n" }.join << "\n" if (s % 3).zero?
      out << "    def step_#{s}(x)\n      x * #{s}\n    end\n\n" if s % 4 == 1
      out << "| a | b | c |\n|---|---|---|\n" << Array.new(3) { |r| "| #{r} | #{pick.(2)} | #{s} |\n" }.join << "\n" if s % 5 == 2
      out << "> #{pick.(15)}\n\n" if s % 6 == 3
    end
    out
  end
end
