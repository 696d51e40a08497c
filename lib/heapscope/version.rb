# frozen_string_literal: true

module Heapscope
  VERSION = "0.2.0"
end
