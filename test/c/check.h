// check.h: the pure-C tests' tiny harness. CHECK records a failure (with file and line) and goes on,
// so one run lists every broken expectation; check_report prints the suite name and then the last line
// the Rakefile reads, exactly "N passed, M failed", and returns the process's exit status.
#ifndef HEAPSCOPE_TEST_CHECK_H
#define HEAPSCOPE_TEST_CHECK_H

#include <stdbool.h>
#include <stdio.h>

static unsigned long check_passed, check_failed;

#define CHECK(cond)                                                         \
  do {                                                                      \
    if (cond) {                                                             \
      check_passed++;                                                       \
    } else {                                                                \
      check_failed++;                                                       \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                       \
  } while (0)

#define CHECK_EQ_U64(a, b)                                                                      \
  do {                                                                                          \
    unsigned long long check_a_ = (unsigned long long)(a), check_b_ = (unsigned long long)(b); \
    if (check_a_ == check_b_) {                                                                 \
      check_passed++;                                                                           \
    } else {                                                                                    \
      check_failed++;                                                                           \
      fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%llu != %llu)\n", __FILE__, __LINE__, #a, #b, check_a_, check_b_); \
    }                                                                                           \
  } while (0)

static inline int check_report(const char *suite) {
  printf("%s\n%lu passed, %lu failed\n", suite, check_passed, check_failed);
  return check_failed == 0 ? 0 : 1;
}

#endif
