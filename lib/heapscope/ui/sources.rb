# frozen_string_literal: true

require "heapscope/report/command"
require "heapscope/report/leaks"
require "heapscope/ui/summary"
require "heapscope/ui/summary_cache"
require "heapscope/ui/prefetch"

module Heapscope
  module UI
    # Sources are what `heapscope ui` shows: folders of profiles (periodic or dumps), single files, and
    # live listeners' URLs. Each becomes one or more series (a folder holding several processes' periodic
    # files gives one series per process: growth only means something within one process), each a list
    # of snapshots in time order.
    #
    # A request never names a file: pages address snapshots by the ids given here, so no path from a
    # request is ever opened (no traversal), and only files found in the sources are read.
    class Sources
      # A live source keeps this many snapshots' summaries, and whole profiles of the newest few only.
      LIVE_KEEP = 500
      LIVE_PROFILES = 3
      # Whole profiles read from files for the pages (top, flame graph, diff), kept for the next click.
      LOADED_KEEP = 4
      # A folder is listed again at most this often (the page polls; a folder of 500 files costs a scan).
      RESCAN_SECONDS = 2.0

      # One point of a series. path: its file (nil for a live snapshot); profile: the whole profile while
      # kept (live ones); summary: once summarized; error: why it could not be read.
      Snapshot = Struct.new(:id, :series, :path, :stamp, :profile, :summary, :error, :fetched_at)

      # url: a live series' URL as given (with its password, if any; name is its display form).
      Series = Struct.new(:name, :kind, :snapshots, :version, :last_error, :url)

      attr_reader :table, :max_size

      # folders, files, urls: what the command line named (checked by UI::CLI). refresh: seconds between
      # fetches of a live URL. fetch_timeout: the deadline of one fetch.
      # cache: where summaries outlive the server (SummaryCache; nil for none). prefetch: false keeps
      # the first summaries in this process (Prefetch forks helpers to use the other cores).
      def initialize(folders: [], files: [], urls: [], refresh: 10, max_size: Pprof::DEFAULT_MAX_SIZE, fetch_timeout: 30,
                     cache: SummaryCache.new, prefetch: true)
        @folders = folders
        @files = files
        @urls = urls
        @refresh = refresh
        @max_size = max_size
        @fetch_timeout = fetch_timeout
        @table = SiteTable.new
        @cache = cache || SummaryCache.new(nil)
        @prefetch_allowed = prefetch
        @prefetch = nil
        @lock = Mutex.new
        @series = {} # name => Series, in the order first seen
        @by_id = {}
        @id_of_path = {}
        @next_id = 0
        @loaded = {} # snapshot id => Profile, oldest first (LRU)
        @queue = Thread::Queue.new
        @pending = 0 # queued or being summarized
        @scanned_at = nil
        @threads = []
      end

      # Lists the folders and files, fetches each URL once (raising Report::Error naming the URL that
      # fails), then starts summarizing in the background and polling the URLs.
      def start
        @urls.each { |url| add_live(url, fetch(url)) }
        first = rescan(force: true)
        @prefetch = Prefetch.start(first.map { |s| [s.path, s.stamp] }, @cache, max_size: @max_size) if @prefetch_allowed
        @threads << Thread.new { summarize_loop }
        @urls.each { |url| @threads << Thread.new { poll_loop(url) } }
        self
      end

      def stop
        @queue.close
        @threads.each { |t| t.kill.join(1) }
        @prefetch&.stop
      end

      # Every series, after picking up new files (at most every RESCAN_SECONDS).
      def series
        rescan
        @lock.synchronize { @series.values.map(&:dup) }
      end

      def snapshot(id)
        @lock.synchronize { @by_id[id] }
      end

      # The live URL a snapshot was fetched from; nil for a file's.
      def url_of(snap)
        @lock.synchronize { @series[snap.series]&.url }
      end

      # Snapshots not summarized yet (the page shows the count and asks again).
      def pending
        @lock.synchronize { @pending }
      end

      # The whole profile of a snapshot: kept (live) or read again from its file. Report::Error when
      # it is gone (an older live snapshot, or a file rotated away meanwhile).
      def profile(snap)
        return snap.profile if snap.profile

        unless snap.path
          raise Report::Error, "snapshot #{snap.id}: only the newest #{LIVE_PROFILES} profiles of a live source are kept whole"
        end

        @lock.synchronize { (prof = @loaded.delete(snap.id)) && (return @loaded[snap.id] = prof) }
        prof = Report::Sites.load(snap.path, max_size: @max_size)
        @lock.synchronize do
          @loaded[snap.id] = prof
          @loaded.delete(@loaded.keys.first) while @loaded.size > LOADED_KEEP
        end
        prof
      end

      private

      # Lists the sources again and queues the snapshots found new, coarse to fine (Sources.refining);
      # returns them in that order.
      def rescan(force: false)
        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        return [] if !force && @scanned_at && now - @scanned_at < RESCAN_SECONDS

        @scanned_at = now
        added = []
        @folders.each do |dir|
          Sources.list(dir).group_by { |name| name.b[Report::Leaks::PERIODIC_NAME, :process] }.each do |process, names|
            added.concat(add_files(process ? "#{dir}: #{process}" : dir, names.map { |n| File.join(dir, n) }))
          end
        rescue Report::Error
          nil # emptied or unreadable since start: the series keeps what it had
        end
        added.concat(add_files("files", @files)) unless @files.empty?
        Sources.refining(added).each { |snap| @queue << snap }
      end

      # The order snapshots are summarized in: each series' first and last, then the middle, then the
      # quarters, and so on (a breadth-first halving of its time order), taking every series' turn at
      # each step. The page draws what is summarized, so a first look at a big folder shows its whole
      # span at once, coarse, and fills it in (time order would draw the first minutes for a minute).
      def self.refining(snaps)
        ranked = snaps.group_by(&:series).values.flat_map do |list|
          list = list.sort_by { |s| [s.stamp[0], s.path] }
          halving_order(list.size).each_with_index.map { |at, rank| [rank, list[at]] }
        end
        ranked.each_with_index.sort_by { |(rank, _), i| [rank, i] }.map { |(_, snap), _| snap }
      end

      # 0...n as first, last, then the midpoints of each gap, breadth first (every index once).
      def self.halving_order(n)
        return (0...n).to_a if n <= 2

        order = [0, n - 1]
        gaps = [[0, n - 1]]
        until gaps.empty?
          a, b = gaps.shift
          next if b - a < 2

          m = (a + b) / 2
          order << m
          gaps << [a, m] << [m, b]
        end
        order
      end

      # The profile files of a folder: regular files named like profiles, as `heapscope leaks DIR` reads
      # (Report::Leaks.expand; a FIFO named like a profile would block the reader forever).
      def self.list(dir)
        names = Dir.children(dir).reject { |f| f.start_with?(".") }.select { |f| f.b.match?(Report::Leaks::PROFILE_FILE) }
        names.select { |f| File.file?(File.join(dir, f)) }
      rescue SystemCallError => e
        raise Report::Error, "#{dir}: #{e.message.sub(/ @ .*/, "")}"
      end

      # Adds the files not seen before (or changed: size or mtime) to the series name; returns their
      # snapshots, to be summarized.
      def add_files(name, paths)
        added = []
        paths.each do |path|
          stat = File.stat(path)
          stamp = [stat.mtime.to_f, stat.size]
          @lock.synchronize do
            id = @id_of_path[path]
            old = id && @by_id[id]
            next if old && old.stamp == stamp

            id ||= @id_of_path[path] = new_id
            series = (@series[name] ||= Series.new(name, "files", [], 0))
            series.snapshots.delete(old) if old
            snap = @by_id[id] = Snapshot.new(id, name, path, stamp)
            @loaded.delete(id)
            series.snapshots << snap
            series.version += 1
            @pending += 1
            added << snap
          end
        rescue SystemCallError
          nil # removed between the listing and the stat
        end
        added
      end

      def new_id
        (@next_id += 1).to_s
      end

      def summarize_loop
        later = [] # snapshots a helper process (Prefetch) has not handed over yet, in queue order
        while (snap, summary = next_job(later)) && snap
          begin
            unless summary
              prof = Report::Sites.load(snap.path, max_size: @max_size)
              summary = Summarize.call(prof, @table, name: snap.path, fallback_time: snap.stamp[0])
              @cache.write(snap.path, snap.stamp, summary, @table)
            end
            @lock.synchronize do
              snap.summary = summary
              @series[snap.series].version += 1
            end
          rescue Report::Error, SystemCallError => e
            snap.error = e.message
          ensure
            @lock.synchronize { @pending -= 1 }
          end
        end
      rescue ClosedQueueError
        nil
      end

      # [snapshot, its summary if one is at hand (cached, or a helper's), else nil], or nil once stopped.
      # A helper's snapshot that is not ready waits in later while the queue has others: the helpers
      # and this thread each work through their own share, so none waits on another's file.
      def next_job(later)
        loop do
          if (snap = later.first)
            summary = @prefetch.take(snap.path, snap.stamp, @table)
            return [later.shift, summary] unless summary == Prefetch::LATER
          end
          snap = later.empty? ? @queue.pop : pop_now
          return nil if snap.nil? && later.empty? # closed

          unless snap
            sleep Prefetch::POLL
            next
          end
          summary = @cache.read(snap.path, snap.stamp, @table) || @prefetch&.take(snap.path, snap.stamp, @table)
          next later << snap if summary == Prefetch::LATER

          return [snap, summary]
        end
      end

      def pop_now
        @queue.pop(true)
      rescue ThreadError
        nil
      end

      def fetch(url)
        Report::ProfileUrl.load(url, timeout: @fetch_timeout, max_size: @max_size)
      end

      # A fetched profile becomes the newest snapshot of the URL's series; beyond LIVE_KEEP the oldest
      # go, and only the newest LIVE_PROFILES keep their whole profile.
      def add_live(url, prof)
        now = Time.now.to_f
        summary = Summarize.call(prof, @table, name: Report::ProfileUrl.display(url), fallback_time: now)
        @lock.synchronize do
          name = Report::ProfileUrl.display(url)
          series = (@series[name] ||= Series.new(name, "live", [], 0, nil, url))
          snap = Snapshot.new(new_id, name, nil, nil, prof, summary, nil, now)
          @by_id[snap.id] = snap
          series.snapshots << snap
          series.last_error = nil
          series.snapshots[0...-LIVE_PROFILES].each { |old| old.profile = nil }
          series.snapshots.shift.then { |gone| @by_id.delete(gone.id) } while series.snapshots.size > LIVE_KEEP
          series.version += 1
        end
      end

      def poll_loop(url)
        loop do
          sleep @refresh
          begin
            add_live(url, fetch(url))
          rescue StandardError => e # Report::Error from the fetch, or any other failure
            # The process may be restarting: say so on the page and try again at the next turn.
            @lock.synchronize { @series[Report::ProfileUrl.display(url)]&.last_error = e.message }
          end
        end
      end
    end
  end
end
