/* How the quantized kernels split output rows between OpenMP threads. */
#ifndef SLUICEWAY_THREAD_ROWS_H
#define SLUICEWAY_THREAD_ROWS_H

#include <omp.h>
#include <stdint.h>

/* This thread's share of `out` output rows: one contiguous run, so each thread
 * streams its own part of the weights. Called inside a parallel region. */
static inline __attribute__((always_inline)) void thread_rows(int64_t out, int64_t *begin,
                                                              int64_t *end) {
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    *begin = out * me / threads;
    *end = out * (me + 1) / threads;
}

#endif
