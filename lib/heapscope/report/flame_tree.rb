# frozen_string_literal: true

require "heapscope/report/sampling"
require "heapscope/report/sites"

module Heapscope
  module Report
    # FlameTree aggregates the call trees of profiles (one, or [new, base] for a diff, whose sample types
    # are matched to the first one's by name) into the node arrays a flame graph page draws:
    #   {"frames" => [[function, file, line]], "parent" => [..], "frame" => [..],
    #    "values" => [per type: [cumulative value per node]], "base" => same for profiles[1] or nil,
    #    "errors" => {"cum" => [per type: [standard error of the node's value]], "self" => [per type:
    #    [standard error of its self value]]} or nil when the profile's sampling is unknown,
    #    "base_errors" => the same for profiles[1] or nil, "capped" => true when a bound below cut the tree}
    #
    # Errors come from Sampling: with variance labels each stack's variances ride along as extra value
    # columns (after the ntypes values) and are summed with them, so a node's variance is the sum over
    # its stacks, exactly as for a site in the text reports.
    #
    # A node is kept when its value is at least prune of the total in some type of some profile (the
    # rest is folded into its parent), largest first, at most max_nodes of them and max_values values.
    # The tree is grown best first from the root: a node is a group of stacks that share its call path,
    # and expanding it splits the group by each stack's next frame. Pruned nodes are never built, and the
    # groups waiting in the queue are disjoint, so memory is linear in the stacks: a full trie of 2,000
    # distinct 3,000-frame stacks (a crafted 100 KB profile holds that) is 6 million nodes and gigabytes.
    #
    # A stack is its locations' frame arrays (shared between stacks) and a member of a group is a cursor
    # into them (stack, location, line), so inlined lines are never copied out per stack. Work is one
    # step per stack and level reached, bounded by a budget linear in the locations the stacks refer to
    # (which a stack without inlined lines never reaches), so a small profile whose locations carry
    # thousands of lines cannot make it quadratic.
    class FlameTree
      BUDGET_SLACK = 4_000_000

      def initialize(profiles, prune:, max_nodes:, max_values:)
        @profiles = profiles
        @prune = prune
        names = profiles.first.sample_type_names
        @ntypes = names.size
        @np = profiles.size
        # Every profile's errors are computed on vectors in the first profile's type order.
        # Variance columns: each type's T_var label, then its variance groups' (as many as the profile
        # with the most has; a profile without groups reads its T_var column).
        groups = profiles.map { |prof| Sampling.groups_of(prof) }.max
        @samplings = profiles.map { |prof| Sampling.new(prof, type_names: names, groups: groups) }
        @var_labels = Sampling.label_names(names, groups) if @samplings.any?(&:variance?)
        @width = @ntypes + (@var_labels ? @var_labels.size : 0) # values, then variance columns
        # The page holds ntypes x profiles values per node, and two errors per value: bound those too (a
        # profile can declare a million sample types).
        @max_nodes = [[max_nodes, max_values / (@ntypes * @np * 3)].min, 1].max
      end

      def build
        collect
        @parent = [0]
        @frame = [0]
        @sums = [@totals]
        @queue = Heap.new
        @steps = 0
        refs = @stacks.sum(&:size)
        @budget = 2 * refs + BUDGET_SLACK
        members = []
        @stacks.each_index { |x| members << x << 0 << 0 }
        capped = false
        expand(0, members, @totals, nil)
        while (item = @queue.pop)
          if @parent.size >= @max_nodes || @steps > @budget
            capped = true
            break
          end
          up, fid, v, group, score = item
          @parent << up
          @frame << fid
          @sums << v
          expand(@parent.size - 1, group, v, score)
        end
        output(capped)
      end

      private

      # Sums the samples of each profile by stack (same location ids) and turns each stack into its
      # locations' frame-id arrays, root first.
      def collect
        first = @profiles.first
        @frames = [["all", "", 0]]
        frame_ids = {}
        @owner = []  # stack -> profile index
        @values = [] # stack -> values (first's sample types)
        @stacks = [] # stack -> [frame ids of a location, root first], root-most location first
        @totals = @profiles.map { Array.new(@width, 0) }
        @profiles.each_with_index do |prof, pi|
          index = Sampling.type_index(prof)
          map = first.sample_type_names.map { |name| index[name] }
          # Location id -> its frame ids, root first. Ids are 1..N in every writer we know: an Array then,
          # which values_at reads for a whole stack in C.
          dense = prof.locations.size * 4 + 1024
          loc_frames = prof.locations.any? { |l| l.id >= dense } ? {} : []
          grouped = {}
          labelled = @samplings[pi].variance?
          Sites.each_counted(prof.samples) do |s, times|
            vals = map.map { |i| i ? s.values[i] : 0 }
            next if vals.all?(&:zero?)

            if labelled then Sampling.add_variances(vals, s, @var_labels)
            elsif @var_labels then vals.concat(Array.new(@var_labels.size, 0))
            end
            vals.map! { |v| v * times } if times > 1

            Sites.add(@totals[pi], vals)
            if (sum = grouped[s.location_ids])
              Sites.add(sum, vals)
            else
              grouped[s.location_ids] = vals
            end
          end
          grouped.each do |ids, vals|
            stack = loc_frames.values_at(*ids)
            if stack.include?(nil)
              stack = ids.map do |id|
                known = loc_frames[id] if loc_frames.is_a?(Hash) || id < dense
                known || prof.frames_for([id]).reverse.map! do |f|
                  key = [f.function, f.file, f.line]
                  frame_ids[key] ||= (@frames << key).size - 1
                end.tap { |fr| loc_frames[id] = fr if loc_frames.is_a?(Hash) || id < dense }
              end
            end
            stack.reverse!
            # (A stack without frames stays: it ends at the root, whose value includes it.)
            @owner << pi
            @values << vals
            @stacks << stack
          end
        end
        @limits = @totals.map { |tot| tot.map { |v| [v.abs * @prune, 1].max.to_f } }
      end

      # Splits a node's members (flat [stack, location, line] cursors) by their next frame and queues
      # the groups big enough to keep. The largest group's sums are the node's minus the others' (and
      # those of the stacks that end here), so a stack's values are added again only when it falls into
      # a smaller group, at most log2(stacks) times down its path: a chain of kept nodes that many stacks
      # share costs one subtraction per node, not a pass over the stacks' values.
      def expand(node, members, total, score)
        groups = {}
        rest = nil
        stacks = @stacks
        i = 0
        n = members.size
        @steps += n / 3
        while i < n
          x = members[i]
          li = members[i + 1]
          ln = members[i + 2]
          i += 3
          stack = stacks[x]
          if li >= stack.size
            rest ||= Array.new(@np) { Array.new(@width, 0) }
            Sites.add(rest[@owner[x]], @values[x])
            next
          end
          lines = stack[li]
          fid = lines[ln]
          ln += 1
          if ln == lines.size
            li += 1
            ln = 0
          end
          (groups[fid] ||= []) << x << li << ln
        end
        return if groups.empty?

        # One way on, nothing ending here (a chain): the child holds exactly this node's stacks.
        if rest.nil? && groups.size == 1
          fid, group = groups.first
          return @queue.push(score, [node, fid, total, group, score]) if score

          return consider(node, fid, total, group)
        end

        rest ||= Array.new(@np) { Array.new(@width, 0) }
        big = groups.max_by { |_, g| g.size }[0]
        got = {}
        groups.each do |fid, group|
          next if fid == big

          v = Array.new(@np) { Array.new(@width, 0) }
          j = 0
          while j < group.size
            x = group[j]
            Sites.add(v[@owner[x]], @values[x])
            j += 3
          end
          v.each_with_index { |pv, pi| Sites.add(rest[pi], pv) }
          got[fid] = v
        end
        got[big] = total.each_with_index.map { |tv, pi| tv.each_with_index.map { |x, t| x - rest[pi][t] } }
        groups.each { |fid, group| consider(node, fid, got[fid], group) }
      end

      # Scores a node by its values only (not its variance columns).
      def consider(node, fid, v, group)
        score = 0.0
        v.each_with_index do |pv, pi|
          lim = @limits[pi]
          t = 0
          while t < @ntypes
            r = pv[t].abs / lim[t]
            score = r if r > score
            t += 1
          end
        end
        @queue.push(score, [node, fid, v, group, score]) if score >= 1
      end

      def output(capped)
        used = {}
        @frame.each { |fid| used[fid] ||= used.size }
        out_frames = Array.new(used.size)
        used.each { |fid, i| out_frames[i] = @frames[fid] }
        {
          "frames" => out_frames,
          "parent" => @parent,
          "frame" => @frame.map { |fid| used[fid] },
          "values" => (0...@ntypes).map { |t| @sums.map { |v| v[0][t] } },
          "base" => @np > 1 ? (0...@ntypes).map { |t| @sums.map { |v| v[1][t] } } : nil,
          "errors" => errors(0),
          "base_errors" => @np > 1 ? errors(1) : nil,
          "capped" => capped,
        }
      end

      # The standard errors of profile pi's node values, cumulative and self (the node minus the
      # children kept; what was folded into it stays in its self), 3 significant digits; nil when the
      # profile's sampling is unknown.
      def errors(pi)
        sampling = @samplings[pi]
        return nil unless sampling.known?

        selfs = @sums.map { |v| v[pi].dup }
        (1...@parent.size).each do |i|
          own = selfs[@parent[i]]
          child = @sums[i][pi]
          j = 0
          while j < @width
            own[j] -= child[j]
            j += 1
          end
        end
        err = ->(vec, t) { Units.significant(sampling.absolute_error(vec, t), 3) }
        {
          "cum" => (0...@ntypes).map { |t| @sums.map { |v| err.call(v[pi], t) } },
          "self" => (0...@ntypes).map { |t| selfs.map { |vec| err.call(vec, t) } },
        }
      end

      # Heap is a max-heap of items by score, first pushed first among equal scores (so the page is the
      # same for the same profile).
      class Heap
        def initialize
          @scores = []
          @seqs = []
          @items = []
          @seq = 0
        end

        def push(score, item)
          @scores << score
          @seqs << (@seq += 1)
          @items << item
          i = @items.size - 1
          while i.positive?
            up = (i - 1) / 2
            break unless before?(i, up)

            swap(i, up)
            i = up
          end
        end

        def pop
          return nil if @items.empty?

          top = @items[0]
          swap(0, @items.size - 1)
          @scores.pop
          @seqs.pop
          @items.pop
          i = 0
          n = @items.size
          while (l = 2 * i + 1) < n
            c = l + 1 < n && before?(l + 1, l) ? l + 1 : l
            break unless before?(c, i)

            swap(i, c)
            i = c
          end
          top
        end

        private

        # True when entry a comes out before entry b: a higher score, or the same pushed earlier.
        def before?(a, b)
          sa = @scores[a]
          sb = @scores[b]
          sa > sb || (sa == sb && @seqs[a] < @seqs[b])
        end

        def swap(a, b)
          @scores[a], @scores[b] = @scores[b], @scores[a]
          @seqs[a], @seqs[b] = @seqs[b], @seqs[a]
          @items[a], @items[b] = @items[b], @items[a]
        end
      end
    end
  end
end
