# frozen_string_literal: true

# retained: a large live heap. Builds `n` live objects (half strings, half two-element arrays) that stay
# referenced to the end, then churns temporaries and forces 3 full GCs, so whatever a profiler does per
# tracked object and per GC is paid on a big heap. full: 1M live objects.
Bench::Workloads.define(:retained, sizes: { full: 1_000_000, quick: 60_000, callgrind: 20_000 },
                                   summary: "build n live objects (strings + arrays), churn, 3 full GCs") do |n|
  live = Array.new(n / 2) { |i| [i.to_s] } # each element: an Array and a String, both kept alive
  3.times do
    i = 0
    while i < n / 4
      Object.new
      i += 1
    end
    GC.start
  end
  live
end
