// window: when the allocation hook is on, in windowed sampling (the default).
//
// An enabled NEWOBJ hook costs every allocation about 380 instructions, and any GC event hook about 180,
// sampled or not, because the VM leaves its fast allocation path while one is registered. So in windowed
// mode the hook is on only for short windows, opened inside the GC (capture.c):
//
//   GC ... | delay (counted, not sampled) | sampled part: 1-in-`every` | hook off ........ | GC ...
//          |<------------------------ stride: the allocations until the next GC ------------------->|
//
// Every GC ends one stride and starts the next (a window still open then is cut short), so strides
// partition the run, and a stride's length never depends on its coin. A stride gets a window with probability q (a coin flip), and each sample of that window stands
// for every * stride / (sampled * q) allocations (sampled: the allocations its sampled part saw): the samples of one window add up to its stride, and
// over the coin, every stride counts once: the estimates are unbiased (Horvitz-Thompson), whatever
// the GCs' timing. q is 1 while GCs are far enough apart for the hook-on share; when they come more
// often, q falls in proportion (and windows keep their minimum length). The stride counts every
// allocation with the VM's own counter, so a stride that ends early (GCs come in bursts where the heap
// fills with live data) weighs little, and the window that sampled it too.
//
// Where a window sits within its stride decides bias. GC timing follows allocation volume, not time or
// code position, so a window at a GC lands on allocations in proportion to how many each site makes. A
// GC triggered by malloc growth, though, lands in the code that grew memory; the random delay (uniform,
// in allocations) moves the window off it.
//
// Pure C, no Ruby: unit-tested on its own (test/c/test_window.c).
#ifndef HEAPSCOPE_WINDOW_H
#define HEAPSCOPE_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

// The shortest sampled part: shorter windows see too few allocations around the GC to be representative.
#define WINDOW_MIN_LENGTH 256u
// The delay is uniform over [0, WINDOW_DELAY_SPAN * length]: long enough that where the GC happened
// in the program's code says little about where the window samples (measured on the phases workload of
// test/test_windowed_accuracy.rb: with 1, its allocation estimates were off by 21-28% at one site; with
// 8, by 8-17% at its retained sites, and its live estimates by more: docs/architecture.md, known limits),
// at the price of a hook-on share spent mostly counting, not sampling.
#ifndef WINDOW_DELAY_SPAN
#define WINDOW_DELAY_SPAN 8
#endif
// The first this many windows ignore the share's coin (window_plan_next's warm_up): a process that was
// just started has had few GCs, and short strides would give it only a window now and then. It costs
// this many windows' worth of hook-on allocations once: at most 16 x 9 x 256 = 36,864.
#define WINDOW_WARM_UP 16
// The first window's delay (at start) is uniform over about one GC interval, up to this many allocations.
#define WINDOW_FIRST_DELAY_MAX (1u << 16)
// The longest sampled part (a bound for counters, reached only when GCs are millions of allocations apart).
#define WINDOW_MAX_LENGTH (1u << 26)

typedef struct {
  uint64_t delay;     // allocations counted before sampling starts: uniform in [0, WINDOW_DELAY_SPAN * length]
  uint64_t length;    // allocations in the sampled part
  uint32_t every;     // the sampling rate inside the sampled part: 1 in every
  double probability; // the chance this stride had of getting a window (q above)
} window_plan;

// Plans the window of a stride that starts now and is expected to be `previous` allocations long (0:
// unknown, at start: the minimum length), so the hook stays on for about `share` of allocations on
// average, and samples come at about 1 in sample_every allocations overall. random0 and random1 are
// uniform 64-bit numbers. Returns false when the coin says no window for this stride (plan->probability
// is still set); true with the plan filled in. With warm_up, no coin: a window for sure (probability 1),
// whatever the share says.
bool window_plan_next(double share, uint64_t previous, uint32_t sample_every, uint64_t random0, uint64_t random1,
                      bool warm_up, window_plan *plan);

// Plans the window opened at start: like the first window of window_plan_next, but its delay is uniform
// over the allocations until about the next GC (gc_interval, an estimate): the start is a fixed point in
// the program's code, and a window right after it would sample that code only. (It costs hook-on
// allocations once per run.)
void window_plan_first(double share, uint32_t sample_every, uint64_t gc_interval, uint64_t random, window_plan *plan);

// The allocations each sample of a window stands for: every * stride / (sampled * probability), where
// sampled (> 0) is how many allocations the sampled part has seen and stride how many the VM made since
// the window's stride started.
double window_weight(const window_plan *plan, uint64_t sampled, uint64_t stride);

#endif
