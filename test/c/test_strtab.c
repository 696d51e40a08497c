// Unit tests for ext/heapscope/strtab.c: id 0 is "", interning deduplicates, growth keeps earlier
// strings, long strings are cut, clones are independent.
#include <stdlib.h>
#include <string.h>

#include "../../ext/heapscope/strtab.h"
#include "check.h"

static bool has(const strtab *t, uint32_t id, const char *bytes, size_t len) {
  size_t got_len;
  const char *got = strtab_get(t, id, &got_len);
  return got_len == len && memcmp(got, bytes, len) == 0;
}

static void test_basics(void) {
  strtab *t = strtab_new();
  CHECK(t != NULL);
  CHECK_EQ_U64(strtab_count(t), 1);
  CHECK(has(t, 0, "", 0));
  CHECK_EQ_U64(strtab_intern(t, "", 0), 0);
  CHECK_EQ_U64(strtab_intern(t, NULL, 0), 0);
  uint32_t a = strtab_intern(t, "String", 6);
  uint32_t b = strtab_intern(t, "Strin", 5); // a prefix is another string
  CHECK_EQ_U64(a, 1);
  CHECK_EQ_U64(b, 2);
  CHECK_EQ_U64(strtab_intern(t, "String", 6), a);
  char copy[] = "String";
  CHECK_EQ_U64(strtab_intern(t, copy, 6), a); // by content, not pointer
  CHECK(has(t, a, "String", 6));
  CHECK(has(t, b, "Strin", 5));
  // Embedded NUL bytes are part of the string.
  uint32_t z = strtab_intern(t, "a\0b", 3);
  CHECK(z != strtab_intern(t, "a\0c", 3));
  CHECK(has(t, z, "a\0b", 3));
  // Unknown ids read as "".
  CHECK(has(t, 1000, "", 0));
  CHECK(has(t, STRTAB_ERROR, "", 0));
  CHECK(strtab_memory(t) > 1024);
  strtab_free(t);
  strtab_free(NULL);
}

static void test_growth(void) {
  strtab *t = strtab_new();
  char buf[64];
  unsigned wrong = 0;
  // Enough strings to grow the entries (64), bytes (1024) and the index several times.
  for (int i = 0; i < 20000; i++) {
    int len = snprintf(buf, sizeof buf, "method_%d_in_some_file.rb", i);
    if (strtab_intern(t, buf, (size_t)len) != (uint32_t)i + 1) wrong++;
  }
  CHECK_EQ_U64(strtab_count(t), 20001);
  for (int i = 0; i < 20000; i++) {
    int len = snprintf(buf, sizeof buf, "method_%d_in_some_file.rb", i);
    if (!has(t, (uint32_t)i + 1, buf, (size_t)len)) wrong++;
    if (strtab_intern(t, buf, (size_t)len) != (uint32_t)i + 1) wrong++;
  }
  CHECK_EQ_U64(wrong, 0);
  CHECK_EQ_U64(strtab_count(t), 20001);
  strtab_free(t);
}

static void test_long_strings(void) {
  strtab *t = strtab_new();
  size_t big = STRTAB_MAX_LEN * 3;
  char *s = malloc(big);
  memset(s, 'x', big);
  uint32_t id = strtab_intern(t, s, big);
  size_t len;
  strtab_get(t, id, &len);
  CHECK_EQ_U64(len, STRTAB_MAX_LEN);
  // Cut to the same prefix: the same id.
  CHECK_EQ_U64(strtab_intern(t, s, STRTAB_MAX_LEN), id);
  CHECK_EQ_U64(strtab_intern(t, s, STRTAB_MAX_LEN + 1), id);
  CHECK(strtab_intern(t, s, STRTAB_MAX_LEN - 1) != id);
  // A string bigger than the whole byte buffer grows it in one step.
  strtab *u = strtab_new();
  CHECK(has(u, strtab_intern(u, s, STRTAB_MAX_LEN), s, STRTAB_MAX_LEN));
  strtab_free(u);
  free(s);
  strtab_free(t);
}

static void test_clone(void) {
  strtab *t = strtab_new();
  uint32_t a = strtab_intern(t, "alpha", 5), b = strtab_intern(t, "beta", 4);
  strtab *c = strtab_clone(t);
  CHECK(c != NULL);
  CHECK_EQ_U64(strtab_count(c), 3);
  // The original changes; the clone does not.
  for (int i = 0; i < 1000; i++) {
    char buf[16];
    int len = snprintf(buf, sizeof buf, "s%d", i);
    (void)strtab_intern(t, buf, (size_t)len);
  }
  strtab_free(t);
  CHECK(has(c, 0, "", 0));
  CHECK(has(c, a, "alpha", 5));
  CHECK(has(c, b, "beta", 4));
  CHECK(has(c, 3, "", 0));
  strtab_free(c);
  // A clone of an empty table.
  strtab *e = strtab_new();
  strtab *ec = strtab_clone(e);
  CHECK(ec != NULL && strtab_count(ec) == 1 && has(ec, 0, "", 0));
  strtab_free(ec);
  strtab_free(e);
}

int main(void) {
  test_basics();
  test_growth();
  test_long_strings();
  test_clone();
  return check_report("test_strtab");
}
