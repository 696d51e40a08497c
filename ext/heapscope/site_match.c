#include "site_match.h"

#include <string.h>

#include "capture.h"
#include "names.h"
#include "recorder.h"
#include "stacktab.h"
#include "strtab.h"

void site_match_init(site_match *m, const char *file, size_t file_len, int32_t line) {
  memset(m, 0, sizeof(*m));
  m->file = file;
  m->file_len = file_len;
  m->line = line;
}

// Whether path ends with suffix at a path component boundary ("app/cache.rb" matches
// "/srv/app/cache.rb", not "/srv/myapp/cache.rb").
static bool path_ends_with(const char *path, size_t len, const char *suffix, size_t suffix_len) {
  if (suffix_len > len || memcmp(path + len - suffix_len, suffix, suffix_len) != 0) return false;
  return suffix_len == len || path[len - suffix_len - 1] == '/' || suffix[0] == '/';
}

static bool stack_passes(const site_match *m, uint32_t stack_id) {
  recorder *r = capture_recorder();
  uint32_t n = 0;
  const uint32_t *frame_ids = stacktab_stack(recorder_stacks(r), stack_id, &n);
  for (uint32_t k = 0; frame_ids != NULL && k < n; k++) {
    const hs_frame *frame = stacktab_frame(recorder_stacks(r), frame_ids[k]);
    if (frame == NULL || frame->line != m->line || frame->code_id == 0) continue;
    uint32_t function_id = 0, file_id = 0;
    bool is_c = false;
    names_code_info(capture_names(), frame->code_id, &function_id, &file_id, &is_c);
    size_t len = 0;
    const char *file = file_id ? strtab_get(recorder_strings(r), file_id, &len) : NULL;
    if (file != NULL && path_ends_with(file, len, m->file, m->file_len)) return true;
  }
  return false;
}

bool site_match_stack(site_match *m, uint32_t stack_id) {
  size_t i = stack_id % SITE_MATCH_CACHE;
  if (m->cached_ids[i] == stack_id + 1) return m->cached_answers[i];
  bool answer = stack_passes(m, stack_id);
  m->cached_ids[i] = stack_id + 1;
  m->cached_answers[i] = answer;
  return answer;
}
