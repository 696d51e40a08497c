# frozen_string_literal: true

module Heapscope
  VERSION = "0.1.0"
end
