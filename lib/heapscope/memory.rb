# frozen_string_literal: true

require "heapscope/report/census"

module Heapscope
  # Memory: where the process's resident memory went, beside every heap profile. A profile says
  # which lines allocated the Ruby objects still alive; this says how much of RSS those objects are,
  # and how much is elsewhere (free heap slots, malloc's fragmentation, C libraries' own memory).
  #
  #   m = Heapscope::Memory.measure             # raw figures, a Hash of Integers (nil: unknown here)
  #   Heapscope::Memory.breakdown(m, profiled: 12_345_678, profiled_objects: 90_000)   # what a reader wants
  #
  # Every profile carries one comment line `heapscope memory: rss=... heap_pages=...` with the raw
  # figures (Heapscope.profile adds it); readers (heapscope top, ?debug=1, /debug/pprof/memstats) add
  # the profile's own inuse totals and derive the rest (of_profile). docs/reading-profiles.md explains each line.
  module Memory
    COMMENT = "heapscope memory:"
    COMMENT_PATTERN = /\Aheapscope memory: (.*)\z/.freeze
    # The raw figures, in bytes unless named *_slots or *_pages.
    FIELDS = %i[rss rss_anon rss_file rss_shmem heap_pages heap_page_size slot_size heap_live_slots heap_free_slots
                malloc_arena malloc_mmapped malloc_in_use malloc_free malloc_releasable
                ruby_malloc_increase ruby_malloc_limit ruby_oldmalloc_increase].freeze
    STATUS_FIELDS = { "VmRSS" => :rss, "RssAnon" => :rss_anon, "RssFile" => :rss_file, "RssShmem" => :rss_shmem }.freeze
    MALLOC_FIELDS = %i[malloc_arena malloc_mmapped malloc_in_use malloc_free malloc_releasable].freeze

    @malloc_stats = true

    class << self
      # Whether measure asks glibc for its figures (mallinfo2). It walks every free list, holding
      # each arena's lock in turn: 14 ms with 30 MiB free in 500k small chunks, 65 ms with 122 MiB in
      # 2M (bench/memory_cost.rb), during which threads that malloc from a locked arena wait. It runs
      # without the GVL. false (HEAPSCOPE_MALLOC_STATS=0) leaves the malloc figures unknown.
      attr_accessor :malloc_stats

      # The raw figures now. Linux's /proc/self/status gives RSS (nil elsewhere); GC.stat the Ruby
      # heap; glibc's mallinfo2 the allocator (nil elsewhere). About 0.2 ms, plus mallinfo2's walk
      # (see malloc_stats); no walk of the Ruby heap.
      def measure
        figures = FIELDS.to_h { |name| [name, nil] }
        figures.merge!(resident)
        stat = GC.stat
        figures[:heap_pages] = stat[:heap_allocated_pages]
        figures[:heap_page_size] = GC::INTERNAL_CONSTANTS[:HEAP_PAGE_SIZE]
        # The smallest slot (3.2+ also have larger ones, for embedded contents).
        figures[:slot_size] = GC::INTERNAL_CONSTANTS[:BASE_SLOT_SIZE] || GC::INTERNAL_CONSTANTS[:RVALUE_SIZE]
        figures[:heap_live_slots] = stat[:heap_live_slots]
        figures[:heap_free_slots] = stat[:heap_free_slots]
        figures[:ruby_malloc_increase] = stat[:malloc_increase_bytes]
        figures[:ruby_malloc_limit] = stat[:malloc_increase_bytes_limit]
        figures[:ruby_oldmalloc_increase] = stat[:oldmalloc_increase_bytes]
        malloc = @malloc_stats && defined?(Native._malloc_stats) ? Native._malloc_stats : nil
        MALLOC_FIELDS.zip(malloc).each { |name, value| figures[name] = value } if malloc
        figures
      end

      # The profile comment line for figures (unknown ones left out).
      def comment(figures)
        "#{COMMENT} #{FIELDS.filter_map { |name| "#{name}=#{figures[name]}" if figures[name] }.join(" ")}"
      end

      # The figures of a profile's comment line, or nil when it has none (an older heapscope's, a delta).
      def from_comments(comments)
        line = comments.find { |c| c.start_with?(COMMENT) }
        return nil unless line && (m = COMMENT_PATTERN.match(line))

        figures = FIELDS.to_h { |name| [name, nil] }
        m[1].split.each do |pair|
          key, value = pair.split("=", 2)
          name = FIELDS.find { |f| f.to_s == key }
          # At most 20 digits: a profile from elsewhere must not make the reader parse a huge number.
          figures[name] = Integer(value, 10) if name && value&.match?(/\A\d{1,20}\z/)
        end
        figures
      end

      # What the figures mean together. profiled: the profile's inuse_space total (bytes of the
      # sampled live objects, estimated); profiled_objects: its inuse_objects total. Returns a Hash of
      # bytes (nil where a figure is unknown):
      #   rss, rss_anon, rss_file    resident memory, anonymous (heap, stacks) and file-backed (code, mmaps)
      #   ruby_heap                  the Ruby object heap's pages
      #   malloc_held, malloc_in_use, malloc_free   glibc's allocator: held from the system, handed out, free inside
      #   profiled                   the profile's live objects (slots and their malloc'd memory)
      #   profiled_malloc            of that, the bytes beyond their slots: malloc'd, so inside malloc_in_use
      #   unexplained                rss_anon - ruby_heap - profiled_malloc - malloc's resident free bytes
      #                              (malloc_free less malloc_not_resident, at least 0): what no Ruby object in
      #                              the profile accounts for, split (glibc only) into
      #   unexplained_in_malloc      malloc_in_use - profiled_malloc: C extensions' and libraries' malloc,
      #                              objects younger than min_age and the VM's own, malloc's chunk overhead
      #   unexplained_outside_malloc rss_anon - ruby_heap - malloc_held when that is positive, else 0: thread
      #                              stacks, other mmaps and allocators
      #   malloc_not_resident        malloc_held - (rss_anon - ruby_heap) when that is positive, else 0: at
      #                              least this much of what malloc holds has no resident page (mallinfo2
      #                              counts address space: free memory malloc_trim gave back with madvise,
      #                              an arena's untouched top, pages of blocks never written, such as a
      #                              buffer's unused capacity); an overlap, not a size of its own. It
      #                              also hides as much memory outside malloc, which is then unknown.
      #   profiled_exact             1 when profiled comes from the profile's census (every live object,
      #                              counted), 0 when it is the profile's estimate
      def breakdown(figures, profiled: nil, profiled_objects: nil, exact: false)
        ruby_heap = figures[:heap_pages] && figures[:heap_page_size] && figures[:heap_pages] * figures[:heap_page_size]
        held = figures[:malloc_arena] && figures[:malloc_mmapped] && figures[:malloc_arena] + figures[:malloc_mmapped]
        slots = profiled_objects && figures[:slot_size] && profiled_objects * figures[:slot_size]
        profiled_malloc = profiled && slots && [profiled - slots, 0].max
        # malloc's figures are address space, RSS is pages: when malloc holds more than anonymous RSS
        # minus the object heap, the difference is (at least) malloc's bytes that are not resident, an
        # overlap and not memory outside malloc (see not_resident).
        outside = figures[:rss_anon] && ruby_heap && held && figures[:rss_anon] - ruby_heap - held
        not_resident = outside && [-outside, 0].max
        # Only malloc's resident free bytes are taken from RSS: those not resident were never in it. The
        # overlap is counted as free bytes, up to all of them: what malloc gave back or never touched is
        # mostly free (trimmed chunks, an arena's untouched top); a block in use that was never written
        # (a buffer's unused capacity) is the exception, and then stays in "in malloc".
        resident_free = figures[:malloc_free] && figures[:malloc_free] - [not_resident || 0, figures[:malloc_free]].min
        unexplained = figures[:rss_anon] && ruby_heap && profiled_malloc &&
                      figures[:rss_anon] - ruby_heap - profiled_malloc - (resident_free || 0)
        in_malloc = figures[:malloc_in_use] && profiled_malloc && figures[:malloc_in_use] - profiled_malloc
        {
          rss: figures[:rss], rss_anon: figures[:rss_anon], rss_file: figures[:rss_file], ruby_heap: ruby_heap,
          heap_live_slots: figures[:heap_live_slots], heap_free_slots: figures[:heap_free_slots],
          malloc_held: held, malloc_in_use: figures[:malloc_in_use], malloc_free: figures[:malloc_free],
          ruby_malloc_increase: figures[:ruby_malloc_increase], profiled: profiled, profiled_exact: exact ? 1 : 0,
          profiled_malloc: profiled_malloc,
          unexplained: unexplained, unexplained_in_malloc: in_malloc,
          unexplained_outside_malloc: outside && [outside, 0].max, malloc_not_resident: not_resident
        }
      end

      # The breakdown of a decoded profile (Heapscope::Pprof::Profile) from its inuse totals and
      # figures: by default its own memory comment's; nil when there are none. A profile with a census
      # (Report::Census) gives its exact totals instead of the sampled estimates: every live object of
      # every age, so young objects no longer hide in "unexplained".
      def of_profile(prof, figures = from_comments(prof.comments))
        return nil unless figures

        if (census = Report::Census.of(prof))
          return breakdown(figures, profiled: census.bytes, profiled_objects: census.objects, exact: true)
        end

        space = prof.sample_index("inuse_space")
        objects = prof.sample_index("inuse_objects")
        breakdown(figures, profiled: space && prof.samples.sum { |s| s.values[space] },
                           profiled_objects: objects && prof.samples.sum { |s| s.values[objects] })
      end

      # The breakdown as text lines (heapscope top, ?debug=1). size: a callable formatting bytes.
      def report_lines(parts, size:)
        fmt = ->(bytes) { bytes.nil? ? "unknown" : size.call(bytes) }
        lines = []
        lines << "memory: RSS #{fmt.call(parts[:rss])} (anonymous #{fmt.call(parts[:rss_anon])}, file-backed " \
                 "#{fmt.call(parts[:rss_file])}: code and mapped files)"
        lines << "  Ruby object heap  #{fmt.call(parts[:ruby_heap])} (slots: #{parts[:heap_live_slots]} live, " \
                 "#{parts[:heap_free_slots]} free)"
        exact = parts[:profiled_exact] == 1
        lines << "  profiled objects  #{fmt.call(parts[:profiled])} (#{exact ? "all live objects, exact (census)" : "this profile's inuse_space, estimated"}; " \
                 "#{fmt.call(parts[:profiled_malloc])} of it malloc'd beyond their slots)"
        if parts[:malloc_held]
          lines << "  malloc (glibc)    #{fmt.call(parts[:malloc_held])} held: #{fmt.call(parts[:malloc_in_use])} in use, " \
                   "#{fmt.call(parts[:malloc_free])} free inside (fragmentation)"
        else
          lines << "  malloc            unknown (not glibc's allocator, or HEAPSCOPE_MALLOC_STATS=0)"
        end
        # The differences below are sizes only when positive; a negative one is an overlap (two terms that
        # count the same bytes, or an estimate above what it is compared with), said as such.
        free = parts[:malloc_not_resident].to_i.positive? ? "malloc's resident free bytes" : "malloc's free bytes"
        lines << if parts[:unexplained].to_i.negative?
                   "  unexplained       none: the terms taken from anonymous RSS (object heap, profiled objects' " \
                     "malloc'd bytes, #{free}) exceed it by #{fmt.call(-parts[:unexplained])}"
                 else
                   "  unexplained       #{fmt.call(parts[:unexplained])} (anonymous RSS - object heap - profiled " \
                     "objects' malloc'd bytes - #{free})"
                 end
        if parts[:unexplained_in_malloc]&.negative?
          lines << "    in malloc       none: the profiled objects' malloc'd bytes#{exact ? "" : " (estimated)"} exceed " \
                   "malloc's in use by #{fmt.call(-parts[:unexplained_in_malloc])}"
        elsif parts[:unexplained_in_malloc]
          young = exact ? "" : "young and "
          lines << "    in malloc       #{fmt.call(parts[:unexplained_in_malloc])} (C extensions' and libraries' " \
                   "malloc, #{young}VM-internal objects, malloc's chunk overhead)"
        end
        if parts[:malloc_not_resident].to_i.positive?
          lines << "    outside malloc  unknown: malloc holds #{fmt.call(parts[:malloc_not_resident])} more than " \
                   "anonymous RSS - object heap, so at least that much of it is not resident (address space: " \
                   "free memory given back with madvise, pages never written); it hides as much outside malloc"
        elsif parts[:unexplained_outside_malloc]
          lines << "    outside malloc  #{fmt.call(parts[:unexplained_outside_malloc])} (thread stacks, other mmaps, " \
                   "other allocators)"
        end
        lines
      end

      # The breakdown as a JSON object (no json library: numbers and null only).
      def to_json(parts, extra = {})
        fields = extra.merge(parts).map { |key, value| "\"#{key}\":#{value.nil? ? "null" : Integer(value)}" }
        "{#{fields.join(",")}}\n"
      end

      # RSS figures from /proc/self/status: {rss:, rss_anon:, rss_file:, rss_shmem:} in bytes, the
      # ones found; {} where there is no such file (not Linux). Dumps reads it once a second.
      def resident
        text = File.read("/proc/self/status")
        text.each_line.with_object({}) do |line, out|
          key, rest = line.split(":", 2)
          name = STATUS_FIELDS[key]
          out[name] = Integer(rest[/\d+/], 10) * 1024 if name && rest&.match?(/\d+ kB/)
        end
      rescue SystemCallError, IOError
        {}
      end
    end
  end
end
