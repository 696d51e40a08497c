# frozen_string_literal: true

# Puma in cluster mode, two workers, app preloaded in the master:
#
#   RUBYOPT=-rheapscope/auto HEAPSCOPE_HTTP=127.0.0.1:6060 puma -C examples/surfaces/puma_cluster.rb \
#     -b tcp://127.0.0.1:9292 examples/surfaces/config.ru
#
# The master serves profiles on 6060; each worker, once forked, on the first free port above it
# (HEAPSCOPE_HTTP_FORK=offset, the default), and prints which. Worker 0 keeps objects allocated at
# the EVEN line of config.ru, worker 1 at the ODD line; both inherit the master's PRELOADED ones.
workers 2
preload_app!
quiet
worker_timeout 60
silence_single_worker_warning if respond_to?(:silence_single_worker_warning)

boot_hook = respond_to?(:before_worker_boot) ? :before_worker_boot : :on_worker_boot
send(boot_hook) do |index|
  index.to_i.even? ? WorkerOwn.even : WorkerOwn.odd
end
