# frozen_string_literal: true

require "heapscope/pprof"
require "heapscope/report/escape"
require "heapscope/report/sampling"
require "heapscope/report/labels"
require "heapscope/report/gems"

module Heapscope
  module Report
    # Error is a problem with the user's input (a flag, a file, a sample type): the CLI prints its message
    # on one line and exits 2.
    class Error < StandardError; end

    # Sites groups a profile's samples into the rows the text reports print, summing every sample type at
    # once (so the object count behind a byte estimate is at hand for its sampling error).
    #
    # Grouping (--by):
    #   line      the source line (file:line) of the leaf frame: the line that allocated. heapscope gives C
    #             functions (String#*, Array#push) their Ruby caller's line, so `"x" * 200` on line 4 and
    #             the method around it count as one site; it is named after the outermost function of the
    #             leaf frames on that line (the Ruby method, not the C function it called). Frames without a
    #             file count by function name.
    #   function  the leaf function, C functions included.
    #   file      the leaf frame's file (the file of the line --by line picks).
    #   gem       the gem (or (app), (stdlib), (ruby): Gems) of the first frame, leaf first, that is not
    #             Ruby's own ((stdlib), (ruby)), else the leaf's: a String#* or a Set#add in the standard
    #             library counts for the gem or app line that called it, so the rows say whose code made
    #             the memory, and only allocations with nothing but Ruby in their stack are Ruby's.
    #   class     the "class" label (heapscope profiles); "(no class label)" otherwise.
    #   label:KEY the value of the label KEY (a user label such as endpoint, or any other key);
    #             "(no KEY label)" for samples without it (Labels).
    # flat counts a sample at its site; cum counts it at every site in its stack (once per sample).
    #
    # A value vector holds one value per sample type and, when the profile carries variance labels
    # (Sampling.variance_labels), one summed variance per sample type after them: variances of samples
    # add like their values, so a site's error comes out of the same sums (Sampling#absolute_error).
    module Sites
      BY = %w[line function class file gem].freeze
      NO_LABEL = :no_label # the row key of samples without the label grouped on

      # Entry is one row: name for display; flat is a value vector over all sample types (and their
      # variance columns), cum too, or a Hash {column => value} of the columns aggregate was asked for
      # (its cum:).
      Entry = Struct.new(:key, :name, :function, :file, :line, :flat, :cum)

      module_function

      # Reads a profile file, turning every decoding problem into Report::Error (message names the file).
      # max_size: the reading limit (Pprof::DEFAULT_MAX_SIZE when nil). Also refuses what the reports
      # cannot use (a sample with more or fewer values than sample types) and makes every string of the
      # profile valid UTF-8 (Escape.scrub), so nothing later trips over them.
      def load(path, max_size: nil)
        # share: the reports never change a sample, so equal ones can be one object (Pprof::Decoder).
        usable(Pprof.read(path, max_size: max_size || Pprof::DEFAULT_MAX_SIZE, share: true), path)
      rescue Pprof::LimitError => e
        raise Error, "#{e.message} (--max-size SIZE raises it)"
      rescue Pprof::DecodeError => e
        raise Error, e.message
      end

      # load for a profile's bytes (fetched from a URL: ProfileUrl); messages start with name.
      def decode(bytes, name, max_size: nil)
        usable(Pprof.decode(bytes, max_size: max_size || Pprof::DEFAULT_MAX_SIZE, share: true), name)
      rescue Pprof::LimitError => e
        raise Error, "#{name}: #{e.message} (--max-size SIZE raises it)"
      rescue Pprof::DecodeError => e
        raise Error, "#{name}: #{e.message}"
      end

      # What load and decode check once the bytes are a profile; path names it in messages.
      def usable(prof, path)
        n = prof.sample_types.size
        prof.samples.each_with_index do |s, i|
          next if s.values.size == n

          raise Error, "#{path}: sample #{i} has #{s.values.size} values, but the profile has #{n} sample types"
        end
        # Every string a report shows is an entry of the table (functions, labels and types refer to
        # them), so fixing the table in place fixes them all.
        prof.string_table.each { |str| str.replace(Escape.scrub(str)) unless str.valid_encoding? }
        prof
      end

      # The sample type a report uses: the one asked for, else the profile's default, else inuse_space,
      # else the last one (pprof's rule). Returns its index; Error names the file when it is missing.
      def sample_index(prof, requested, path)
        if prof.sample_types.empty?
          raise Error, "#{path}: the profile has no sample types"
        elsif requested
          prof.sample_index(requested) or
            raise Error, "#{path}: no sample type #{requested.inspect} (have: #{type_list(prof)})"
        else
          [prof.default_sample_type, "inuse_space"].each do |name|
            i = name && prof.sample_index(name)
            return i if i
          end
          prof.sample_types.size - 1
        end
      end

      # The profile's sample type names for a message, at most 20 of them.
      def type_list(prof)
        names = prof.sample_type_names
        names.size > 20 ? "#{names.first(20).join(", ")}, ... (#{names.size} types)" : names.join(", ")
      end

      # Returns {key => Entry}, summing every sample of prof (or the given subset of its samples).
      #
      # Linear in the frames of the stacks, with a small constant, whatever the names' lengths: samples
      # with the same stack are summed first; each location becomes its site ids once (site keys are
      # hashed once per location, not per frame of every sample); a stack's sites are then looked up
      # and deduplicated by Hash#values_at and Array#uniq, and only the cum sums run in Ruby, one integer
      # addition per distinct site and type. The frames themselves are walked only for a stack that
      # brings a site not seen before, to name it.
      #
      # cum: the columns whose cum values are wanted (nil: all; a type's variance column is
      # Sampling#variance_columns). With a list, Entry#cum is a Hash {column => value} of just those: diff
      # and leaks read flat only, top the type it shows and the ones its error needs, and a vector of
      # every type per site would cost sites x types (a profile can declare a million types). Entry#flat is a vector of every type, shared and frozen
      # for the sites that are never a leaf, so it costs types x leaf sites, which the input holds.
      #
      # pace: called once per sample and per stack (a Heapscope::Pacer, when the application's threads
      # must get the GVL: ?debug=1 ranks on one of them), or nil.
      #
      # columns: [width, block] for more columns after the variance columns, summed like them: the
      # block fills a sample's (an Array of width zeros, given with the sample). Persistence splits a
      # site's variance by gc_age so, in one pass instead of one per age.
      def aggregate(prof, by, samples: prof.samples, cum: nil, pace: nil, columns: nil)
        key = Labels.by_key(by)
        unless BY.include?(by) || key
          raise Error, "--by must be one of #{BY.join(", ")} or label:KEY, got #{by.inspect}"
        end

        var = Sampling.variance_labels(prof)
        n = prof.sample_types.size + (var ? var.size : 0) # the width of a value vector
        if columns
          width, extra = columns
          var = Extra.new(var, width, extra)
          n += width
        end
        return aggregate_label(samples, n, var, key, pace) if key

        # Location ids are 1..N in every writer we know: then an Array is the fastest map for values_at.
        dense = prof.locations.size * 4 + 1024
        dense = 0 if prof.locations.any? { |l| l.id >= dense }
        st = { prof: prof, by: by, site_ids: {}, keys: [], names: [], order: [], single: dense.zero? ? {} : [],
               dense: dense, multi: {}, fresh: {}, new_site: false, own: by == "gem" ? [] : nil }
        flat = []       # site id -> values vector, for sites that are a leaf
        all = cum.nil?
        cum = (cum || (0...n)).to_h { |t| [t, []] } # type index -> site id -> cum value
        sums_arrays = cum.values
        deferred = cum.transform_values { {} } # type index -> location id -> sum for its sites (see count_multi)
        stacks(samples, n, var, pace).each do |ids, values|
          pace&.call
          seq = st[:single].values_at(*ids)
          multi = seq.include?(nil) # a location not seen yet, or one with several sites
          if multi
            st[:fresh].clear
            st[:new_site] = false
            seq = ids.map { |lid| location_sites(st, lid) }
            if st[:new_site]
              name_sites(st, ids)
              grow = st[:keys].size - (sums_arrays[0]&.size || 0)
              sums_arrays.each { |sums| sums.concat(Array.new(grow, 0)) } if grow.positive?
            end
            multi = seq.any?(Array)
          end
          next if seq.empty?

          leaf = multi && seq[0].is_a?(Array) ? seq[0][0] : seq[0]
          leaf = deciding_site(seq, st[:own], leaf) if st[:own] && st[:own][leaf]
          if (f = flat[leaf])
            add(f, values)
          else
            flat[leaf] = values.dup
          end
          next if cum.empty?

          if multi
            count_multi(st, ids, seq, values, cum, deferred)
            next
          end
          uniq = seq.uniq
          cum.each do |ct, c|
            v = values[ct]
            i = 0
            m = uniq.size
            while i < m
              c[uniq[i]] += v
              i += 1
            end
          end
        end
        deferred.each do |ct, sums|
          c = cum[ct]
          sums.each { |lid, v| st[:multi][lid].each { |sid| c[sid] += v } }
        end
        zeros = Array.new(n, 0).freeze
        st[:order].to_h do |sid|
          cums = all ? Array.new(n) { |t| cum[t][sid] } : cum.transform_values { |c| c[sid] }
          [st[:keys][sid], new_entry(st[:keys][sid], st[:names][sid], by, flat[sid] || zeros, cums)]
        end
      end

      # A sample's values followed by var's columns: its variance labels (var, a list of names), or an
      # Extra's.
      def with_columns(sample, var)
        var.is_a?(Extra) ? var.of(sample) : Sampling.with_variances(sample, var)
      end

      # A sample's value vector with the variance labels (labels, or none) and then `width` more columns
      # that the block fills (aggregate's columns:).
      Extra = Struct.new(:labels, :width, :fill) do
        def of(sample)
          values = labels ? Sampling.with_variances(sample, labels) : sample.values.dup
          more = Array.new(width, 0)
          fill.call(sample, more)
          values.concat(more)
        end
      end

      # Counts cum for a stack with locations of several sites (inlined lines), without a step per site of
      # them: a location's sum is kept per location (deferred) and added to each of its sites once at the
      # end, so a location of 30,000 lines shared by 2,000 stacks costs 30,000 additions, not 60 million.
      # Sites that two parts of the stack share (a line both inlined and called directly, recursion
      # through distinct locations) would then count twice; C-level concat and uniq find whether there
      # are any, and only then are those sites found (tally) and corrected.
      def count_multi(st, ids, parts, values, cum, deferred)
        singles = []
        multis = []
        parts.each_with_index { |p, k| p.is_a?(Array) ? multis << ids[k] : singles << p }
        singles.uniq!
        multis.uniq!
        all = singles + multis.flat_map { |lid| st[:multi][lid] }
        over = nil
        if all.size != all.uniq.size
          over = all.tally
          over.select! { |_, count| count > 1 }
        end
        cum.each do |ct, c|
          v = values[ct]
          singles.each { |sid| c[sid] += v }
          sums = deferred[ct]
          multis.each { |lid| sums[lid] = (sums[lid] || 0) + v }
          over&.each { |sid, count| c[sid] -= (count - 1) * v }
        end
      end

      # [[location ids, values summed over the samples with that stack]] in first-seen order, leaving out
      # samples whose values are all zero (as if they were not there). var: the variance labels to add
      # as columns after the values (n counts them), or nil. pace: as for aggregate.
      def stacks(samples, n, var = nil, pace = nil)
        sums = {}
        each_counted(samples) do |s, times|
          pace&.call
          values = s.values
          next if values.all?(&:zero?)

          values = with_columns(s, var) if var
          values = times(values, times)
          if (sum = sums[s.location_ids])
            i = 0
            while i < n
              sum[i] += values[i]
              i += 1
            end
          else
            sums[s.location_ids] = values.equal?(s.values) ? values.dup : values # (a copy is ours already)
          end
        end
        sums
      end

      # Yields each distinct Sample object of samples once, in first-seen order, with the number of
      # times it is listed: equal samples read with share: are one object, and summing one of them
      # times its count (values and variances add, so k copies sum to k times one, exactly: integers) is
      # one step instead of k. Samples are compared by identity (Sample defines no ==).
      def each_counted(samples, &block)
        samples.tally.each(&block)
      end

      # values times k: values itself when k is 1, else a new Array.
      def times(values, k)
        k == 1 ? values : values.map { |v| v * k }
      end

      # The site ids of a location's frames, leaf first; a location with one site is also kept in
      # st[:single], which values_at reads for a whole stack at once.
      def location_sites(st, lid)
        single = st[:single]
        found = single[lid] if single.is_a?(Hash) || lid < st[:dense]
        return found if found

        st[:multi][lid] ||= begin
          st[:fresh][lid] = true
          ids = st[:prof].frames_for([lid]).map do |f|
            key = site_key(f, st[:by])
            st[:site_ids][key] ||= begin
              st[:new_site] = true
              st[:own][st[:keys].size] = Gems.own?(key) if st[:own]
              (st[:keys] << key).size - 1
            end
          end
          ids.uniq!
          if ids.size == 1
            single[lid] = ids[0] if single.is_a?(Hash) || lid < st[:dense]
            ids[0]
          else
            ids # distinct, in leaf-first order: ids[0] is the location's leaf site
          end
        end
      end

      # Names every site of a stack that has no name yet by its frame, as the report shows it: by line,
      # the outermost frame of the first run of consecutive frames on that line (the Ruby method, not
      # the C function it called); by function, the frame itself. A site new in this stack can only be in
      # locations first seen in this stack (st[:fresh]), so only their frames are walked (and a run's
      # continuation into the next locations): each location once per profile, not every frame of every
      # stack that brings one new leaf.
      def name_sites(st, ids)
        names = st[:names]
        merge = st[:by] == "line"
        ids.each_with_index do |lid, k|
          next unless st[:fresh].delete(lid)

          frames = st[:prof].frames_for([lid])
          frames.each_with_index do |f, i|
            sid = site_of(st, f)
            next if names[sid]

            name = f
            if merge
              fr = frames
              j = i + 1
              at = k
              loop do
                if j >= fr.size
                  at += 1
                  break if at >= ids.size

                  fr = st[:prof].frames_for([ids[at]])
                  j = 0
                end
                break unless site_of(st, fr[j]) == sid

                name = fr[j]
                j += 1
              end
            end
            name_site(st, sid, name)
          end
        end
      end

      # --by gem's flat site of a stack whose leaf is Ruby's own (own: site id -> true): the first site
      # that is not, else the leaf itself. seq: the stack's site ids, leaf first (an Array for a location
      # of several sites).
      def deciding_site(seq, own, leaf)
        seq.each do |part|
          if part.is_a?(Array)
            found = part.find { |sid| !own[sid] }
            return found if found
          elsif !own[part]
            return part
          end
        end
        leaf
      end

      def site_of(st, frame)
        st[:site_ids][site_key(frame, st[:by])]
      end

      def name_site(st, sid, frame)
        return if st[:names][sid]

        st[:names][sid] = frame
        st[:order] << sid
      end

      # Rows by the value of one label (class for --by class): flat and cum are the same, the label being
      # the sample's, not a frame's. Variance columns add per row like the values, so a row's error is
      # its summed variance (or variance groups), as for a line.
      def aggregate_label(samples, n, var, key, pace = nil)
        entries = {}
        missing = Labels.missing_name(key)
        each_counted(samples) do |s, times|
          pace&.call
          values = s.values
          next if values.all?(&:zero?)

          values = with_columns(s, var) if var
          values = times(values, times)

          v = s.labels[key]
          # Rows are keyed by the value's text, and the samples without the label by a Symbol: a value
          # that spells "(no endpoint label)" is still its own row (and a number label, gc_age, groups
          # by its decimal form).
          row = v.nil? ? NO_LABEL : v.to_s
          e = entries[row] ||= begin
            name = v.nil? ? missing : row
            Entry.new(row, name, name, "", 0, Array.new(n, 0), Array.new(n, 0))
          end
          add(e.flat, values)
          add(e.cum, values)
        end
        entries
      end

      def site_key(frame, by)
        if by == "function" then [frame.function, frame.file]
        elsif by == "gem" then Gems.group(frame.file.to_s)
        elsif frame.file.to_s.empty? then [frame.function, "", 0]
        elsif by == "file" then [nil, frame.file, 0]
        else [nil, frame.file, frame.line]
        end
      end

      def new_entry(key, frame, by, flat, cum)
        # A gem's row is named like a label's (function: the name, no file); a file's row by its file.
        return Entry.new(key, key, key, "", 0, flat, cum) if by == "gem"
        return Entry.new(key, frame.file, "", frame.file, 0, flat, cum) if by == "file" && !frame.file.to_s.empty?

        name = if by == "function" || frame.file.to_s.empty?
                 frame.function
               else
                 "#{frame.function} #{frame.file}:#{frame.line}"
               end
        Entry.new(key, name, frame.function, frame.file, by == "line" ? frame.line : 0, flat, cum)
      end

      # Adds the value vector values into into, element by element (a plain loop: the reports' hot path;
      # FlameTree uses it too).
      def add(into, values)
        i = 0
        n = values.size
        while i < n
          into[i] += values[i]
          i += 1
        end
      end
    end
  end
end
