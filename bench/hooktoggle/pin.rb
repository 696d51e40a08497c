#!/usr/bin/env ruby
# frozen_string_literal: true

# Does an allocation made under the hook stay alive after it is garbage? In each of RUNS fresh processes:
# a Hash literal holding 20,000 strings is made (under the hook for that one allocation, or not) and
# dropped at once, then JSON pages are generated through several GCs; a WeakMap says whether the Hash
# survived them. An unreachable object that survives GCs is held by a stale reference that the GC's
# conservative scan of the C stack finds. No heapscope code is involved.
#
#   ruby bench/hooktoggle/pin.rb [RUNS]      (builds the extension into tmp/bench/hooktoggle first)
require_relative "../extension"

build = Bench::Extension.build("hooktoggle")
runs = Integer(ARGV[0] || 10)
cell = <<~'RUBY'
  require "hooktoggle"
  require "json"
  def attempt(hooked)
    gcs = GC.count
    survivors = ObjectSpace::WeakMap.new
    200.times do |i|
      if i == 5
        strings = Array.new(20_000) { |k| "s#{k}" }
        HookToggle.hook_next(1) if hooked
        document = { "data" => strings } # the one allocation under the hook
        survivors[:document] = document
        document = strings = nil
      else
        JSON.generate({ "data" => Array.new(200) { |k| { "id" => k, "name" => "n#{k}" } } })
      end
    end
    [survivors.key?(:document), GC.count - gcs]
  end
  attempt(false) # warm up: the heap and the stack depths of a program that has run a while
  puts attempt(ARGV[0] == "hooked").join(" ")
RUBY
%w[plain hooked].each do |mode|
  results = Array.new(runs) { IO.popen([RbConfig.ruby, "-I", build, "-e", cell, mode], &:read).split }
  alive = results.count { |alive_after, _| alive_after == "true" }
  gcs = results.map { |_, n| Integer(n) }
  puts format("%-7s the dropped Hash survived %d of %d runs (%d-%d GCs after it)", mode, alive, runs, gcs.min, gcs.max)
end
