# frozen_string_literal: true

require_relative "../labels"

module Heapscope
  # Labels every request with its endpoint, so heap and allocation samples say which route made them:
  #
  #   use Heapscope::RackLabels          # labels only
  #   use Heapscope::Rack                # the /debug/pprof endpoints, and labels (labels: false turns them off)
  #
  # endpoint is the method and the path with its ids collapsed: "GET /users/:id/posts/:id" (a segment
  # of digits, a UUID, a long hex string, or one mixing letters and digits at 16+ characters).
  # Rails apps get "UsersController#show" instead, from the Railtie (lib/heapscope/surfaces/rails.rb). Labels
  # cover what the app does inside call; a body streamed after call returns is not labelled.
  #
  # Cost per request: two Hash lookups when the path was seen before (nothing allocated); a new path is
  # collapsed once, inside Heapscope.internal. At most PATH_LIMIT paths are remembered; past that each new
  # one is collapsed again (bounded memory, whatever the clients send).
  class RackLabels
    PATH_LIMIT = 10_000
    ID_SEGMENT = %r{
      \A(?:
        \d+ |                                                          # 42
        [0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12} |  # a UUID
        [0-9a-fA-F]{16,} |                                             # a digest
        (?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{16,}  # a token: letters and digits
      )\z
    }x.freeze
    MAX_SEGMENTS = 24
    LOCK = Mutex.new
    @ids = {} # method => { path => label set id }
    @count = 0

    class << self
      # The label set id for a request with this method and path, merged into the labels in force.
      def id_for(method, path)
        method = method.to_s
        path = path.to_s
        if (Thread.current[Labels::LOCAL] || 0).zero?
          by_path = @ids[method]
          id = by_path && by_path[path]
          return id if id
        end
        Heapscope.internal { build(method, path) }
      end

      # "GET /users/:id": the endpoint label of a request.
      def endpoint(method, path)
        segments = path.split("/", MAX_SEGMENTS + 2)
        segments = segments.first(MAX_SEGMENTS) << "..." if segments.size > MAX_SEGMENTS
        collapsed = segments.map { |segment| segment.match?(ID_SEGMENT) ? ":id" : segment }.join("/")
        collapsed = "/" if collapsed.empty?
        "#{method.empty? ? "?" : method} #{collapsed}"
      end

      private

      def build(method, path)
        parent = Thread.current[Labels::LOCAL] || 0
        id = Labels.merged_id({ endpoint: endpoint(method, path) }, "RackLabels")
        return id unless parent.zero?

        LOCK.synchronize do
          if @count < PATH_LIMIT
            (@ids[method.frozen? ? method : -method] ||= {})[path.frozen? ? path : -path] = id
            @count += 1
          end
        end
        id
      end
    end

    def initialize(app)
      @app = app
    end

    def call(env)
      previous = Labels.switch(RackLabels.id_for(env["REQUEST_METHOD"], env["PATH_INFO"]))
      begin
        @app.call(env)
      ensure
        Labels.switch(previous)
      end
    end
  end
end
