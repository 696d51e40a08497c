# frozen_string_literal: true

require "json"

module Heapscope
  module Report
    # Escape makes strings from a profile (function and file names, class labels, sample type names,
    # comments) and from the file system (paths found in a directory) safe for each place a report puts
    # them. A profile is input like any other: whoever wrote it chose those bytes.
    #
    #   scrub     invalid UTF-8 -> "\xNN" text, so every later step (JSON, HTML, regexps) sees valid
    #             strings. heapscope's own profiles can hold such bytes (Ruby allows them in method names
    #             and paths), so they are shown, not refused.
    #   terminal  control characters (ESC, CR, LF, ...), C1 controls, bidi overrides and line separators
    #             -> visible escapes: a name cannot move the cursor, recolour or retitle the terminal, or
    #             fake a row of the table.
    #   json      JSON for a terminal: the same characters as \uXXXX (JSON escapes only C0 itself).
    #   script_json  JSON embedded in a <script> element: <, >, & and U+2028/2029 as \uXXXX, so no
    #             "</script>", "<!--" or "<script" can end or re-open the element (the HTML parser looks
    #             for those inside scripts, whatever the script's type).
    module Escape
      # C0 controls and DEL, the C1 controls (some terminals take U+009B as CSI), the line and paragraph
      # separators, and the bidi embedding, override and isolate controls (they reorder what is shown).
      TERMINAL = /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/.freeze
      NAMED = { "\n" => "\\n", "\r" => "\\r", "\t" => "\\t", "\e" => "\\e" }.freeze
      JSON_TERMINAL = /[\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/.freeze
      SCRIPT = /[<>&\u2028\u2029]/.freeze

      module_function

      # Returns s as valid UTF-8, invalid bytes written as \xNN.
      def scrub(s)
        s = s.to_s
        s = s.dup.force_encoding(Encoding::UTF_8) unless s.encoding == Encoding::UTF_8
        return s if s.valid_encoding?

        s.scrub { |bytes| bytes.unpack("C*").map { |b| format("\\x%02X", b) }.join }
      end

      # Returns s with every character that a terminal would act on written as an escape.
      def terminal(s)
        s = scrub(s)
        return s unless s.match?(TERMINAL)

        s.gsub(TERMINAL) do |c|
          NAMED[c] || (c.ord < 0x80 ? format("\\x%02X", c.ord) : format("\\u%04X", c.ord))
        end
      end

      # Pretty JSON that is safe to print on a terminal (still valid JSON: these characters can only
      # occur inside strings, where \uXXXX means the same).
      def json(data)
        JSON.pretty_generate(deep_scrub(data)).gsub(JSON_TERMINAL) { |c| format("\\u%04x", c.ord) }
      end

      # JSON that can sit between <script> and </script> (and still parses to the same data).
      def script_json(data)
        JSON.generate(deep_scrub(data)).gsub(SCRIPT) { |c| format("\\u%04x", c.ord) }
      end

      # data with every String scrubbed (JSON refuses invalid UTF-8; paths from the command line or a
      # directory listing are not checked anywhere else).
      def deep_scrub(data)
        case data
        when String then scrub(data)
        when Array then data.map { |v| deep_scrub(v) }
        when Hash then data.to_h { |k, v| [deep_scrub(k), deep_scrub(v)] }
        else data
        end
      end
    end
  end
end
