# frozen_string_literal: true

module Heapscope
  # Pacer lets the application's threads run during long Ruby work that heapscope does on one of them
  # (decoding and ranking a profile for ?debug=1). Ruby hands the GVL over only every 100 ms, so a thread
  # of the application coming back from I/O waited up to 100 ms per wake-up behind such work, and an
  # application loop that waits on I/O ran 4-15 times a second instead of 380-670. The work calls
  # #call at each step (each sample, each field); every EVERY steps the Pacer reads the clock, and
  # once slice seconds have passed since it last yielded it calls Thread.pass, which hands the GVL to
  # a waiting thread if there is one (and costs about a microsecond when there is none).
  #
  #   pace = Heapscope::Pacer.new
  #   rows.each { |row| pace.call; ... }
  class Pacer
    EVERY = 4

    # slice: seconds of work between two yields (default 0.2 ms: an application thread waiting for the
    # GVL then loses at most that per wake-up, and a render pays a few microseconds per hand-over).
    def initialize(slice: 0.0002)
      @slice = slice
      @steps = 0
      @since = clock
    end

    def call
      @steps += 1
      return unless (@steps % EVERY).zero?

      now = clock
      return if now - @since < @slice

      Thread.pass
      @since = clock
    end

    private

    def clock
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
