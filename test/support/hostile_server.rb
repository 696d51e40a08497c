# frozen_string_literal: true

require "socket"

# HostileServer is a test's misbehaving HTTP server on 127.0.0.1 (test_hardening_reports.rb,
# test_report_urls.rb): each connection's request head is read, then the block answers however it
# likes (never ending, dripping, lying); stop_hostile_servers ends them all.
module HostileServer
  # Starts a server whose connections the block answers, given the socket and the request head;
  # returns its URL (http://127.0.0.1:PORT).
  def hostile_server(&answer)
    server = TCPServer.new("127.0.0.1", 0)
    threads = []
    threads << Thread.new do
      loop do
        client = server.accept
        threads << Thread.new(client) do |c|
          request = +""
          request << c.readpartial(4096) until request.include?("\r\n\r\n")
          answer.call(c, request)
        rescue StandardError
          nil
        ensure
          c.close
        end
      end
    rescue StandardError
      nil
    end
    (@hostile_servers ||= []) << [server, threads]
    "http://127.0.0.1:#{server.addr[1]}"
  end

  def stop_hostile_servers
    (@hostile_servers || []).each do |server, threads|
      threads.dup.each(&:kill)
      server.close
    end
    @hostile_servers = []
  end
end
