# frozen_string_literal: true

# The public entry point for Rails (`require "heapscope/rails"`; `require "heapscope"` loads it by itself
# when Rails is loaded first): the Railtie lives with the other surfaces in lib/heapscope/surfaces/.
require "heapscope/surfaces/rails"
