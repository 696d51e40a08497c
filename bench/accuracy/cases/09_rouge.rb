# frozen_string_literal: true

module Accuracy
  module Cases
    # rouge (a pure-Ruby syntax highlighter from the registry) lexing Ruby source and formatting it as
    # HTML: each step highlights a few of rouge's own source files (real code, the same in every
    # process); the token lists and HTML of the last steps are kept, as a cache of highlighted files would.
    class Rouge < LibraryCase
      register "rouge", "rouge lexing and highlighting Ruby source files as HTML, the last results kept"

      FILES_PER_STEP = 6
      KEPT = 8

      def gems
        %w[rouge]
      end

      def iterations
        scaled(12)
      end

      def setup
        LibraryCase.require_gems("rouge")
        dir = File.join(Gem.loaded_specs.fetch("rouge").full_gem_path, "lib")
        @sources = Dir[File.join(dir, "rouge", "**", "*.rb")].sort.map { |f| File.read(f) }.select { |s| s.bytesize > 4_000 }
        @lexer = ::Rouge::Lexers::Ruby.new
        @formatter = ::Rouge::Formatters::HTML.new
        @formatter.format(@lexer.lex(@sources.first)) # loads what rouge loads lazily
        @kept = Array.new(KEPT)
      end

      def step(i)
        @kept[i % KEPT] = Array.new(FILES_PER_STEP) do |k|
          source = @sources[(i * FILES_PER_STEP + k) % @sources.size]
          tokens = @lexer.lex(source).to_a
          [tokens, @formatter.format(tokens.each)]
        end
      end
    end
  end
end
