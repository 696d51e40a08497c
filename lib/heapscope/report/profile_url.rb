# frozen_string_literal: true

require "uri"
require "heapscope/report/http_fetch"
require "heapscope/report/sites"
require "heapscope/surfaces/rack_prefix"

module Heapscope
  module Report
    # ProfileUrl lets the readers (top, flamegraph, diff, leaks) take an http(s) URL wherever they take
    # a file: heapscope's endpoints and any pprof heap endpoint (Go's net/http/pprof among them).
    #
    #   heapscope top http://127.0.0.1:3101/debug/pprof/heap
    #   heapscope top http://127.0.0.1:3101                  # the same: a bare server means its heap
    #   heapscope leaks http://127.0.0.1:3101 http://127.0.0.1:3101   # two snapshots, fetched in turn
    #
    # The token is the listener's own variable, HEAPSCOPE_HTTP_TOKEN, sent as "Authorization: Bearer";
    # user:password@ in the URL is sent as Basic instead (a Rack mount behind basic auth) and never
    # shown. Fetching is HttpFetch's: one deadline (--timeout) for the whole exchange, a body of at most
    # --max-size bytes (the reading limit of files too), a body that does not start like a profile
    # refused at its first bytes. Every failure is one Error naming the URL.
    module ProfileUrl
      TOKEN_VARIABLE = "HEAPSCOPE_HTTP_TOKEN"
      DEFAULT_PATH = "#{Heapscope::Rack::PREFIX}/heap"

      module_function

      # True for an argument the readers fetch rather than open (a file named "http:..." is still a file
      # when it exists).
      def url?(arg)
        arg.to_s.match?(%r{\Ahttps?://}i) && !File.exist?(arg)
      end

      # The URI to GET: http://HOST:PORT and .../debug/pprof mean the heap profile; any other path and
      # the query (?gc=1, ?seconds=30) are kept as given.
      def parse(arg)
        uri = URI.parse(arg)
        raise Error, "#{display(arg)}: not an http:// or https:// URL with a host" unless uri.is_a?(URI::HTTP) && uri.host

        path = uri.path.to_s.chomp("/")
        uri.path = DEFAULT_PATH if path.empty? || path == Heapscope::Rack::PREFIX
        uri
      rescue URI::InvalidURIError => e
        raise Error, "#{display(arg)}: not a valid URL (#{e.message.sub(/\A.*?: /, "")})"
      end

      # arg as reports and messages show it: a password in it is replaced by ***.
      def display(arg)
        arg.to_s.sub(%r{\A(https?://[^/@:]*:)[^/@]*@}i, "\\1***@")
      end

      # A name for files made from the profile (flamegraph's default output): HOST_PORT-LAST, in the
      # current directory, e.g. 127.0.0.1_3101-heap.
      def file_stem(arg)
        uri = parse(arg)
        last = uri.path.split("/").reject(&:empty?).last || "heap"
        "#{uri.host}_#{uri.port}-#{last}".tr("^A-Za-z0-9._-", "_")
      end

      # Fetches and decodes the profile at arg. timeout: seconds; max_size: the reading limit (bytes,
      # the body's and the decompressed profile's). A profile without a time (a Go endpoint's has one;
      # a hand-made one may not) gets the time it was fetched, which is when it was a snapshot of.
      def load(arg, timeout:, max_size:)
        uri = parse(arg)
        name = display(arg)
        fetched_at = Time.now
        response = HttpFetch.new(uri, timeout: timeout, max_body: max_size, timeout_flag: "--timeout",
                                      size_flag: "--max-size", name: name, check_start: method(:check_start))
                            .get(auth_headers(uri))
        check_status(response, name)
        prof = Sites.decode(response.body, name, max_size: max_size)
        prof.time_nanos = (fetched_at.to_r * 1_000_000_000).to_i unless prof.time_nanos.to_i.positive?
        prof
      end

      def auth_headers(uri)
        return { "Authorization" => "Basic #{basic(uri)}" } if uri.user

        token = ENV[TOKEN_VARIABLE]
        token && !token.empty? ? { "Authorization" => "Bearer #{token}" } : {}
      end

      def basic(uri)
        ["#{URI.decode_www_form_component(uri.user)}:#{URI.decode_www_form_component(uri.password.to_s)}"].pack("m0")
      end

      # profile.proto's fields and their wire types (0 varint, 2 length-delimited); comment (13) is a
      # repeated int64, packed (2) or not (0).
      PROFILE_FIELDS = { 1 => [2], 2 => [2], 3 => [2], 4 => [2], 5 => [2], 6 => [2], 7 => [0], 8 => [0],
                         9 => [0], 10 => [0], 11 => [2], 12 => [0], 13 => [0, 2], 14 => [0] }.freeze

      # Refuses a profile body by its first bytes (HttpFetch's check_start): gzip, or raw profile.proto
      # whose fields, as far as the bytes go, are Profile's own with their wire types. Stricter than
      # Pprof.read's one key, as text passes that (an "x" is field 15, "h" field 13), so an endless
      # body of text or HTML is refused here, not after --max-size bytes.
      def check_start(bytes)
        return if bytes.start_with?(Pprof::GZIP_MAGIC)

        pos = 0
        while pos < bytes.bytesize
          key, pos = start_varint(bytes, pos)
          break unless key # cut by the end of the bytes so far

          not_a_profile(bytes) unless PROFILE_FIELDS[key >> 3]&.include?(key & 7)
          value, pos = start_varint(bytes, pos)
          break unless value

          pos += value if (key & 7) == 2 # skip the field's bytes; past the end ends the loop
        end
      end

      # [value, next position] of the varint at pos; [nil, _] if the bytes end inside it.
      def start_varint(bytes, pos)
        value = 0
        10.times do |i|
          return [nil, pos] if pos >= bytes.bytesize

          byte = bytes.getbyte(pos)
          pos += 1
          value |= (byte & 0x7f) << (7 * i)
          return [value, pos] if byte < 0x80
        end
        not_a_profile(bytes)
      end

      def not_a_profile(bytes)
        looks = bytes.lstrip.start_with?("<") ? "an HTML page" : "neither gzip nor profile.proto"
        raise HttpClient::ResponseError, "the answer is not a pprof profile (#{looks}, starts " \
                                         "#{bytes.byteslice(0, 24).inspect}; a heap profile is at #{DEFAULT_PATH})"
      end

      # A 2xx answer is the profile; anything else is one line with the status, the server's first line
      # of reason, and what to do for the usual ones.
      def check_status(response, name)
        return if response.code.between?(200, 299)

        reason = Escape.terminal(response.body.dup.force_encoding(Encoding::UTF_8).scrub.lines.first.to_s.strip[0, 200])
        hint =
          case response.code
          when 401, 403
            ENV[TOKEN_VARIABLE].to_s.empty? ? " (set #{TOKEN_VARIABLE} to the listener's token)" : " (is #{TOKEN_VARIABLE} the listener's token?)"
          when 404 then " (a heap profile is at #{DEFAULT_PATH})"
          else ""
          end
        raise Error, "#{name}: answered #{response.code}#{reason.empty? ? "" : ": #{reason}"}#{hint}"
      end
    end
  end
end
