#ifndef HEAPSCOPE_SITE_MATCH_H
#define HEAPSCOPE_SITE_MATCH_H

// site_match: whether a recorded allocation stack passes through a site, FILE:LINE as `heapscope top`
// prints it (FILE may be a path's tail: "app/cache.rb" matches "/srv/app/cache.rb", not
// "/srv/myapp/cache.rb"). Retainers (retainers.c) and previews (previews.c) pick a site's sampled
// objects with it, from recorder_each_object.
//
// NOTE: GVL held, outside the GC, after names_resolve (frame files are read from the recorder's
//       strings). Allocates nothing (Ruby or malloc), never raises: it runs inside recorder walks.
// NOTE: file must stay valid (and unmoved) while the matcher is used.

#include <ruby.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Answers per stack id are cached (direct-mapped): many records share a stack, and a stack's frames
// are read once instead of once per record.
#define SITE_MATCH_CACHE 256

typedef struct {
  const char *file;
  size_t file_len;
  int32_t line;
  uint32_t cached_ids[SITE_MATCH_CACHE]; // stack id + 1 (0: empty)
  bool cached_answers[SITE_MATCH_CACHE];
} site_match;

void site_match_init(site_match *m, const char *file, size_t file_len, int32_t line);

// Whether stack stack_id has a frame at the site's line in a file whose path ends with its FILE.
bool site_match_stack(site_match *m, uint32_t stack_id);

#endif
