// fault_alloc.h: force-included (-include) into the module sources of test_faults only. It routes
// their malloc/calloc/realloc through test_faults.c, which can make the Nth allocation fail.
#ifndef HEAPSCOPE_TEST_FAULT_ALLOC_H
#define HEAPSCOPE_TEST_FAULT_ALLOC_H
#include <stdlib.h>
#include <string.h>
void *fault_malloc(size_t n);
void *fault_calloc(size_t count, size_t n);
void *fault_realloc(void *p, size_t n);
#define malloc(n) fault_malloc(n)
#define calloc(c, n) fault_calloc(c, n)
#define realloc(p, n) fault_realloc(p, n)
#endif
