bin/setup >/dev/null 2>&1; bundle exec rake compile >/dev/null 2>&1
bundle exec ruby bench/auto_focus_verdicts.rb 10 10 2>/work/main/tmp/afv34_runs.log
