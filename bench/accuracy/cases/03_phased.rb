# frozen_string_literal: true

module Accuracy
  module Cases
    # A batch job in rounds of phases that allocate at different sites: load (records, kept through the
    # next round), transform (garbage made from the previous round's records, one in 20 of them kept for
    # good as a derived Hash), report (lines, kept until the next round's load is done). What each phase
    # keeps fills the heap at its own moments, so where GCs fall correlates with the phases.
    class Phased < SyntheticCase
      register "phased", "phases that allocate and retain at different sites"

      LOAD = 60_000
      TRANSFORM = 300_000
      REPORT = 40_000

      def setup
        @rounds = scaled(6)
        @fill = Array.new(257) { |n| ("z" * n).freeze }
        @record = site(:record, Array) { |k| k.new(3) }
        @temp = site(:transform_temp, String) { |k, n| k.new << @fill[n] }
        @derived = site(:derived, Hash) { |k, v| k[:r, v] }
        @line = site(:report_line, String) { |k, n| k.new << @fill[n] }
      end

      def work
        @derived_kept = []
        records = []
        lines = nil
        @rounds.times do |round|
          previous = records
          records = Array.new(LOAD) do |i|
            r = @record.make
            r[0] = round
            r[1] = i
            r
          end
          lines = nil # the report lines of the round before die while this round transforms
          previous.each_with_index do |r, i|
            @temp.make(20 + i % 100)
            @derived_kept << @derived.make(r[1]) if (i % 20).zero?
          end
          (TRANSFORM - LOAD).times { |i| @temp.make(20 + i % 100) }
          lines = Array.new(REPORT) { |i| @line.make(30 + i % 200) }
          previous = nil
        end
        @kept = [records, lines]
      end
    end
  end
end
