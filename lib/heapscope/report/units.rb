# frozen_string_literal: true

module Heapscope
  module Report
    # Units formats values for people: bytes in binary units (KiB, MiB), counts with k/M suffixes, shares
    # as percentages. Every report uses it, so a number looks the same in top, diff and leaks.
    module Units
      BYTE_UNITS = %w[B KiB MiB GiB TiB].freeze
      COUNT_UNITS = ["", "k", "M", "G", "T"].freeze

      module_function

      # Formats a value of a pprof unit ("bytes", "count", or anything else, printed as a plain number).
      def format(value, unit)
        case unit
        when "bytes" then bytes(value)
        when "count", "objects" then count(value)
        else value.to_s
        end
      end

      # 1536 -> "1.5 KiB"; values below 1 KiB stay exact ("512 B").
      def bytes(value)
        scaled(value, 1024.0, BYTE_UNITS, " ")
      end

      # 12345 -> "12.3k"; below 1000 exact.
      def count(value)
        scaled(value, 1000.0, COUNT_UNITS, "")
      end

      # part/whole as "12.3%" ("-" when whole is zero).
      def percent(part, whole)
        return "-" if whole.nil? || whole.zero?

        Kernel.format("%.1f%%", 100.0 * part / whole)
      end

      # A relative error (0.05) as "±5%"; nil (unknown) as "?". Only an error that is exactly 0 prints
      # "0%" (every object counted): a small nonzero one keeps a digit ("±0.4%") or says "<0.1%", never
      # rounds to 0, so a sampled estimate never looks exact.
      def error(rel)
        return "?" if rel.nil?
        return ">100%" if rel > 1
        return "0%" if rel.zero?
        return "<0.1%" if rel < 0.001

        rel < 0.01 ? Kernel.format("±%.1f%%", 100 * rel) : Kernel.format("±%.0f%%", 100 * rel)
      end

      # An absolute error as "±1.5 KiB"; nil as "?"; a nonzero one that rounds to nothing as "±<1 B".
      def abs_error(err, unit)
        return "?" if err.nil?
        return "±<1#{unit == "bytes" ? " B" : ""}" if err.positive? && err < 0.5

        "±#{format(err.round, unit)}"
      end

      # x rounded to 4 significant digits, for JSON: a small error stays nonzero (round(4) made 3e-5 a 0).
      def significant(x, digits = 4)
        return x if x.nil? || x.zero? || !x.finite?

        x.round(digits - 1 - Math.log10(x.abs).floor)
      end

      # A fraction (0.04) as a percentage with up to 3 significant digits ("4%", "2.5%").
      def share(fraction)
        "#{Kernel.format("%.3g", 100.0 * fraction)}%"
      end

      # A number with a sign, for growth: "+1.5 KiB", "-3".
      def signed(value, unit)
        (value.positive? ? "+" : "") + format(value, unit)
      end

      def scaled(value, base, units, sep)
        sign = value.negative? ? "-" : ""
        v = value.abs.to_f
        i = 0
        while v >= base && i < units.size - 1
          v /= base
          i += 1
        end
        return "#{sign}#{value.abs.round}#{sep}#{units[0]}".rstrip if i.zero?

        digits = v >= 100 ? 0 : 1
        "#{sign}#{Kernel.format("%.#{digits}f", v)}#{sep}#{units[i]}"
      end
    end
  end
end
