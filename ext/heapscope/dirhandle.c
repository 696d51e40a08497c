// dirhandle: see dirhandle.h. The C helpers return 0 or an errno and never touch Ruby; the dh_*
// methods below them are the Ruby boundary, the only place that raises.

#include "dirhandle.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ruby/io.h>
#include <ruby/thread.h>

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

// Directories are opened for reading only, never through a symlink at the last step, and never
// inherited by a program the application execs.
#define DIR_FLAGS (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
// A new file: only if nothing (not even a dangling symlink) has the name yet.
#define NEW_FILE_FLAGS (O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC)

typedef struct {
  int fd;     // -1 once closed
  dev_t dev;  // what fd was when opened: close checks it still is
  ino_t ino;
  char *path; // for messages only: where the directory was when opened (malloc'd)
} dirhandle;

static VALUE cDirHandle;

// ---- C helpers: no Ruby calls, return 0 or an errno ----

// Closes h's descriptor if it still is the directory h opened.
static void dirhandle_close_fd(dirhandle *h) {
  if (h->fd < 0) return;
  struct stat st;
  if (fstat(h->fd, &st) == 0 && st.st_dev == h->dev && st.st_ino == h->ino) close(h->fd);
  h->fd = -1;
}

// Records fd (a directory just opened) in h, taking ownership of it.
static int dirhandle_adopt(dirhandle *h, int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return err;
  }
  h->fd = fd;
  h->dev = st.st_dev;
  h->ino = st.st_ino;
  return 0;
}

// What entries reads, kept together for rb_ensure.
typedef struct {
  DIR *dir;
  VALUE names;
} listing;

// One write_replace's data and outcome, handed to the thread that writes without the GVL.
typedef struct {
  int fd;
  const char *bytes;
  size_t len;
  int err;
  const char *call; // which call failed, for the message
  int ran;          // set once the function was called (rb_thread_call_without_gvl2 may not call it)
} write_job;

// Writes all of job's bytes and fsyncs them, without the GVL.
static void *write_all_without_gvl(void *arg) {
  write_job *job = arg;
  job->ran = 1; // whatever happens next: a failed write is not to be tried again with the GVL
  size_t done = 0;
  while (done < job->len) {
    ssize_t n = write(job->fd, job->bytes + done, job->len - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      job->err = errno;
      job->call = "write";
      return NULL;
    }
    done += (size_t)n;
  }
  if (fsync(job->fd) != 0) {
    job->err = errno;
    job->call = "fsync";
  }
  return NULL;
}

// ---- Ruby boundary ----
//
// Arguments are checked here and bad ones raised with rb_raise, never left to Ruby's own conversions
// (StringValue, NUM2UINT, rb_scan_args) to raise from inside libruby: a raise from a noreturn call
// in this file lets ASan clear the stack it poisoned around locals like struct stat, one from
// inside Ruby does not, and the next Ruby code to use that stack trips over it (rake asan).

static void dh_free(void *ptr) {
  dirhandle *h = ptr;
  dirhandle_close_fd(h);
  free(h->path);
  xfree(h);
}

static size_t dh_memsize(const void *ptr) {
  const dirhandle *h = ptr;
  return sizeof(*h) + (h->path ? strlen(h->path) + 1 : 0);
}

static const rb_data_type_t dirhandle_type = {
  .wrap_struct_name = "heapscope_dirhandle",
  .function = {.dmark = NULL, .dfree = dh_free, .dsize = dh_memsize},
  .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE dh_alloc(VALUE klass) {
  dirhandle *h;
  VALUE obj = TypedData_Make_Struct(klass, dirhandle, &dirhandle_type, h);
  h->fd = -1;
  return obj;
}

static dirhandle *dh_get(VALUE self) {
  dirhandle *h;
  TypedData_Get_Struct(self, dirhandle, &dirhandle_type, h);
  if (h->fd < 0) rb_raise(rb_eIOError, "heapscope: directory handle %s is closed", h->path ? h->path : "");
  return h;
}

// "DIR/NAME" for messages ("/NAME" under the root).
static VALUE dh_join(const dirhandle *h, const char *name) {
  const char *dir = h->path ? h->path : "";
  size_t len = strlen(dir);
  return rb_sprintf("%s%s%s", dir, (len > 0 && dir[len - 1] == '/') ? "" : "/", name);
}

// Raises Errno::* for err naming DIR/NAME (the directory itself when name is NULL) and the call that
// failed, as Ruby's own file errors do ("No such file or directory @ openat - DIR/NAME"): callers that
// print a path already drop the part from " @ " on.
static void dh_fail(const dirhandle *h, int err, const char *name, const char *call) {
  VALUE path = name ? dh_join(h, name) : rb_str_new_cstr(h->path ? h->path : "");
  VALUE klass = rb_obj_class(rb_syserr_new(err, NULL));
  // SystemCallError itself (an errno Ruby has no class for) takes its arguments in another order.
  if (klass == rb_eSystemCallError) rb_syserr_fail_str(err, path);
  rb_exc_raise(rb_funcall(klass, rb_intern("new"), 2, path, rb_str_new_cstr(call)));
}

// The C string of name, which must be one path component.
static const char *dh_component(VALUE name) {
  if (!RB_TYPE_P(name, T_STRING)) rb_raise(rb_eTypeError, "heapscope: a file name must be a String, got %s", rb_obj_classname(name));
  const char *s = RSTRING_PTR(name);
  size_t len = (size_t)RSTRING_LEN(name);
  if (len == 0 || memchr(s, '\0', len) || memchr(s, '/', len) || (len == 1 && s[0] == '.') ||
      (len == 2 && s[0] == '.' && s[1] == '.')) {
    rb_raise(rb_eArgError, "heapscope: %+" PRIsVALUE " is not a name inside a directory", name);
  }
  return StringValueCStr(name); // cannot raise now: terminates a shared substring's bytes
}

// A file mode (0..07777) from an Integer.
static mode_t dh_mode(VALUE mode) {
  if (!FIXNUM_P(mode) || FIX2LONG(mode) < 0 || FIX2LONG(mode) > 07777) {
    rb_raise(rb_eArgError, "heapscope: a file mode must be an Integer in 0..07777, got %+" PRIsVALUE, mode);
  }
  return (mode_t)FIX2LONG(mode);
}

static char *dh_strdup(const char *s) {
  char *copy = strdup(s);
  if (!copy) rb_raise(rb_eNoMemError, "heapscope: out of memory for a directory name");
  return copy;
}

// DirHandle.root -> a handle on "/".
static VALUE dh_s_root(VALUE klass) {
  VALUE obj = dh_alloc(klass);
  dirhandle *h = RTYPEDDATA_DATA(obj);
  h->path = dh_strdup("/");
  int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int err = fd < 0 ? errno : dirhandle_adopt(h, fd);
  if (err) dh_fail(h, err, NULL, "open");
  return obj;
}

// handle.open_dir(name) -> a handle on the subdirectory name. Anything else than a directory there,
// a symlink included, raises Errno::ENOTDIR (Linux; ELOOP for a symlink elsewhere).
static VALUE dh_open_dir(VALUE self, VALUE name) {
  dirhandle *parent = dh_get(self);
  const char *s = dh_component(name);
  VALUE path = dh_join(parent, s);
  VALUE obj = dh_alloc(cDirHandle);
  dirhandle *h = RTYPEDDATA_DATA(obj);
  h->path = dh_strdup(RSTRING_PTR(path)); // rb_sprintf's String is terminated
  int fd = openat(parent->fd, s, DIR_FLAGS);
  int err = fd < 0 ? errno : dirhandle_adopt(h, fd);
  if (err) dh_fail(parent, err, s, "openat");
  return obj;
}

// handle.mkdir(name, mode) -> nil.
static VALUE dh_mkdir(VALUE self, VALUE name, VALUE mode) {
  dirhandle *h = dh_get(self);
  const char *s = dh_component(name);
  if (mkdirat(h->fd, s, dh_mode(mode)) != 0) dh_fail(h, errno, s, "mkdirat");
  return Qnil;
}

// handle.stat(name = nil) -> File::Stat of the entry (not following a symlink), or of the directory.
static VALUE dh_stat(int argc, VALUE *argv, VALUE self) {
  if (argc > 1) rb_raise(rb_eArgError, "wrong number of arguments (given %d, expected 0..1)", argc);
  VALUE name = argc == 1 ? argv[0] : Qnil;
  dirhandle *h = dh_get(self);
  struct stat st;
  if (NIL_P(name)) {
    if (fstat(h->fd, &st) != 0) dh_fail(h, errno, NULL, "fstat");
  } else {
    const char *s = dh_component(name);
    if (fstatat(h->fd, s, &st, AT_SYMLINK_NOFOLLOW) != 0) dh_fail(h, errno, s, "fstatat");
  }
  return rb_stat_new(&st);
}

// handle.readlink(name) -> where the symlink name points.
static VALUE dh_readlink(VALUE self, VALUE name) {
  dirhandle *h = dh_get(self);
  const char *s = dh_component(name);
  char target[PATH_MAX];
  ssize_t n = readlinkat(h->fd, s, target, sizeof(target));
  if (n < 0) dh_fail(h, errno, s, "readlinkat");
  if ((size_t)n >= sizeof(target)) dh_fail(h, ENAMETOOLONG, s, "readlinkat");
  return rb_str_new(target, n);
}

// Reads the regular file fd (at most max bytes: EFBIG beyond) into a new String. Closes fd.
static VALUE dh_read_fd(const dirhandle *h, int fd, const char *name, long max) {
  struct stat st;
  int err = fstat(fd, &st) != 0 ? errno : !S_ISREG(st.st_mode) ? EINVAL : st.st_size > max ? EFBIG : 0;
  if (err) {
    close(fd);
    dh_fail(h, err, name, "read");
  }
  VALUE data = rb_str_buf_new((long)st.st_size);
  long got = 0;
  while (got < (long)st.st_size) {
    ssize_t n = read(fd, RSTRING_PTR(data) + got, (size_t)(st.st_size - got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break; // a file cut short meanwhile: what was there
    got += n;
  }
  close(fd);
  rb_str_set_len(data, got);
  return data;
}

// handle.read(name, max) -> the bytes of the regular file name (never through a symlink: ELOOP), at
// most max of them (Errno::EFBIG for a bigger file; EINVAL for anything but a regular file).
static VALUE dh_read(VALUE self, VALUE name, VALUE max) {
  dirhandle *h = dh_get(self);
  const char *s = dh_component(name);
  long limit = NUM2LONG(max);
  if (limit < 0) rb_raise(rb_eArgError, "heapscope: a read limit must not be negative");
  // O_NONBLOCK: a FIFO put there must not hang the reader (it is refused as not regular).
  int fd = openat(h->fd, s, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) dh_fail(h, errno, s, "openat");
  return dh_read_fd(h, fd, s, limit);
}

// handle.unlink(name) -> nil. Removes the entry itself (a symlink, never what it points at).
static VALUE dh_unlink(VALUE self, VALUE name) {
  dirhandle *h = dh_get(self);
  const char *s = dh_component(name);
  if (unlinkat(h->fd, s, 0) != 0) dh_fail(h, errno, s, "unlinkat");
  return Qnil;
}

// Removes tmp if it still is the file with st's device and inode (the one this call created).
static void dh_remove_own(const dirhandle *h, const char *tmp, const struct stat *mine) {
  struct stat now;
  if (fstatat(h->fd, tmp, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == mine->st_dev && now.st_ino == mine->st_ino) {
    unlinkat(h->fd, tmp, 0);
  }
}

// handle.write_replace(tmp, name, data, perm) -> File::Stat of the file written. data goes into a new
// file tmp (never an existing one, never through a symlink), is fsynced, then the file is renamed to
// name, which replaces whatever name was (a symlink there is replaced, not followed). On failure the
// temp file is removed if it still is the one created here, and the error names the file it concerns.
static VALUE dh_write_replace(VALUE self, VALUE tmp_name, VALUE name, VALUE data, VALUE perm) {
  dirhandle *h = dh_get(self);
  const char *tmp = dh_component(tmp_name);
  const char *final = dh_component(name);
  mode_t mode = dh_mode(perm);
  if (!RB_TYPE_P(data, T_STRING)) rb_raise(rb_eTypeError, "heapscope: data must be a String, got %s", rb_obj_classname(data));
  // A frozen copy (sharing a large String's bytes): another thread changing data meanwhile changes a
  // copy of its own, never the bytes being written. Held on this stack, it is not moved by compaction.
  VALUE bytes = rb_str_new_frozen(data);

  // From here to the end no Ruby code runs and nothing raises before the temp file is dealt with.
  int fd = openat(h->fd, tmp, NEW_FILE_FLAGS, mode);
  if (fd < 0) dh_fail(h, errno, tmp, "openat");
  struct stat created, written;
  if (fstat(fd, &created) != 0) {
    int err = errno;
    close(fd);
    // Without its identity the file cannot be told from one someone else put there: it is left.
    dh_fail(h, err, tmp, "fstat");
  }
  write_job job = {.fd = fd, .bytes = RSTRING_PTR(bytes), .len = (size_t)RSTRING_LEN(bytes)};
  // Without the GVL, so other threads run during a long write or fsync. The variant that never checks
  // for interrupts afterwards (a Thread#raise there would leave the descriptor open); when an interrupt
  // was already pending it does not run the function, which is then run here, with the GVL.
  rb_thread_call_without_gvl2(write_all_without_gvl, &job, NULL, NULL);
  if (!job.ran) write_all_without_gvl(&job);
  int err = job.err;
  const char *culprit = tmp, *call = job.call;
  if (!err && fstat(fd, &written) != 0) { // size and mtime as written, for the caller
    err = errno;
    call = "fstat";
  }
  if (close(fd) != 0 && !err) {
    err = errno;
    call = "close";
  }
  if (!err && renameat(h->fd, tmp, h->fd, final) != 0) {
    err = errno;
    culprit = final;
    call = "renameat";
  }
  if (err) {
    dh_remove_own(h, tmp, &created);
    dh_fail(h, err, culprit, call);
  }
  RB_GC_GUARD(bytes);
  return rb_stat_new(&written);
}

static VALUE listing_read(VALUE arg) {
  listing *l = (listing *)arg;
  struct dirent *entry;
  errno = 0;
  while ((entry = readdir(l->dir)) != NULL) {
    const char *n = entry->d_name;
    if (strcmp(n, ".") != 0 && strcmp(n, "..") != 0) rb_ary_push(l->names, rb_str_new_cstr(n));
    errno = 0;
  }
  return errno ? INT2FIX(errno) : Qnil;
}

static VALUE listing_close(VALUE arg) {
  closedir(((listing *)arg)->dir);
  return Qnil;
}

// handle.entries -> the names in the directory, in the order the file system gives them. Read
// through a descriptor of its own (openat "."), so the handle's file offset, shared with a forked
// child, is never moved.
static VALUE dh_entries(VALUE self) {
  dirhandle *h = dh_get(self);
  VALUE names = rb_ary_new(); // first: nothing may raise while the descriptor below is unowned
  int fd = openat(h->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) dh_fail(h, errno, NULL, "openat");
  listing l = {.dir = fdopendir(fd), .names = names};
  if (!l.dir) {
    int err = errno;
    close(fd);
    dh_fail(h, err, NULL, "fdopendir");
  }
  VALUE failed = rb_ensure(listing_read, (VALUE)&l, listing_close, (VALUE)&l);
  if (!NIL_P(failed)) dh_fail(h, FIX2INT(failed), NULL, "readdir");
  return l.names;
}

static VALUE dh_path(VALUE self) {
  dirhandle *h;
  TypedData_Get_Struct(self, dirhandle, &dirhandle_type, h);
  return rb_str_new_cstr(h->path ? h->path : "");
}

static VALUE dh_close(VALUE self) {
  dirhandle *h;
  TypedData_Get_Struct(self, dirhandle, &dirhandle_type, h);
  dirhandle_close_fd(h);
  return Qnil;
}

static VALUE dh_closed_p(VALUE self) {
  dirhandle *h;
  TypedData_Get_Struct(self, dirhandle, &dirhandle_type, h);
  return h->fd < 0 ? Qtrue : Qfalse;
}

void dirhandle_define(VALUE mNative) {
  cDirHandle = rb_define_class_under(mNative, "DirHandle", rb_cObject);
  rb_undef_alloc_func(cDirHandle); // made by root and open_dir only
  rb_define_singleton_method(cDirHandle, "root", dh_s_root, 0);
  rb_define_method(cDirHandle, "open_dir", dh_open_dir, 1);
  rb_define_method(cDirHandle, "mkdir", dh_mkdir, 2);
  rb_define_method(cDirHandle, "stat", dh_stat, -1);
  rb_define_method(cDirHandle, "readlink", dh_readlink, 1);
  rb_define_method(cDirHandle, "unlink", dh_unlink, 1);
  rb_define_method(cDirHandle, "read", dh_read, 2);
  rb_define_method(cDirHandle, "write_replace", dh_write_replace, 4);
  rb_define_method(cDirHandle, "entries", dh_entries, 0);
  rb_define_method(cDirHandle, "path", dh_path, 0);
  rb_define_method(cDirHandle, "close", dh_close, 0);
  rb_define_method(cDirHandle, "closed?", dh_closed_p, 0);
}
