# frozen_string_literal: true

require "optparse"
require "heapscope/env_config"
require "heapscope/ui/server"

module Heapscope
  module UI
    # CLI is `heapscope ui SOURCE... [--port N] [--host H] [--refresh SECONDS]`: checks every source
    # before serving (a bad one is one line and exit 2, naming it), then serves until INT or TERM.
    module CLI
      USAGE = "usage: heapscope ui SOURCE... [--port N] [--host H] [--refresh SECONDS] [--max-size SIZE] [--timeout SECONDS]"
      HELP = <<~TEXT
        A local web page over heap profiles: live bytes over time with error bands, each snapshot's top
        table and flame graph, the diff of two snapshots, and leak verdicts.

        SOURCE is any mix of: a folder of profiles (periodic or dump files, *.pb.gz; a folder holding
        several processes' periodic files shows one timeline per process), profile files, and live
        listeners' URLs (http://HOST:PORT/debug/pprof/heap, fetched every --refresh seconds; the newest
        #{Sources::LIVE_KEEP} snapshots are kept). Serves on 127.0.0.1 by default; another --host needs
        HEAPSCOPE_HTTP_TOKEN, which the page then wants as Authorization: Bearer or ?token=. That token is
        also sent to the live URLs, as the other readers do.
      TEXT
      DEFAULT_PORT = 6070

      module_function

      # Returns the exit status (2 for bad usage); blocks while serving. ready: called with the Server
      # once it serves (tests), before waiting for a signal; stop: a Queue whose pop ends the serving
      # (tests), instead of a signal.
      def run(argv, out: $stdout, err: $stderr, ready: nil, stop: nil)
        opts = parse(argv, out)
        return opts if opts.is_a?(Integer)

        server = build(opts)
        server.start
        out.puts("heapscope ui: serving #{server.url} (Ctrl-C stops)")
        out.flush
        ready&.call(server)
        wait(stop)
        server.stop
        0
      rescue Report::Error, ArgumentError => e
        err.puts(Report::Escape.terminal("heapscope ui: #{e.message}"))
        2
      rescue SystemCallError => e
        err.puts(Report::Escape.terminal("heapscope ui: cannot listen on #{opts[:host]}:#{opts[:port]}: #{e.message.sub(/ @ .*/, "")}"))
        2
      end

      def parse(argv, out)
        opts = { port: DEFAULT_PORT, host: "127.0.0.1", refresh: 10.0, timeout: 30.0, max_size: Pprof::DEFAULT_MAX_SIZE }
        parser = OptionParser.new
        parser.banner = "#{USAGE}\n\n#{HELP}"
        parser.on("--port N", "port to serve on (default #{DEFAULT_PORT}; 0 picks a free one)") { |v| opts[:port] = port(v) }
        parser.on("--host H", "address to serve on (default 127.0.0.1)") { |v| opts[:host] = v }
        parser.on("--refresh SECONDS", "how often live URLs are fetched (default 10)") { |v| opts[:refresh] = seconds(v, "--refresh") }
        parser.on("--timeout SECONDS", "longest wait for a URL's answer (default 30)") { |v| opts[:timeout] = seconds(v, "--timeout") }
        parser.on("--max-size SIZE", "largest profile to read, decompressed (e.g. 1G, 512M)") do |v|
          opts[:max_size] = Report::Command.parse_size(v)
        end
        parser.on("-h", "--help", "this text") do
          out.puts(parser.help)
          return 0
        end
        begin
          opts[:sources] = parser.parse(argv.dup)
        rescue OptionParser::ParseError => e
          raise Report::Error, "#{e.message} (#{USAGE.sub(/\Ausage: /, "")})"
        end
        raise Report::Error, "missing SOURCE: a folder, profile files or a live URL (#{USAGE.sub(/\Ausage: /, "")})" if opts[:sources].empty?

        opts
      end

      def port(text)
        value = Integer(text, 10)
        raise ArgumentError unless value.between?(0, 65_535)

        value
      rescue ArgumentError, TypeError
        raise Report::Error, "--port must be a number from 0 to 65535, got #{text.inspect}"
      end

      def seconds(text, flag)
        value = Float(text)
        raise ArgumentError unless value.positive? && value.finite?

        value
      rescue ArgumentError, TypeError
        raise Report::Error, "#{flag} must be a positive number of seconds, got #{text.inspect}"
      end

      # Sorts the sources into folders, files and URLs, checking each one now.
      def build(opts)
        folders = []
        files = []
        urls = []
        opts[:sources].each do |arg|
          if Report::ProfileUrl.url?(arg)
            Report::ProfileUrl.parse(arg)
            urls << arg
          elsif File.directory?(arg)
            raise Report::Error, "#{arg}: no profiles (*.pb.gz, *.pb, *.pprof) in this folder" if Sources.list(arg).empty?

            folders << arg
          elsif File.file?(arg)
            raise Report::Error, "#{arg}: cannot read it" unless File.readable?(arg)

            files << arg
          else
            raise Report::Error, "#{arg}: no such file, folder or URL"
          end
        end
        token = ENV[Report::ProfileUrl::TOKEN_VARIABLE]
        token = nil if token.to_s.empty?
        unless token || EnvConfig::HttpAddress.loopback?(opts[:host])
          raise Report::Error, "--host #{opts[:host]} is not a loopback address: set #{Report::ProfileUrl::TOKEN_VARIABLE} to serve it"
        end

        sources = Sources.new(folders: folders, files: files, urls: urls, refresh: opts[:refresh],
                              max_size: opts[:max_size], fetch_timeout: opts[:timeout])
        Server.new(sources, host: opts[:host], port: opts[:port], token: token, refresh: opts[:refresh])
      end

      def wait(stop)
        return stop.pop if stop

        queue = Thread::Queue.new
        old = %w[INT TERM].to_h { |sig| [sig, trap(sig) { queue << sig }] }
        queue.pop
        old.each { |sig, handler| trap(sig, handler || "DEFAULT") }
      end
    end
  end
end
