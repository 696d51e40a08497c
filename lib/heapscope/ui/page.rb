# frozen_string_literal: true

require "erb"
require "heapscope/version"

module Heapscope
  module UI
    # Page is the ui's one HTML page: a shell whose script (assets/ui.js, written for this page, no
    # library) fetches /api/timeline and draws everything. The page itself holds no profile-derived
    # text, so nothing here needs escaping but the version; the script puts names in with textContent.
    module Page
      ASSETS = File.join(__dir__, "assets")
      JS = File.read(File.join(ASSETS, "ui.js")).freeze
      CSS = File.read(File.join(ASSETS, "ui.css")).freeze
      TEMPLATE = <<~HTML
        <!DOCTYPE html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <title>heapscope ui</title>
        <style>%<css>s</style>
        </head>
        <body>
        <h1>heapscope: live heap over time</h1>
        <div id="hs-status">loading...</div>
        <div id="hs-series"></div>
        <div id="hs-detail"><div id="hs-labels"></div><div id="hs-top"></div><pre id="hs-retainers"></pre><div id="hs-diff"></div></div>
        <p style="color:#777">Lines: live bytes (inuse_space) per snapshot, of the whole heap and of its largest
        sites (by line); bands: ±2σ sampling error. heapscope %<version>s, docs/ui.md.</p>
        <script>%<js>s</script>
        </body>
        </html>
      HTML

      module_function

      def render
        format(TEMPLATE, css: CSS, js: JS, version: ERB::Util.html_escape(Heapscope::VERSION))
      end
    end
  end
end
