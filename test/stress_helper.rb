# frozen_string_literal: true

require "fileutils"
require "open3"
require "rbconfig"
require "tempfile"

# Stress cells (test_stress_*.rb): every cell runs in its own Ruby process, so a crash (SIGSEGV, abort,
# a [BUG]) fails that cell instead of killing the test runner. Each cell checks its own invariants and
# prints "OK <details>"; run_cell checks the exit status and that line.
module StressCells
  ROOT = File.expand_path("..", __dir__)
  LONG = ENV["HEAPSCOPE_STRESS_LONG"] == "1"
  SCALE = LONG ? 10 : 1

  # Loaded by every cell before its body.
  PRELUDE = <<~'RUBY'
    # frozen_string_literal: false
    require "heapscope"
    require "heapscope/pprof"
    require "objspace"
    require "stringio"
    SCALE = SCALE_VALUE
    $stdout.sync = true

    # Starts the oracle's allocation tracing (see compare_with_objectspace), from here so that what it
    # allocates is not on a line of the cell's body.
    def start_oracle
      ObjectSpace.trace_object_allocations_start
    end

    def check(cond, message)
      raise "cell check failed: #{message}" unless cond
    end

    # GC.verify_compaction_references toward an emptied heap (3.3+: expand_heap; 3.1: double_heap).
    def verify_compaction
      GC.verify_compaction_references(expand_heap: true, toward: :empty)
    rescue ArgumentError
      GC.verify_compaction_references(double_heap: true, toward: :empty)
    end

    # The block must raise klass with a message that includes text.
    def check_raises(klass, text)
      yield
      check(false, "expected #{klass} (#{text}), nothing raised")
    rescue klass => e
      check(e.message.include?(text), e.message)
    end

    # A profile taken as the cell's GC.stress setting has it, then decoded with GC.stress off: reading
    # it is the test's work, not heapscope's, and under stress each of the Ruby decoder's allocations
    # is a full GC (over a minute a profile on a loaded Ruby 3.4, which timed a cell out in CI).
    def decoded(**options)
      raw = Heapscope.profile(**options)
      stress = GC.stress
      GC.stress = false
      prof = Heapscope::Pprof.decode(raw)
      Heapscope::Pprof.validate!(prof)
      prof
    ensure
      GC.stress = stress if stress
    end

    FILE = File.expand_path(__FILE__)
    BODY_LINE = PRELUDE_LINES + 2 # the cell's body follows the prelude and one empty line

    # inuse_objects per [leaf line, class label] for samples allocated in the cell's body.
    def live_by_line_and_class(prof)
      counts = Hash.new(0)
      prof.samples.each do |s|
        leaf = s.frames.first
        next unless leaf && leaf.file == FILE && leaf.line >= BODY_LINE
        counts[[leaf.line, s.labels["class"]]] += s.value("inuse_objects")
      end
      counts
    end

    # Takes a profile after a GC and compares it, per [line, class], with the oracle: the live objects
    # of classes that ObjectSpace's allocation tracing (on since the cell began, so no stale entries
    # for reused slots) says were allocated at that line. Class.new also allocates the class's
    # metaclass, a hidden object ObjectSpace does not list; it is labelled Class too: each counts 2.
    # Returns [profile, groups]: groups maps [line, class] to the objects counted, so a later
    # comparison (compare_with_groups) can reuse them: ObjectSpace's allocation table does not follow
    # objects moved by compaction, and holding them keeps the counts stable.
    def compare_with_objectspace(classes, label = "profile", bytes: false)
      GC.start
      GC.disable # nothing may die between the count and the profile
      groups = Hash.new { |h, k| h[k] = [] }
      classes.each do |k|
        ObjectSpace.each_object(k) do |o|
          next unless o.class == k
          line = ObjectSpace.allocation_sourceline(o)
          groups[[line, k.name]] << o if line && line >= BODY_LINE && ObjectSpace.allocation_sourcefile(o) == FILE
        end
      end
      GC.enable
      names = classes.map(&:name)
      prof = compare_with_groups(groups, label, bytes: bytes, others: names)
      [prof, groups]
    end

    # Compares a fresh profile with groups ([line, class] -> objects): counts (a Class counts 2: its
    # metaclass, hidden from ObjectSpace, is labelled Class too) and, with bytes, inuse_space against
    # memsize_of (Class left out: reading a metaclass from Ruby creates its own metaclass). others:
    # class names whose samples at body lines outside groups must not exist.
    def compare_with_groups(groups, label, bytes: false, others: [])
      prof = decoded(gc: true)
      got = Hash.new(0)
      got_bytes = Hash.new(0)
      prof.samples.each do |s|
        leaf = s.frames.first
        next unless leaf && leaf.file == FILE && leaf.line >= BODY_LINE
        got[[leaf.line, s.labels["class"]]] += s.value("inuse_objects")
        got_bytes[[leaf.line, s.labels["class"]]] += s.value("inuse_space")
      end
      want = groups.transform_values { |os| os.sum { |o| o.instance_of?(Class) ? 2 : 1 } }
      keys = want.keys | got.keys.select { |k, _| others.include?(k[1]) && got[k] > 0 }
      src = File.readlines(FILE)
      bad = keys.reject { |k| want.fetch(k, 0) == got[k] }
      check(bad.empty?, "#{label} vs ObjectSpace ([line, class], want, got, source): " +
                        bad.sort.first(12).map { |k| [k, want[k], got[k], src[k[0] - 1].strip] }.inspect)
      if bytes
        bad = groups.reject { |(_, klass), _| klass == "Class" }.filter_map do |k, os|
          size = os.sum { |o| ObjectSpace.memsize_of(o) }
          [k, size, got_bytes[k]] if size != got_bytes[k]
        end
        check(bad.empty?, "#{label}: inuse_space vs memsize_of ([line, class], want, got): #{bad.first(12).inspect}")
      end
      prof
    end

    def assert_clean
      stats = Heapscope.stats
      check(stats[:invalid_records] == 0, "invalid_records #{stats[:invalid_records]}")
      check(stats[:gc_runs_missed] == 0, "gc_runs_missed #{stats[:gc_runs_missed]}")
      check(stats[:dropped] == 0, "dropped #{stats[:dropped]}")
    end
  RUBY

  # Open3.capture3 with a deadline: on expiry the cell's whole process group (forked children too) is
  # killed and the test fails with what it printed so far.
  def capture_with_timeout(seconds, env, *cmd)
    Open3.popen3(env, *cmd, pgroup: true) do |stdin, stdout, stderr, wait|
      stdin.close
      readers = [stdout, stderr].map { |io| Thread.new { io.read } }
      unless wait.join(seconds)
        Process.kill(:KILL, -wait.pid) rescue Errno::ESRCH # rubocop:disable Style/RescueModifier
        wait.join
        flunk "cell timed out after #{seconds} s and was killed\n--- stdout\n#{readers[0].value}\n--- stderr\n#{readers[1].value}"
      end
      [readers[0].value, readers[1].value, wait.value]
    end
  end

  # Runs body (Ruby source) in a child process with PRELUDE; returns the "OK ..." line.
  def run_cell(name, body, timeout: 120)
    Tempfile.create(["stress_#{name}_", ".rb"]) do |f|
      f.write(PRELUDE.sub("PRELUDE_LINES", PRELUDE.lines.size.to_s).sub("SCALE_VALUE", SCALE.to_s), "\n", body)
      f.flush
      out, err, status = capture_with_timeout(timeout * SCALE, { "RUBYOPT" => nil }, RbConfig.ruby, "-I", File.join(ROOT, "lib"), f.path)
      unless status.success?
        # Keep the failing cell, and Ruby's whole crash report, for a rerun by hand.
        kept = File.join(ROOT, "tmp/stress_failures")
        FileUtils.mkdir_p(kept)
        FileUtils.cp(f.path, File.join(kept, "#{name}.rb"))
        File.write(File.join(kept, "#{name}.stderr"), err)
      end
      relevant = err.lines.reject { |l| l.match?(/\A\h+-\h+ [r-][w-][x-]/) } # drop the memory map of a crash report
      detail = "cell #{name}: #{status.inspect} (script and stderr kept in tmp/stress_failures/)\n" \
               "--- stdout\n#{out}\n--- stderr\n#{relevant.first(60).join}"
      assert status.success?, detail
      ok = out.lines.grep(/\AOK\b/).last
      assert ok, detail
      $stdout.puts("\n  #{name}: #{ok}") if ENV["HEAPSCOPE_STRESS_VERBOSE"]
      ok
    end
  end
end
