// fuzz_input.h: turns the fuzzer's bytes into decisions (numbers in a range, byte strings), reading
// zeros once the input runs out, so every input is a complete, valid scenario.
//
// FUZZ_STANDALONE builds a main() that replays files (the checked-in corpus) without libFuzzer, so
// `rake test_c` can run the seeds with any compiler.
#ifndef HEAPSCOPE_FUZZ_INPUT_H
#define HEAPSCOPE_FUZZ_INPUT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const uint8_t *p;
  size_t left;
} fz_input;

static uint64_t fz_bits(fz_input *in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes && in->left > 0; i++, in->left--) v = (v << 8) | *in->p++;
  return v;
}

// A number in [0, n) (n > 0), from as few bytes as n needs.
static uint32_t fz_below(fz_input *in, uint32_t n) {
  int bytes = n <= 0x100 ? 1 : n <= 0x10000 ? 2 : 4;
  return (uint32_t)(fz_bits(in, bytes) % n);
}

// Up to max bytes, stored in out; returns how many.
__attribute__((unused)) static size_t fz_bytes(fz_input *in, uint8_t *out, size_t max) {
  size_t n = fz_below(in, (uint32_t)max + 1);
  if (n > in->left) n = in->left;
  memcpy(out, in->p, n);
  in->p += n;
  in->left -= n;
  return n;
}

// Fails the run (libFuzzer records the input as a crash).
#define FZ_ASSERT(cond)                                                         \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                  \
    }                                                                           \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifdef FUZZ_STANDALONE
// Replays each file named on the command line; prints "N passed, 0 failed" (a failure aborts).
int main(int argc, char **argv) {
  int passed = 0;
  for (int i = 1; i < argc; i++) {
    FILE *f = fopen(argv[i], "rb");
    if (f == NULL) {
      perror(argv[i]);
      return 1;
    }
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    uint8_t *copy = malloc(n ? n : 1); // its own allocation, so ASan sees reads past the end
    memcpy(copy, buf, n);
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
    passed++;
  }
  printf("corpus replay (%s)\n%d passed, 0 failed\n", argc > 0 ? argv[0] : "", passed);
  return 0;
}
#endif

#endif
