# Workloads for bench/jit_windows.rb. No frozen_string_literal comment on purpose: a string literal is then
# a new String each time it runs (chilled on Ruby 3.4+), which is one of the allocations a JIT inlines.
#
# A method JIT (ZJIT) compiles methods and blocks that are called often, and only enters compiled code at a
# call: a loop that runs once in one long call is never compiled. So every workload is a short method
# called many times, each call allocating about 100 objects.
module JitWindows
  module Work
    module_function

    # Object.new: the allocation ZJIT inlines when the class's allocator is the default one.
    def objects
      i = 0
      while i < 100
        Object.new
        i += 1
      end
      i
    end

    # String literals (chilled copies), interpolation and concatenation.
    def strings
      i = 0
      while i < 25
        s = "user-"
        s = "#{s}#{i}"
        s += "@example.com"
        s = "x" * 3 if s.empty?
        i += 1
      end
      i
    end

    # Array and Hash literals: a literal of constants (duparray), one of variables (newarray), a small Hash.
    # Each is used (an unused literal is compiled away).
    def literals
      i = 0
      n = 0
      while i < 34
        a = [1, 2, 3]
        b = [i, i + 1]
        h = { "id" => i, "n" => 2 }
        n += a.size + b.size + h.size
        i += 1
      end
      n
    end

    # A JSON-like record: hashes, arrays and strings of several sizes, nested (about 100 objects per call).
    TAGS = %w[ruby heap profiler].freeze
    def records
      k = 0
      while k < 4
        rec = {
          "id" => k,
          "name" => "user-#{k}",
          "tags" => TAGS.map { |t| "#{t}:#{k}" },
          "address" => { "street" => "#{k} Main St", "city" => "Springfield" },
          "history" => [{ "at" => 1_700_000_000 + k, "event" => "login" }],
        }
        rec.to_a.flatten(1).size
        k += 1
      end
      k
    end

    NAMES = %w[objects strings literals records].freeze
  end
end
