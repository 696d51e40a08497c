# frozen_string_literal: true

require_relative "lib/heapscope/version"

# Published as heapscope-profiler: the registry's "heapscope" is an unrelated gem. What users type
# stays heapscope: `require "heapscope"`, the Heapscope module and the heapscope executable.
Gem::Specification.new do |spec|
  spec.name = "heapscope-profiler"
  spec.version = Heapscope::VERSION
  spec.summary = "A low-overhead live-heap profiler for Ruby that writes standard pprof profiles"
  spec.description = "heapscope samples allocations, tracks the sampled objects until they die, " \
                     "and reports which lines allocated what is still alive as a gzipped pprof profile."
  spec.authors = ["heapscope authors"]
  spec.license = "Apache-2.0"
  spec.homepage = "https://github.com/heapscope/heapscope"
  spec.metadata = {
    "source_code_uri" => spec.homepage,
    "changelog_uri" => "#{spec.homepage}/blob/main/CHANGELOG.md",
    "bug_tracker_uri" => "#{spec.homepage}/issues",
    "documentation_uri" => "#{spec.homepage}/tree/main/docs",
    "rubygems_mfa_required" => "true",
  }
  spec.required_ruby_version = ">= 3.1"
  spec.files = Dir["lib/**/*.rb", "lib/heapscope/ui/assets/*.{js,css}", "ext/**/*.{c,h,rb}", "exe/*", "README.md", "LICENSE", "CHANGELOG.md", "docs/**/*.md"]
  spec.bindir = "exe"
  spec.executables = ["heapscope"]
  spec.extensions = ["ext/heapscope/extconf.rb"]
  spec.require_paths = ["lib"]
end
