# frozen_string_literal: true

require_relative "lib/heapscope/version"

Gem::Specification.new do |spec|
  spec.name = "heapscope"
  spec.version = Heapscope::VERSION
  spec.summary = "A low-overhead live-heap profiler for Ruby that writes standard pprof profiles"
  spec.description = "heapscope samples allocations, tracks the sampled objects until they die, " \
                     "and reports which lines allocated what is still alive as a gzipped pprof profile."
  spec.authors = ["heapscope authors"]
  spec.license = "Apache-2.0"
  spec.required_ruby_version = ">= 3.1"
  spec.files = Dir["lib/**/*.rb", "ext/**/*.{c,h,rb}", "exe/*", "README.md", "docs/**/*.md"]
  spec.bindir = "exe"
  spec.executables = ["heapscope"]
  spec.extensions = ["ext/heapscope/extconf.rb"]
  spec.require_paths = ["lib"]
end
