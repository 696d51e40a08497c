# frozen_string_literal: true

# The prebuilt gem for x86_64-linux: a "fat" gem holding the C extension once per Ruby minor
# (lib/heapscope/3.1/heapscope.so, 3.3/, 3.4/; lib/heapscope.rb picks the one of the Ruby loading it),
# so installing it needs no compiler. The source gem (`gem build heapscope-profiler.gemspec`) stays
# for other platforms and other Rubies.
#
#   rake native_gem               this Ruby and every Ruby bin/rubies serves (as root, bin/rubies install)
#   rake native_gem RUBIES=this   this Ruby only
#
# Writes pkg/heapscope-profiler-VERSION-x86_64-linux.gem (NATIVE_GEM_DIR=DIR: elsewhere) and prints
# its path on the last line. The builds do not link libruby (extconf.rb, HEAPSCOPE_NO_LIBRUBY), so
# they load into a shared or a static Ruby; they need glibc as new as the build's (Debian 12's for
# 3.1, Debian 13's for 3.3 and 3.4) and zlib's shared library.
require "rubygems/package"

NATIVE_PLATFORM = "x86_64-linux"
ELF_MAGIC = "\x7fELF".b

def ruby_minor(version = RUBY_VERSION)
  version[/\A\d+\.\d+/]
end

# This Ruby's build, into dest.
def native_build_here(dest)
  FileUtils.mkdir_p(File.dirname(dest))
  build_native("native-#{ruby_minor}", { "HEAPSCOPE_NO_LIBRUBY" => "1" }, dest: dest)
end

# Ruby version's build, made inside bin/rubies' root (in its own copy of the checkout) and read
# back through the command's standard output.
def native_build_in_root(version, dest)
  FileUtils.mkdir_p(File.dirname(dest))
  script = "set -e; mkdir -p tmp/native-build; cd tmp/native-build; " \
           "HEAPSCOPE_NO_LIBRUBY=1 ruby ../../ext/heapscope/extconf.rb >&2; make -s V=0 >&2; cat heapscope.so"
  partial = "#{dest}.partial"
  ok = system(File.join(ROOT, "bin/rubies"), "run", version, "bash", "-c", script, out: partial)
  raise "building the extension for Ruby #{version} in bin/rubies' root failed" unless ok

  File.rename(partial, dest)
end

desc "Build the prebuilt x86_64-linux gem (RUBIES=this: this Ruby's extension only)"
task :native_gem do
  minors = { ruby_minor => :here }
  unless ENV["RUBIES"] == "this"
    listed = `#{File.join(ROOT, "bin/rubies")} list`.split
    raise "bin/rubies serves no Rubies (as root: bin/rubies install), or say RUBIES=this" if listed.empty?

    listed.each { |version| minors[version] ||= :root }
  end
  stage = File.join(ROOT, "tmp/native-gem")
  FileUtils.rm_rf(stage)
  spec = Dir.chdir(ROOT) { Gem::Specification.load(File.join(ROOT, "heapscope-profiler.gemspec")) }
  spec.files.each do |file|
    FileUtils.mkdir_p(File.join(stage, File.dirname(file)))
    FileUtils.cp(File.join(ROOT, file), File.join(stage, file))
  end
  extensions = minors.sort.map do |minor, where|
    relative = "lib/heapscope/#{minor}/heapscope.#{RbConfig::CONFIG["DLEXT"]}"
    dest = File.join(stage, relative)
    where == :here ? native_build_here(dest) : native_build_in_root(minor, dest)
    raise "#{relative} is not an ELF shared object" unless File.binread(dest, 4) == ELF_MAGIC

    relative
  end
  spec.files += extensions
  spec.extensions = []
  spec.platform = Gem::Platform.new(NATIVE_PLATFORM)
  # No build for a Ruby newer than the newest minor here: those take the source gem. (An older minor
  # missing in between, 3.2, gets a LoadError that names the source gem.)
  newest = minors.keys.max_by { |minor| Gem::Version.new(minor) }
  major, minor = newest.split(".").map(&:to_i)
  spec.required_ruby_version = [">= #{minors.keys.min_by { |m| Gem::Version.new(m) }}", "< #{major}.#{minor + 1}.dev"]
  out_dir = ENV["NATIVE_GEM_DIR"] || File.join(ROOT, "pkg")
  FileUtils.mkdir_p(out_dir)
  file = Dir.chdir(stage) { Gem::Package.build(spec) }
  path = File.join(out_dir, File.basename(file))
  FileUtils.mv(File.join(stage, file), path)
  puts "#{spec.full_name}: the extension for Ruby #{minors.keys.sort.join(", ")}"
  puts path
end
