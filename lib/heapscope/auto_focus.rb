# frozen_string_literal: true

module Heapscope
  # Automatic focus: a long-running process's own leak detector turns denser sampling on where a decision
  # is about to be made. Each profile's census (what the VM holds exactly, per class) is one observation;
  # a class whose exact live bytes kept growing over the last observations is a suspect and gets one of
  # SLOTS focus strata (focus.rb) at 1 in sample_every / DENSER; when it stops growing it loses it. Its
  # samples from then on weigh the denser rate, so its sites' error bars narrow by about sqrt(DENSER)
  # from the next profiles on, while the overhead budget still lowers every rate together.
  #
  # Why the census and not the samples: it is exact, so "kept growing" needs no error model, and it
  # costs nothing more (the profile took it anyway). It counts every object of a class, young churn
  # included, so growth is asked of every interval of the last HISTORY observations and of a least
  # amount (MIN_GROWTH bytes, MIN_RELATIVE of the class): a class that only fluctuates does not rise
  # RISES times in a row. HISTORY is short because the decision should come while the process is still
  # worth looking at (with 60 s periodic files, focus engages after 4 minutes of growth).
  #
  # Profiles carry every change (`heapscope auto_focus:` comment lines, the last MAX_LOG) and the
  # strata in force (`heapscope focus: ... state=auto`); Heapscope.stats[:auto_focus] has both.
  # Heapscope.start(auto_focus: false) or HEAPSCOPE_AUTO_FOCUS=0 turns it off.
  class AutoFocus
    SLOTS = 8
    HISTORY = 4          # observations per class the decision reads
    RISES = 3            # of the HISTORY - 1 intervals, this many rose
    MIN_GROWTH = 256 * 1024
    MIN_RELATIVE = 0.05  # and the growth over HISTORY is at least this share of where it started
    MIN_INTERVAL = 0.5   # seconds: profiles closer together than this are one observation
    DENSER = 10
    MAX_LOG = 20
    MAX_CLASSES = 10_000 # classes followed at once (the census lists those with samples and the biggest)
    CLASS_LINE = /\Aheapscope census class: objects=\d{1,20} bytes=(\d{1,20})(?: sq_bytes=\S{1,20})? type=T_[A-Z_]{1,24} name=(.+)\z/.freeze

    # first_index: the first of the SLOTS strata given to Native._start for automatic focus; rate: the
    # focused rate (1 in N); taken: names focused by the operator (never touched here); resolve: name ->
    # Class or nil (Focus.lookup).
    def initialize(first_index:, rate:, taken:, resolve:)
      @first_index = first_index
      @rate = rate
      @taken = taken
      @resolve = resolve
      @series = {} # name -> [bytes, ...] (the last HISTORY observations, oldest first)
      @slots = Array.new(SLOTS) # name focused in each slot, or nil
      @log = []
      @last_at = nil
      # Profiles come from several threads (the periodic writer, the listener's workers, the pusher).
      @lock = Mutex.new
    end

    # Reads one profile's census lines (Native._last_census) taken at monotonic time now, then focuses
    # the suspects and lets go of classes that stopped growing. Returns the changes made.
    def observe(census_text, now)
      @lock.synchronize { observe_locked(census_text, now) }
    end

    # [[name, slot index], ...] of the classes focused now.
    def active
      @lock.synchronize { @slots.each_with_index.filter_map { |name, i| [name, @first_index + i] if name } }
    end

    # The changes kept (the last MAX_LOG), oldest first.
    def log
      @lock.synchronize { @log.map(&:dup) }
    end

    # The profile's comment lines: every change kept, oldest first.
    def comments
      log.map do |c|
        "heapscope auto_focus: at=#{c[:at]} action=#{c[:action]} rate=#{c[:rate]} growth=#{c[:growth]} " \
          "rises=#{c[:rises]} class=#{c[:class]}\n"
      end.join
    end

    private

    def observe_locked(census_text, now)
      return [] if census_text.nil? || (@last_at && now - @last_at < MIN_INTERVAL)

      @last_at = now
      seen = census(census_text)
      (@series.keys - seen.keys).each { |name| @series[name] << 0 } # gone from the census: nothing left
      seen.each { |name, bytes| (@series[name] ||= []) << bytes }
      @series.each_value { |values| values.shift while values.size > HISTORY }
      @series.select! { |_, values| values.any?(&:positive?) }
      changes = release + engage
      @log.concat(changes)
      @log.shift(@log.size - MAX_LOG) if @log.size > MAX_LOG
      changes
    end

    def census(text)
      out = {}
      text.each_line do |line|
        m = CLASS_LINE.match(line.chomp) or next
        out[m[2]] = m[1].to_i
        break if out.size >= MAX_CLASSES
      end
      out
    end

    # [rises, growth] over a class's observations.
    def trend(values)
      rises = values.each_cons(2).count { |a, b| b > a }
      [rises, values.last - values.first]
    end

    def growing?(values)
      return false if values.size < HISTORY

      rises, growth = trend(values)
      rises >= RISES && growth >= MIN_GROWTH && growth >= MIN_RELATIVE * [values.first, 1].max
    end

    # Classes focused whose last HISTORY - 1 intervals no longer grew (or grew once and fell back): their
    # slots go back.
    def release
      @slots.each_with_index.filter_map do |name, i|
        next unless name

        values = @series[name] || [0]
        rises, growth = trend(values.last(HISTORY))
        next if growth.positive? && rises >= 1

        Native._focus_change(@first_index + i, nil, @rate)
        @slots[i] = nil
        change("release", name, values)
      end
    end

    # Suspects, biggest growth first, into the free slots.
    def engage
      free = @slots.each_index.select { |i| @slots[i].nil? }
      return [] if free.empty?

      suspects = @series.select { |name, values| !@slots.include?(name) && !@taken.include?(name) && growing?(values) }
      suspects.sort_by { |name, values| [-(values.last - values.first), name] }.filter_map do |name, values|
        next if free.empty?

        klass = @resolve.call(name)
        next unless Class === klass

        i = free.first
        next unless Native._focus_change(@first_index + i, klass, @rate)

        free.shift
        @slots[i] = name
        change("focus", name, values)
      end
    end

    def change(action, name, values)
      rises, growth = trend(values)
      { at: Time.now.utc.strftime("%Y-%m-%dT%H:%M:%SZ"), action: action, rate: @rate, growth: growth, rises: rises, class: name }
    end
  end
end
