# frozen_string_literal: true

module Accuracy
  module Cases
    # A cache of a hundred 20 KB Strings (rendered pages, say) beside many small objects: 2 MB in 100
    # objects, which sampling by allocation count sees 0.1 times a run at sample_every 1000. Issue 31:
    # such objects are all-or-nothing in every mode (absent from most profiles, 20 MB when sampled), and
    # what the profile must then say is where the missing bytes went: the class's census row, "not seen
    # at any site", with an error that covers them.
    class BigStrings < SyntheticCase
      register "big_strings", "a cache of a hundred 20 KB Strings beside many small objects"
      judge_ratio false # as threads_fibers: its rings of small objects are the last 3% of a dense run

      SMALL = 1_200_000
      BIG = 100

      def setup
        @fill = Array.new(97) { |n| ("b" * n).freeze }
        @pages = Array.new(4) { |i| ("<p>#{i}</p>" * 2_000)[0, 20_000 + 97 * i].freeze }
        @page = site(:cached_page, String) { |k, n| k.new << @pages[n] }
        @text = site(:small_text, String) { |k, n| k.new << @fill[n] }
        @pair = site(:small_pair, Array) { |k, n| k.new(n) }
      end

      def work
        @cache = []
        @texts = Array.new(40_000)
        @pairs = Array.new(15_000)
        n = scaled(SMALL)
        every = n / (BIG + 1)
        n.times do |i|
          if (i % 4).zero?
            @pairs[i % @pairs.size] = @pair.make(2)
          else
            @texts[i % @texts.size] = @text.make(i % 97)
          end
          @cache << @page.make(@cache.size % 4) if (i % every).zero? && i.positive? && @cache.size < BIG
        end
      end
    end
  end
end
