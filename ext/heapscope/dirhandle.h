#ifndef HEAPSCOPE_DIRHANDLE_H
#define HEAPSCOPE_DIRHANDLE_H

// dirhandle: a directory opened once, and every file operation in it made relative to that
// descriptor (openat, renameat, unlinkat, fstatat, mkdirat, readlinkat, reads by openat), so nothing another user does
// to the directory's path after it was opened (a parent swapped for a symlink, the directory renamed)
// changes where heapscope writes, reads or deletes. Ruby has no openat: this is heapscope's.
//
// Ruby: Heapscope::Native::DirHandle (lib/heapscope/atomic_write.rb walks down to a directory with it,
// checking each ancestor; lib/heapscope/surfaces/output_dir.rb keeps one open for the periodic writer and dumps).
//
//   DirHandle.root                      -> handle on "/"
//   handle.open_dir(name)               -> handle on the subdirectory name, never through a symlink
//   handle.mkdir(name, mode)            -> nil
//   handle.stat(name = nil)             -> File::Stat of the entry name (a symlink itself, not followed), or
//                                          of the directory when name is nil
//   handle.readlink(name)               -> String, where the symlink name points
//   handle.write_replace(tmp, name, data, perm)
//                                       -> File::Stat of the new file: data written to a new file tmp
//                                          (O_CREAT|O_EXCL|O_NOFOLLOW), fsynced, then renamed to name
//   handle.read(name, max)              -> String: the regular file name's bytes (never through a symlink;
//                                          Errno::EFBIG past max bytes, EINVAL if not a regular file)
//   handle.unlink(name)                 -> nil
//   handle.entries                      -> Array of names (without . and ..)
//   handle.path, handle.close, handle.closed?
//
// A name is one path component: "", ".", "..", or a name holding "/" or NUL raise ArgumentError.
// Failures raise SystemCallError (Errno::*) with a message naming the file, only at the Ruby
// boundary; the C helpers return 0 or an errno.
//
// NOTE: GVL held, except while write_replace writes and fsyncs the data (the String is locked and
//       stays on this thread's stack, so it neither changes nor moves). Never called from a GC hook.
// NOTE: descriptors are O_CLOEXEC. A forked child shares them (a directory descriptor carries no state
//       heapscope uses: entries reads through a descriptor of its own); output_dir.rb reopens after
//       fork anyway. On free or close the descriptor is closed only if it still is the directory
//       opened (same device and inode), so a descriptor number that someone else closed and reused is
//       never closed from under them.

#include <ruby.h>

// Defines Heapscope::Native::DirHandle under mNative.
void dirhandle_define(VALUE mNative);

#endif
