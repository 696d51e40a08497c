# frozen_string_literal: true

# `RUBYOPT=-rheapscope/auto`: starts heapscope from HEAPSCOPE_* variables as the process boots
# (lib/heapscope/surfaces/autostart.rb does the work; docs/surfaces.md).
require "heapscope/surfaces/autostart"

Heapscope::Auto.start
