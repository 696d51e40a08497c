# frozen_string_literal: true

# The gem is heapscope-profiler; Bundler.require loads this file by the gem's name.
require "heapscope"
