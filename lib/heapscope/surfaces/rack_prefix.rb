# frozen_string_literal: true

module Heapscope
  # The listener's mount point, in a file of its own: the readers of URLs (Report::ProfileUrl) name it
  # without loading the listener, which loads them (its ?debug=1 text is `heapscope top`'s report),
  # so neither requires the other in a circle.
  class Rack
    PREFIX = "/debug/pprof"
  end
end
