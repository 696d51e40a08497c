# frozen_string_literal: true

# The public entry point for Rack apps (`require "heapscope/rack"` in config.ru): the middleware and the
# endpoints live with the other surfaces in lib/heapscope/surfaces/.
require "heapscope/surfaces/rack"
