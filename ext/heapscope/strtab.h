// strtab: interned byte strings (function names, file names, class names) referred to by id.
//
// Id 0 is always the empty string, so a zeroed struct field means "none" (as in profile.proto's
// string_table). Strings are never freed before the table: they name code, which is bounded.
//
// Pure C, no Ruby. Not thread-safe: the owner holds the GVL (or owns a private copy).
#ifndef HEAPSCOPE_STRTAB_H
#define HEAPSCOPE_STRTAB_H

#include <stddef.h>
#include <stdint.h>

#define STRTAB_ERROR UINT32_MAX

typedef struct strtab strtab;

// Returns a new table holding only "" (id 0), or NULL when memory is short.
strtab *strtab_new(void);
void strtab_free(strtab *table);

// Returns the id of bytes[0..len), adding it if new. Returns STRTAB_ERROR when memory is short
// (nothing is added then). Strings longer than STRTAB_MAX_LEN are cut to that length.
#define STRTAB_MAX_LEN 4096
uint32_t strtab_intern(strtab *table, const char *bytes, size_t len);
// The id of bytes[0..len) (cut like strtab_intern) if the table holds it, else STRTAB_ERROR. Adds nothing.
uint32_t strtab_find(const strtab *table, const char *bytes, size_t len);

// Returns the bytes of id (not NUL-terminated) and stores their length in *len. The pointer stays
// valid until the next strtab_intern on this table. An unknown id reads as "".
const char *strtab_get(const strtab *table, uint32_t id, size_t *len);

uint32_t strtab_count(const strtab *table);
size_t strtab_memory(const strtab *table);

// A read-only copy for a snapshot that is encoded without the GVL. NULL when memory is short.
strtab *strtab_clone(const strtab *table);

#endif
