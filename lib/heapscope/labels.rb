# frozen_string_literal: true

module Heapscope
  # Labels: which request, job or thread allocated what is alive. The labels in force in a fiber when a
  # sample is taken ride on its record (as the id of an interned set, ext/heapscope/labels.h) and are
  # written as pprof string labels on both alloc_* and inuse_* samples, so `go tool pprof -tagfocus`,
  # Pyroscope, Grafana and `heapscope top --by label:KEY` slice by them.
  #
  #   Heapscope.with_labels(endpoint: "GET /users/:id") { ... }   # merged into the labels in force
  #   token = Heapscope.set_labels(job: "ReportJob")              # the non-block pair, for middleware
  #   Heapscope.restore_labels(token)                             #   and start/finish subscribers
  #
  # Labels are fiber-local (Thread#[]): a fiber or thread starts with none, and labels set in one never
  # show on another's samples. To carry them into a thread you start: Heapscope.with_labels(**labels_of_parent).
  # They work whether or not heapscope runs, so middleware can set them unconditionally.
  #
  # Keys: Symbols or Strings matching KEY_FORMAT, not one of heapscope's own labels (RESERVED). Values:
  # anything, as to_s (nil removes the key), cut to MAX_VALUE_BYTES and made valid UTF-8. At most
  # MAX_LABELS per set. Distinct sets are capped per process (max_label_sets, default 1000): past it a new
  # set becomes its keys with the value "(other)", counted in stats[:label_sets_overflowed].
  #
  # Cost: a set seen before is found in a cache without allocating (the caller's keyword Hash aside);
  # a new one is built in Heapscope.internal, so its allocations are heapscope's, never the profile's.
  module Labels
    LOCAL = :__heapscope_labels # the set's id, read by the allocation hook (capture.h, CAPTURE_LABELS_LOCAL)
    MAX_LABELS = 16
    MAX_VALUE_BYTES = 256
    KEY_FORMAT = /\A[A-Za-z_][A-Za-z0-9_.\-]{0,63}\z/.freeze
    RESERVED = /\A(?:class|gc_age|(?:alloc|inuse)_(?:objects|space)_(?:var|vg\d+))\z/.freeze
    EMPTY = {}.freeze
    # How many (set in force, labels given) pairs the cache keeps; past it each new pair is built anew
    # (inside internal), so an app feeding unbounded values cannot grow it.
    CACHE_LIMIT = 4096

    @lock = Mutex.new
    @children = {} # id in force => { labels given (frozen copy) => id of the merged set }
    @sets = { 0 => EMPTY } # id => its labels as a frozen Hash of Strings
    @cached = 0

    class << self
      # The labels in force in the current fiber (a frozen Hash of Strings).
      def current
        @sets[Thread.current[LOCAL] || 0] || EMPTY
      end

      # The id of the current set merged with labels (raises ArgumentError for a bad key or value).
      def merged_id(labels, method)
        parent = Thread.current[LOCAL] || 0
        children = @children[parent]
        id = children && children[labels]
        return id if id

        Heapscope.internal { build(parent, labels, method) }
      end

      # Makes id the current fiber's set. Returns the previous id (the token restore takes back).
      def switch(id)
        local = Thread.current
        previous = local[LOCAL] || 0
        local[LOCAL] = id.zero? ? nil : id
        previous
      end

      # The set's labels by id (nil for an unknown id).
      def of(id)
        @sets[id]
      end

      def check_token(token)
        return token if token.is_a?(Integer) && @sets.key?(token)

        raise ArgumentError, "Heapscope.restore_labels: #{token.inspect} is not a token from set_labels or clear_labels"
      end

      private

      def build(parent, labels, method)
        merged = (@sets[parent] || EMPTY).dup
        labels.each do |key, value|
          name = key_name(key, method)
          if value.nil?
            merged.delete(name)
          else
            merged[name] = value_text(value)
          end
        end
        if merged.size > MAX_LABELS
          raise ArgumentError, "Heapscope.#{method}: at most #{MAX_LABELS} labels in force at once, got #{merged.size} " \
                               "(#{merged.keys.join(", ")})"
        end
        merged.freeze
        id = defined?(Heapscope::Native) ? Native._label_set(merged.to_a.sort) : 0
        if id.negative? # past the cap: the set with every value "(other)" (labels.h)
          id = -id
          merged = merged.transform_values { "(other)" }.freeze
        end
        @lock.synchronize do
          @sets[id] ||= id.zero? ? EMPTY : merged
          if @cached < CACHE_LIMIT
            key = labels.to_h { |k, v| [k, v.is_a?(String) && !v.frozen? ? v.dup.freeze : v] }.freeze
            (@children[parent] ||= {})[key] = id
            @cached += 1
          end
        end
        id
      end

      def key_name(key, method)
        unless key.is_a?(Symbol) || key.is_a?(String)
          raise ArgumentError, "Heapscope.#{method}: label keys are Symbols or Strings, got #{key.inspect}"
        end
        name = key.to_s
        unless name.match?(KEY_FORMAT)
          raise ArgumentError, "Heapscope.#{method}: label key #{name.inspect} must be a letter or _, then letters, " \
                               "digits, _ . or - (64 at most)"
        end
        if name.match?(RESERVED)
          raise ArgumentError, "Heapscope.#{method}: label key #{name.inspect} is one of heapscope's own labels; choose another"
        end
        name.frozen? ? name : -name
      end

      def value_text(value)
        text = value.to_s
        text = text.dup.force_encoding(Encoding::UTF_8) unless text.encoding == Encoding::UTF_8
        text = text.scrub("?") unless text.valid_encoding?
        if text.bytesize > MAX_VALUE_BYTES
          text = text.byteslice(0, MAX_VALUE_BYTES)
          text = text.byteslice(0, text.bytesize - 1) until text.valid_encoding?
        end
        -text
      end
    end
  end

  class << self
    # Runs the block with labels merged into those in force (see Heapscope::Labels), and restores the
    # previous labels when it ends, however it ends. Returns the block's value.
    def with_labels(**labels)
      raise ArgumentError, "Heapscope.with_labels needs a block (set_labels/restore_labels are the non-block pair)" unless block_given?

      previous = Labels.switch(Labels.merged_id(labels, "with_labels"))
      begin
        yield
      ensure
        Labels.switch(previous)
      end
    end

    # Merges labels into those in force in this fiber until restore_labels(token). Returns the token.
    def set_labels(**labels)
      Labels.switch(Labels.merged_id(labels, "set_labels"))
    end

    # Puts back the labels a set_labels or clear_labels call replaced. Returns nil.
    def restore_labels(token)
      Labels.switch(Labels.check_token(token))
      nil
    end

    # Removes every label in this fiber. Returns the token for restore_labels.
    def clear_labels
      Labels.switch(0)
    end

    # The labels in force in this fiber: a frozen Hash of Strings.
    def labels
      Labels.current
    end
  end
end
