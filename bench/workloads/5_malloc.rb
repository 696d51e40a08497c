# frozen_string_literal: true

# malloc: few objects, lots of malloc. Big strings grown with << until ~1 MiB then dropped, so GCs are
# triggered by malloc growth, not by running out of slots (the cell reports the last GC's reason).
#
# glibc's mmap threshold is pinned at its initial 128 KiB: left dynamic, this loop's time swings between
# ~0.8x and ~1.8x depending on where glibc's heap top happens to be (page faults from trimming and
# re-growing it), and an *empty* NEWOBJ hook alone was enough to flip it (same instruction count, 2.3x the
# page faults). Pinned, every profiler sees the same allocator behaviour and the column measures them.
Bench::Workloads.define(:malloc, sizes: { full: 400, quick: 100, callgrind: 100 },
                                 summary: "grow strings to 1 MiB with << (64 B - 4 KiB chunks), drop them",
                                 env: { "MALLOC_MMAP_THRESHOLD_" => "131072" }) do |n|
  chunks = [64, 256, 1024, 4096].map { |k| ("x" * k).freeze }
  total = 0
  n.times do |r|
    s = +""
    k = r
    while s.bytesize < 1 << 20
      s << chunks[k & 3]
      k += 1
    end
    total += s.bytesize
  end
  total
end
