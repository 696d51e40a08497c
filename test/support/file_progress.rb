# frozen_string_literal: true

# Progress for a long suite (bin/test, issue 12): each test class starts a line naming its file and
# class, minitest's dots follow on that line, and the class's wall time ends it, so a run that takes
# minutes shows where it is and which files are slow. At the end, each skipped test says why, one line
# each: minitest prints skips' reasons only with --verbose, so "3 skips" said nothing (issue 33).
# Loaded by the Rakefile's test task (ruby -r).
require "minitest"

module Minitest
  # One line per test class: "test/test_x.rb TestX ....... 4.2 s".
  class FileProgressReporter < AbstractReporter
    def initialize(io)
      super()
      @io = io
      @current = nil
      @skips = []
    end

    def prerecord(klass, name)
      return if klass == @current

      finish_line
      file = klass.instance_method(name).source_location&.first
      file = file ? file.sub(%r{\A#{Regexp.escape(Dir.pwd)}/}, "") : "?"
      @io.print("#{file} #{klass} ")
      @io.flush
      @current = klass
      @started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    def record(result)
      return unless result.skipped?

      @skips << "#{result.klass}##{result.name}: #{result.failure.message.lines.first.to_s.chomp}"
    end

    def report
      finish_line
      return if @skips.empty?

      @io.puts("Skipped (#{@skips.size}):")
      @skips.each { |line| @io.puts("  #{line}") }
      @io.flush
    end

    private

    def finish_line
      return unless @current

      @io.print(format(" %.1f s\n", Process.clock_gettime(Process::CLOCK_MONOTONIC) - @started))
      @io.flush
      @current = nil
    end
  end

  # First among the reporters, so its last line ends before the summary prints.
  def self.plugin_heapscope_file_progress_init(options)
    reporter.reporters.unshift(FileProgressReporter.new(options[:io]))
  end
end
Minitest.extensions << "heapscope_file_progress"
