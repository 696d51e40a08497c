# frozen_string_literal: true

require_relative "../labels"

module Heapscope
  module Report
    # (Sites defines it too, with its comment; declared here as well so this file loads on its own.)
    class Error < StandardError; end

    # Labels is what the reports know of *user labels*: string labels whose keys the application chose
    # (endpoint, job, thread), as opposed to heapscope's own (class, gc_age, the variance labels). They
    # answer "which request or job made it":
    #
    #   --by label:KEY     one row per value of KEY (Sites.aggregate); samples without KEY make one row,
    #                      "(no KEY label)"
    #   --label KEY=VALUE  only the samples whose label KEY is exactly VALUE (repeatable: all must match),
    #                      like `go tool pprof -tagfocus KEY=VALUE` without its regexps
    #   summary            the keys present and how many values each has, for report headers
    #
    # A label set the writer could not keep (past its label-set cap) has every key's value "(other)":
    # it is shown as a value like any other, so totals still add up.
    module Labels
      PREFIX = "label:"
      OTHER = "(other)"
      # heapscope's own labels (the ones Heapscope.with_labels refuses): never listed as user labels
      # (they are in every sample, and --by class already groups by class). --by label:KEY and --label
      # still accept them: a key is a key.
      RESERVED = ::Heapscope::Labels::RESERVED
      # How many values an error message lists, and keys a header lists (a profile can have thousands).
      LIST = 10

      # Filter is one --label KEY=VALUE.
      Filter = Struct.new(:key, :value) do
        def to_s
          "#{key}=#{value}"
        end

        # A string label matches by its text, a number label by its decimal form (gc_age=8).
        def match?(sample)
          v = sample.labels[key]
          !v.nil? && v.to_s == value
        end
      end

      module_function

      # The --by argument as the reports take it: line, function, class, file and gem (any unique prefix, as
      # OptionParser's list completion allowed before) or label:KEY. Raises Error naming it otherwise.
      def parse_by(text)
        if text.start_with?(PREFIX)
          return text if text.size > PREFIX.size

          raise Error, "invalid argument: --by #{text} needs a label key (--by label:KEY, e.g. --by label:endpoint)"
        end
        found = text.empty? ? [] : Sites::BY.select { |b| b.start_with?(text) }
        return found[0] if found.size == 1

        raise Error, "invalid argument: --by #{text} (one of line, function, class, file, gem or label:KEY)"
      end

      # The label key a --by groups on: "class" for class, KEY for label:KEY, nil for the frame groupings.
      def by_key(by)
        return "class" if by == "class"

        by.start_with?(PREFIX) ? by[PREFIX.size..] : nil
      end

      # The row name of samples without the key.
      def missing_name(key)
        "(no #{key} label)"
      end

      # One --label argument. Raises Error naming it when it is not KEY=VALUE.
      def parse_filter(text)
        key, sep, value = text.partition("=")
        if sep.empty?
          raise Error, "invalid argument: --label #{text} is not KEY=VALUE (e.g. --label endpoint=UsersController#show)"
        elsif key.empty?
          raise Error, "invalid argument: --label #{text} has no key before \"=\" (KEY=VALUE)"
        elsif value.empty?
          # profile.proto cannot hold an empty string label (str 0 is ""), so no sample could match.
          raise Error, "invalid argument: --label #{text} has no value after \"=\" (a label value cannot be empty; " \
                       "--by label:#{key} shows the samples without the label as #{missing_name(key)})"
        end
        Filter.new(key, value)
      end

      def user_key?(key, value)
        value.is_a?(String) && !key.match?(RESERVED)
      end

      # {key => {value => number of samples}} of the user labels in profiles, keys and values in first
      # seen order.
      def values(profiles)
        out = {}
        reserved = {} # key -> reserved?, so each distinct key meets the regexp once
        profiles.each do |prof|
          Sites.each_counted(prof.samples) do |s, times|
            s.labels.each do |k, v|
              next unless v.is_a?(String)
              next if reserved.fetch(k) { reserved[k] = k.match?(RESERVED) }

              per = out[k] ||= Hash.new(0)
              per[v] += times
            end
          end
        end
        out
      end

      # The header's list: [{"key", "values" (how many), "other" (true when some label set went past
      # the cap)}], keys by name.
      def summary(profiles)
        values(profiles).sort.map { |k, vs| { "key" => k, "values" => vs.size, "other" => vs.key?(OTHER) } }
      end

      # "endpoint (3 values), thread (4 values)"; nil without user labels.
      def summary_text(list)
        return nil if list.nil? || list.empty?

        text = list.first(LIST).map { |l| "#{l["key"]} (#{l["values"]} value#{l["values"] == 1 ? "" : "s"})" }.join(", ")
        text += ", ... (#{list.size} keys)" if list.size > LIST
        text += "; #{OTHER}: label sets past the writer's cap" if list.any? { |l| l["other"] }
        text
      end

      # "endpoint=GET /users/:id and thread=worker-1", of Filters or of their JSON (filter_json).
      def filter_text(filters)
        filters.map { |f| f.is_a?(Hash) ? "#{f["key"]}=#{f["value"]}" : f.to_s }.join(" and ")
      end

      # For JSON: [{"key", "value"}] (a list: the same key may be given twice).
      def filter_json(filters)
        filters.map { |f| { "key" => f.key, "value" => f.value } }
      end

      # prof itself without filters, else a copy holding only the samples that match every filter. The
      # copy shares everything else (locations, functions, comments, caches), so the reports read it as
      # the profile, and the sampling error of the selection comes from the same comments.
      def select(prof, filters)
        return prof if filters.nil? || filters.empty?

        subset(prof, prof.samples.select { |s| filters.all? { |f| f.match?(s) } })
      end

      def subset(prof, samples)
        copy = prof.dup
        copy.samples = samples
        copy
      end

      # The Error for filters that match no sample of profiles (what: "FILE", "BASE or NEW", "any profile
      # of the series"): which filter found nothing, and the values its key does have.
      def no_match(profiles, filters, what)
        known = values(profiles)
        all = lambda do |key|
          # A reserved key (gc_age=8) is looked up in the samples themselves.
          known[key] || profiles.flat_map(&:samples).map { |s| s.labels[key] }.compact.map(&:to_s).tally
        end
        lone = filters.find { |f| profiles.none? { |p| p.samples.any? { |s| f.match?(s) } } }
        reason =
          if lone.nil?
            "each of #{filter_text(filters)} matches samples, but no sample matches them all"
          elsif (vs = all.call(lone.key)).empty?
            keys = summary_text(summary(profiles))
            "no sample has a label #{lone.key.inspect} (#{keys ? "labels: #{keys}" : "the profile has no user labels"})"
          else
            listed = vs.keys.first(LIST).map(&:inspect).join(", ")
            more = vs.size > LIST ? ", ... (#{vs.size} values)" : ""
            "no sample has #{lone}; #{lone.key} has #{listed}#{more}"
          end
        Error.new("#{what}: no sample matches --label #{filter_text(filters)}: #{reason}")
      end

      # Checks a --by label:KEY against profiles: Error when no sample of any of them has the key (a typo
      # would otherwise print one row, "(no KEY label)", and look like an answer).
      def check_by(profiles, by, what)
        key = by_key(by)
        return if key.nil? || by == "class"
        return if profiles.any? { |p| p.samples.any? { |s| s.labels.key?(key) } }

        keys = summary_text(summary(profiles))
        raise Error, "#{what}: no sample has a label #{key.inspect} (--by #{by}; " \
                     "#{keys ? "labels: #{keys}" : "the profile has no user labels"})"
      end
    end
  end
end
