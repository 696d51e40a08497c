# frozen_string_literal: true

# Rails: settings in `config.heapscope`, profiling started in server processes only, and the
# endpoints mounted in routes (docs/rails.md).
#
#   # config/application.rb (or an environment file, or config/initializers/heapscope.rb)
#   config.heapscope.dir = "log/heapscope"      # any HEAPSCOPE_* variable, lowercased, without the prefix
#   config.heapscope.sample_every = 500
#   # config/routes.rb
#   mount Heapscope::Rack.app, at: "/debug/pprof", constraints: ->(req) { req.local? }
#
# Loaded by `require "heapscope"` when Rails is loaded first (config/application.rb requires Rails
# before Bundler.require), or by `require "heapscope/rails"`.
require "heapscope" unless defined?(Heapscope::Rack)
require "heapscope/surfaces/autostart"
require "rails/railtie" unless defined?(::Rails::Railtie)

module Heapscope
  # RailsIntegration turns config.heapscope into HEAPSCOPE_* settings and decides whether this
  # process profiles. It needs nothing from Rails itself, so it is tested without an app too.
  module RailsIntegration
    PREFIX = "HEAPSCOPE_"
    # config.heapscope's keys: each variable's name without the prefix, lowercased (sample_every, dir, ...).
    SETTINGS = EnvConfig::VARIABLES.keys.to_h { |name| [name.delete_prefix(PREFIX).downcase.to_sym, name] }.freeze

    # Processes that serve requests or run jobs, by a constant their entry point loads: `rails
    # server`, Puma (also under rackup), Unicorn, Pitchfork, Passenger, Falcon, Thin; Sidekiq, Solid
    # Queue's `bin/jobs`, GoodJob's CLI.
    SERVER_CONSTANTS = %w[Rails::Server Puma::Launcher Unicorn::HttpServer Pitchfork::HttpServer PhusionPassenger
                          Falcon::Server Thin::Server Sidekiq::CLI SolidQueue::Cli GoodJob::CLI].freeze

    class << self
      # Starts heapscope from settings (config.heapscope, or any Hash) and the environment, as
      # autostart would: the environment's HEAPSCOPE_* variables win over settings. With neither
      # `enabled` nor HEAPSCOPE_ENABLED set, only a server process profiles (server_process?): not
      # `rails console`, `rails runner`, rake tasks or asset precompilation. A bad setting prints one
      # line naming it, and the application runs on unprofiled. Returns true when profiling started.
      def start(settings, env: ENV, err: $stderr)
        env_vars, problems = variables(settings.to_h)
        unless problems.empty?
          problems.each { |line| err.puts("heapscope: #{line}; profiling is off") }
          return false
        end
        from_env = env.to_h.select { |name, value| name.start_with?(PREFIX) && !value.to_s.strip.empty? }
        merged = env_vars.merge(from_env)
        if Auto.started?
          # RUBYOPT=-rheapscope/auto already read the variables at boot.
          unless env_vars.empty?
            err.puts("heapscope: config.heapscope is ignored: RUBYOPT=-rheapscope/auto started heapscope " \
                     "from HEAPSCOPE_* variables at boot")
          end
          return false
        end
        return false if merged[SETTINGS[:enabled]].nil? && !server_process?

        # Error lines name what the user wrote: the setting, or the variable where the environment won.
        names = (env_vars.keys - from_env.keys).to_h { |name| [name, setting_name(name)] }
        started = Auto.start(merged, err: err, names: names)
        # Under Rails nothing else says profiling is on until the process exits (issue 33).
        announce(err) if started && !Auto.config[:quiet]
        started
      end

      # A closed or broken stderr must not fail the app's boot over a message.
      def announce(err)
        err.puts(started_line)
      rescue StandardError
        nil
      end

      # The one line said when profiling starts: this process, where its profiles go, where to read
      # it live, and how to silence the line.
      def started_line(pid: Process.pid)
        config = Auto.config
        parts = []
        if config[:dir]
          parts << "profiles go to #{File.expand_path(config[:dir])} every #{format("%g", config[:interval])} s"
        elsif Auto.writer
          parts << "a final profile goes to #{Auto.writer.dir} at exit"
        end
        parts << "pushed to Pyroscope every #{format("%g", config[:interval])} s" if Auto.pusher
        parts << if Auto.server
                   "live at #{Auto.server.url} (heapscope top #{Auto.server.url}heap)"
                 else
                   "live where config/routes.rb mounts Heapscope::Rack.app (e.g. /debug/pprof/heap)"
                 end
        "heapscope: profiling this Rails process (pid #{pid}): #{parts.join("; ")}. " \
          "config.heapscope.quiet = true (HEAPSCOPE_QUIET=1) silences this line"
      end

      # Whether this process is a server or a job runner, not a console or a rake task. Only
      # constants already loaded count: a pending autoload is not loaded to answer.
      def server_process?
        return false if loaded?("Rails::Console")
        return false if loaded?("Rake") && ::Rake.respond_to?(:application) && ::Rake.application.top_level_tasks.any?

        SERVER_CONSTANTS.any? { |path| loaded?(path) }
      end

      # "config.heapscope.sample_every" for "HEAPSCOPE_SAMPLE_EVERY".
      def setting_name(variable)
        "config.heapscope.#{variable.delete_prefix(PREFIX).downcase}"
      end

      private

      # Settings to variables. Returns [{name => String}, problems]: nil values count as unset.
      def variables(settings)
        vars = {}
        problems = []
        settings.each do |key, value|
          name = SETTINGS[key.to_s.to_sym]
          unless name
            problems << "config.heapscope.#{key} is not a setting (settings: #{SETTINGS.keys.join(", ")})"
            next
          end
          next if value.nil?

          text = text_of(value)
          if text
            vars[name] = text
          else
            article = value.class.name.to_s.match?(/\A[AEIOU]/) ? "an" : "a"
            problems << "config.heapscope.#{key} takes a String, a number, a Symbol, true or false" \
                        "#{" or a Hash" if name == "HEAPSCOPE_PYROSCOPE_LABELS"}, not #{article} #{value.class}"
          end
        end
        [vars, problems]
      end

      def text_of(value)
        case value
        when true then "1"
        when false then "0"
        when String, Symbol, Integer, Float then value.to_s
        when Hash
          value.map { |k, v| "#{k}=#{v}" }.join(",") if value.all? { |k, v| text_of(k) && text_of(v) }
        end
      end

      def loaded?(path)
        path.split("::").inject(Object) do |mod, name|
          return false unless mod.is_a?(Module) && mod.const_defined?(name, false) && !mod.autoload?(name)

          mod.const_get(name, false)
        end
        true
      end
    end
  end

  # Labels for Rails: each controller action's allocations get endpoint="UsersController#show", each
  # Active Job's job="ReportJob" (lib/heapscope/labels.rb). Start/finish subscribers of the events Rails
  # instruments around them: the label is set where the action starts and taken back where it ends, on
  # the same fiber; the token travels in the event's payload. A name seen before costs two Hash lookups.
  module RailsLabels
    TOKEN = :__heapscope_labels

    # Sets the label at an event's start and restores the labels before it at its finish. Subclasses
    # find the label set for a payload in a cache nested by the payload's parts (no Array, no String
    # made per request); a miss builds it inside Heapscope.internal.
    class Subscriber
      def initialize
        @ids = {} # label set in force => part => part => id
        @count = 0
      end

      def start(_name, _id, payload)
        payload[TOKEN] = Labels.switch(id_for(payload))
      rescue StandardError
        nil # a label is never worth a failed request
      end

      def finish(_name, _id, payload)
        token = payload[TOKEN]
        Labels.switch(token) if token
      end

      private

      def cached(first, second)
        level = @ids[Thread.current[Labels::LOCAL] || 0]
        level &&= level[first]
        level && level[second]
      end

      def remember(first, second, labels)
        parent = Thread.current[Labels::LOCAL] || 0
        Heapscope.internal do
          id = Labels.merged_id(labels, "RailsLabels")
          if @count < RackLabels::PATH_LIMIT
            ((@ids[parent] ||= {})[first] ||= {})[second] = id
            @count += 1
          end
          id
        end
      end
    end

    # process_action.action_controller: endpoint="UsersController#show".
    class Actions < Subscriber
      def id_for(payload)
        controller = payload[:controller]
        action = payload[:action]
        cached(controller, action) || remember(controller, action, { endpoint: "#{controller}##{action}" })
      end
    end

    # perform.active_job: job="ReportJob".
    class Jobs < Subscriber
      def id_for(payload)
        job = payload[:job]&.class
        cached(job, nil) || remember(job, nil, { job: job&.name || "?" })
      end
    end

    class << self
      def subscribed?
        @subscribed == true
      end

      def subscribe
        return if @subscribed

        @subscribed = true
        ActiveSupport::Notifications.subscribe("process_action.action_controller", Actions.new)
        ActiveSupport::Notifications.subscribe("perform.active_job", Jobs.new)
      end
    end
  end

  # The Railtie: config.heapscope, and the start once the app's initializers have set it.
  class Railtie < ::Rails::Railtie
    config.heapscope = ActiveSupport::OrderedOptions.new

    initializer "heapscope.start", after: :load_config_initializers do |app|
      # HEAPSCOPE_LABELS (config.heapscope.labels), read with every other setting by EnvConfig.
      RailsLabels.subscribe if RailsIntegration.start(app.config.heapscope) && Auto.config&.fetch(:labels, true)
    end
  end
end
