# frozen_string_literal: true

# Heapscope::Pprof checked against the reference: profiles written by Go's runtime/pprof, profiles
# rewritten by `go tool pprof -proto`, and our own to_pprof output read back by `go tool pprof -raw`.

require_relative "test_report_helper"

class TestPprofReader < Minitest::Test
  include ReportHelper
  Pprof = Heapscope::Pprof

  # One Go profile for the whole class: `go run` is the slow part.
  def self.go_profile_bytes
    @go_profile_bytes ||= Dir.mktmpdir("heapscope-go") { |dir| File.binread(ReportHelper.go_heap_profile(dir)) }
  end

  def setup
    @dir = Dir.mktmpdir("heapscope-pprof")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def go_path
    path = File.join(@dir, "go.pb.gz")
    File.binwrite(path, self.class.go_profile_bytes)
    path
  end

  def test_reads_go_heap_profile
    prof = Pprof.read(go_path)
    Pprof.validate!(prof)
    assert_equal HEAPSCOPE_TYPES, prof.sample_types
    assert_nil prof.default_sample_type
    assert_equal %w[space bytes], prof.period_type
    assert_equal 1, prof.period
    assert_operator prof.time_nanos, :>, 1_500_000_000 * 10**9
    assert_equal 2, prof.sample_index("inuse_objects")
    assert_nil prof.sample_index("nope")

    # leakyAlloc keeps 1000 x 4 KiB alive: the biggest live site, leaf first, with main.main as caller.
    top = prof.samples.max_by { |s| s.value("inuse_space") }
    assert_equal "main.leakyAlloc", top.frames.first.function
    assert_match %r{main\.go\z}, top.frames.first.file
    assert_equal "main.main", top.frames[1].function
    leaky = prof.samples.select { |s| s.frames.first.function == "main.leakyAlloc" }
    # (The same line also grows the keep slice: those samples carry other "bytes" labels.)
    buffers = leaky.select { |s| s.labels["bytes"] == 4096 }
    assert_equal 1000 * 4096, buffers.sum { |s| s.value("inuse_space") }
    assert_equal 1000, buffers.sum { |s| s.value(2) }
    # Go's num label "bytes" comes back as an Integer.
    assert(leaky.all? { |s| s.labels["bytes"].is_a?(Integer) })

    # churnAlloc's buffers are dead: allocated, not in use.
    # (Go's runtime sometimes charges a small allocation of its own to the same function, with another
    # "bytes" label: count the 512-byte buffers only.)
    churn = prof.samples.select { |s| s.frames.first.function == "main.churnAlloc" && s.labels["bytes"] == 512 }
    assert_equal 1000 * 512, churn.sum { |s| s.value("alloc_space") }
    assert_operator churn.sum { |s| s.value("inuse_space") }, :<=, 512
  end

  def test_agrees_with_go_tool_pprof_raw_on_go_profile
    path = go_path
    assert_equal sorted(parse_raw(go_pprof("-raw", path))), sorted(our_view(Pprof.read(path)))
  end

  def test_reads_profile_rewritten_by_go_tool_pprof_proto
    path = go_path
    rewritten = File.join(@dir, "rewritten.pb.gz")
    File.binwrite(rewritten, go_pprof("-proto", path))
    orig = Pprof.read(path)
    prof = Pprof.read(rewritten)
    Pprof.validate!(prof)
    assert_equal orig.sample_types, prof.sample_types
    %w[alloc_space inuse_space inuse_objects].each { |t| assert_equal orig.total(t), prof.total(t), t }
    assert_equal sorted(parse_raw(go_pprof("-raw", rewritten))), sorted(our_view(prof))
  end

  def test_raw_protobuf_without_gzip
    raw = Zlib.gunzip(self.class.go_profile_bytes)
    assert_equal Pprof.decode(self.class.go_profile_bytes).total("alloc_space"), Pprof.decode(raw).total("alloc_space")
  end

  def test_to_pprof_round_trip_through_go_tool_pprof
    prof = heapscope_profile([
                               [[["leak", "app.rb", 3], ["main", "app.rb", 9]], [10, 1000, 8, 800], { "class" => "String", "gc_age" => 4 }],
                               [[["churn", "app.rb", 5], ["main", "app.rb", 9]], [50, 4000, 0, 0], { "class" => "Array", "gc_age" => 0 }],
                               [[["leak", "app.rb", 3], ["main", "app.rb", 9]], [1, 40, -1, -40], { "class" => "Hash", "gc_age" => 1 }],
                             ], sample_every: 7)
    prof.default_sample_type = "inuse_space"
    prof.time_nanos = 1_700_000_000_000_000_000
    prof.duration_nanos = 5_000_000_000
    # An inlined location: lines[0] is the inlined callee, the last line the caller it was inlined into.
    leak, main = %w[leak main].map { |name| prof.functions.find { |f| f.name == name }.id }
    loc = Pprof::Location.new(prof.locations.map(&:id).max + 1, 0, 0,
                              [Pprof::Line.new(leak, 30), Pprof::Line.new(main, 31)], false)
    prof.locations << loc
    prof.reindex
    prof.samples << Pprof::Sample.new(prof, [loc.id], [1, 2, 3, 4], { "class" => "Object" })

    path = File.join(@dir, "ours.pb.gz")
    File.binwrite(path, prof.to_pprof)
    back = Pprof.read(path)
    Pprof.validate!(back)
    assert_equal ["", "alloc_objects"], back.string_table.first(2)
    assert_equal "inuse_space", back.default_sample_type
    assert_equal ["heapscope sample_every=7"], back.comments
    assert_equal [1_700_000_000_000_000_000, 5_000_000_000], [back.time_nanos, back.duration_nanos]
    assert_equal({ "class" => "String", "gc_age" => 4 }, back.samples[0].labels)
    assert_equal [1, 40, -1, -40], back.samples[2].values
    assert_equal %w[leak main], back.samples[3].frames.map(&:function)
    assert_equal [30, 31], back.samples[3].frames.map(&:line)

    go = parse_raw(go_pprof("-raw", path))
    assert_equal sorted(go), sorted(our_view(back))
    assert_equal ["leak app.rb:30", "main app.rb:31"], go[:samples].last[:frames]
    # Raw output too, and decoding our bytes twice is stable.
    assert_equal prof.to_pprof(gzip: false), back.to_pprof(gzip: false)
  end

  def test_packed_and_unpacked_repeated_fields
    w = Pprof::Wire::Writer
    value_type = w.new.tap { |v| v.int(1, 1); v.int(2, 2) }
    line = w.new.tap { |l| l.int(1, 1); l.int(2, 12) }
    loc = w.new.tap { |l| l.int(1, 1); l.message(4, line) }
    fn = w.new.tap { |f| f.int(1, 1); f.int(2, 3); f.int(4, 4) }
    # Values unpacked (one key each, as old writers do), location ids packed.
    sample = w.new.tap { |s| s.packed(1, [1, 1]); s.int(2, 5); s.int(2, -6) }
    top = w.new
    top.message(1, value_type)
    top.message(1, value_type)
    top.message(2, sample)
    top.message(4, loc)
    top.message(5, fn)
    top.int(13, 3) # a comment, unpacked
    top.key(99, 5) # an unknown fixed32 field: skipped
    top.buf << "abcd"
    ["", "objects", "count", "f", "f.rb"].each { |s| top.bytes(6, s) }
    prof = Pprof.decode(top.buf)
    Pprof.validate!(prof)
    assert_equal [5, -6], prof.samples.first.values
    assert_equal ["f f.rb:12", "f f.rb:12"], prof.samples.first.frames.map(&:to_s)
    assert_equal ["f"], prof.comments
  end

  def test_subtract
    base = heapscope_profile([
                               [[["grow", "a.rb", 1]], [10, 100, 10, 100], { "class" => "String" }],
                               [[["same", "a.rb", 2]], [5, 50, 5, 50], { "class" => "String" }],
                               [[["gone", "a.rb", 3], ["main", "a.rb", 9]], [7, 70, 7, 70], { "class" => "Array" }],
                             ], time_nanos: 1)
    newer = heapscope_profile([
                                [[["same", "a.rb", 2]], [5, 50, 5, 50], { "class" => "String" }],
                                [[["grow", "a.rb", 1]], [30, 300, 25, 250], { "class" => "String" }],
                                [[["grow", "a.rb", 1]], [1, 10, 1, 10], { "class" => "Hash" }],
                              ], time_nanos: 2)
    delta = Pprof.subtract(newer, base)
    Pprof.validate!(delta)
    rows = delta.samples.map { |s| [s.frames.map(&:function), s.labels, s.values] }
    assert_equal [
      [["grow"], { "class" => "String" }, [20, 200, 15, 150]],
      [["grow"], { "class" => "Hash" }, [1, 10, 1, 10]],
      [%w[gone main], { "class" => "Array" }, [-7, -70, -7, -70]],
    ], rows
    assert_equal 2, delta.time_nanos
    back = Pprof.decode(delta.to_pprof)
    Pprof.validate!(back)
    assert_equal rows, back.samples.map { |s| [s.frames.map(&:function), s.labels, s.values] }
  end

  def test_missing_file
    e = assert_raises(Pprof::DecodeError) { Pprof.read(File.join(@dir, "nope.pb.gz")) }
    assert_equal "#{File.join(@dir, "nope.pb.gz")}: no such file", e.message
  end

  def test_error_messages
    good = Zlib.gunzip(self.class.go_profile_bytes)
    cases = {
      "" => /\Aempty input/,
      "hello, this is a text file\n" => /\Anot gzip or pprof protobuf data \(bad wire type/,
      good.byteslice(0, good.bytesize - 3) => /\Anot gzip or pprof protobuf data \(truncated: field 6 of Profile/,
      self.class.go_profile_bytes.byteslice(0, 200) => /\Atruncated gzip data\z/,
      "\x1f\x8b\x08\x00garbage-garbage-garbage".b => /\Abad gzip data/,
      "\x48\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01".b => /varint longer than 10 bytes/,
      "\x0a\x02\x08\x05\x32\x00".b => /ValueType\.type refers to string 5, but the string table has 1/,
      "\x0b".b => /bad wire type 3 for field 1 of Profile/,
      "\x08\x01".b => /bad wire type 0 for field 1 of Profile \(want 2\)/,
      "\x48\x01".b => /no string table/,
    }
    cases.each do |bytes, pattern|
      e = assert_raises(Pprof::DecodeError, bytes.inspect) { Pprof.decode(bytes) }
      assert_match pattern, e.message, bytes.inspect[0, 60]
      refute_includes e.message, "\n"
    end
    path = File.join(@dir, "bad.pb.gz")
    File.binwrite(path, "hello")
    e = assert_raises(Pprof::DecodeError) { Pprof.read(path) }
    assert_match(/\A#{Regexp.escape(path)}: not gzip or pprof protobuf data/, e.message)
    e = assert_raises(Pprof::DecodeError) { Pprof.read(@dir) }
    assert_equal "#{@dir}: is a directory", e.message
  end

  def test_validate
    fresh = -> { Pprof.decode(heapscope_profile([[[["f", "a.rb", 1], ["g", "a.rb", 2]], [1, 2, 3, 4]]]).to_pprof) }
    assert Pprof.validate!(fresh.call)
    breakers = {
      "string_table[0] is \"x\", must be \"\"" => ->(p) { p.string_table[0] = "x" },
      "location id 0 is reserved (ids start at 1)" => ->(p) { p.locations[0].id = 0 },
      "duplicate location id 2" => ->(p) { p.locations[0].id = 2 },
      "function id 0 is reserved (ids start at 1)" => ->(p) { p.functions[1].id = 0 },
      "duplicate function id 1" => ->(p) { p.functions[1].id = 1 },
      "mapping id 0 is reserved (ids start at 1)" => ->(p) { p.mappings << Pprof::Mapping.new(0) },
      "duplicate mapping id 1" => ->(p) { 2.times { p.mappings << Pprof::Mapping.new(1) } },
      "location 1 refers to unknown mapping 3" => ->(p) { p.locations[0].mapping_id = 3 },
      "sample 0 refers to unknown location 9" => ->(p) { p.samples[0].location_ids << 9 },
      "location 2 refers to unknown function 7" => ->(p) { p.locations[1].lines[0].function_id = 7 },
      "sample 0 has 3 values, but there are 4 sample types" => ->(p) { p.samples[0].values.pop },
    }
    breakers.each do |message, breaker|
      prof = fresh.call
      breaker.call(prof)
      e = assert_raises(Pprof::DecodeError, message) { Pprof.validate!(prof) }
      assert_equal message, e.message
    end
  end

  def test_sample_value_by_name
    prof = heapscope_profile([[[["f", "a.rb", 1]], [1, 2, 3, 4]]])
    s = prof.samples.first
    assert_equal 4, s.value("inuse_space")
    assert_equal 4, s.value(:inuse_space)
    assert_equal 2, s.value(1)
    e = assert_raises(KeyError) { s.value("cpu") }
    assert_match(/no sample type "cpu"/, e.message)
  end

  def test_does_not_load_the_extension
    out = run!({}, RbConfig.ruby, "-Ilib", "-e",
               'require "heapscope/pprof"; print defined?(Heapscope::Native).inspect, " ", $LOADED_FEATURES.grep(/heapscope\.so/).size')
    assert_equal "nil 0", out
  end

  private

  # `go tool pprof` drops samples whose values are all zero (Go writes some), so compare without them.
  def sorted(view)
    samples = view[:samples].reject { |s| s[:values].all?(&:zero?) }
    { sample_types: view[:sample_types], samples: samples.sort_by(&:inspect) }
  end
end
