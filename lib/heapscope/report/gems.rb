# frozen_string_literal: true

require "rbconfig"

module Heapscope
  module Report
    # Gems names the group a source file belongs to, for --by gem (Sites):
    #
    #   "NAME VERSION"   a file in an installed gem: a path with /gems/NAME-VERSION/ in it (VERSION starts
    #                    with a digit; a platform suffix such as -x86_64-linux is dropped)
    #   "NAME git:REV"   a file in a Bundler git checkout (/bundler/gems/NAME-REV/)
    #   "(stdlib)"       Ruby's standard library and what the Ruby installation ships beside it (RubyGems,
    #                    which Debian keeps in vendor_ruby, and the default gems)
    #   "(ruby)"         Ruby's own code without a library file: <internal:...> frames (Kernel#tap,
    #                    Array#each on newer Rubies), and C functions no Ruby frame called
    #   "(app)"          every other file: the application's own, -e, eval'd code, gems loaded with path:
    #
    # Only the path is read, not this machine's Gem.path: a profile is often read on another machine than
    # the one it was taken on, where the gems live elsewhere. Every directory of Gem.path keeps its gems
    # as DIR/gems/NAME-VERSION/, so the same shape finds them on both machines (and in a vendored
    # bundle, vendor/bundle/ruby/3.3.0/gems/NAME-VERSION/). This Ruby's own library directories are
    # checked besides the usual shape (.../lib/ruby/3.3.0/), for installations laid out otherwise.
    module Gems
      APP = "(app)"
      STDLIB = "(stdlib)"
      RUBY = "(ruby)"
      # The groups that never decide a sample's gem while a frame of another group is in its stack.
      OWN = [STDLIB, RUBY].freeze

      # The greedy .* makes the innermost gem win (a gem vendored inside another's directory, an app whose
      # own path happens to hold a gems/ directory); the greedy name keeps "net-http-0.4.1" one name.
      GIT = %r{.*/bundler/gems/([^/]+)-(\h{7,40})/}
      GEM = %r{.*/gems/([^/]+)-(\d[^/-]*)(?:-[^/]+)?/}
      # Ruby's library by the shape of its path: PREFIX/lib/ruby/3.3.0/ (rubylibdir),
      # PREFIX/lib/x86_64-linux-gnu/ruby/3.3.0/ (Debian's rubyarchdir), .../ruby/vendor_ruby/.
      STDLIB_SHAPE = %r{/lib/(?:[^/]+/)?ruby/(?:\d+\.\d+\.\d+|vendor_ruby)/}
      LOCAL = RbConfig::CONFIG.values_at("rubylibdir", "rubyarchdir", "vendordir")
                              .reject { |d| d.nil? || d.empty? }.map { |d| "#{d}/" }.freeze

      module_function

      # Longer file names are no path a Ruby made (PATH_MAX is 4096): grouped as the app's without
      # matching, so a hostile profile's long names cannot make the backtracking patterns above slow.
      MAX_PATH = 4096

      # The group of a frame's file ("" or nil: a frame without a file).
      def group(file)
        return RUBY if file.nil? || file.empty? || file.start_with?("<internal:")
        return APP if file.bytesize > MAX_PATH

        if (m = GIT.match(file))
          "#{m[1]} git:#{m[2]}"
        elsif (m = GEM.match(file))
          "#{m[1]} #{m[2]}"
        elsif file.match?(STDLIB_SHAPE) || LOCAL.any? { |d| file.start_with?(d) }
          STDLIB
        else
          APP
        end
      end

      def own?(group)
        OWN.include?(group)
      end
    end
  end
end
