/* Per row of float32 logits: the index of the first maximum (as torch's argmax) and
 * the logsumexp, in two passes over the row instead of torch's max, subtract, exp
 * and sum (each a pass, two of them writing a temporary of the whole row).
 *
 * Rows holding a NaN give the first NaN's index and a NaN logsumexp (torch's max
 * propagates NaN the same way); a row whose maximum is +inf gives +inf, one that is
 * all -inf gives -inf. Rows run in parallel on torch's OpenMP pool.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16_math.h"

#define CHUNK 256

static void row_stats(const float *row, int64_t n, int64_t *index, float *lse) {
    float top = -INFINITY;
    int has_nan = 0;
#pragma omp simd reduction(max : top) reduction(| : has_nan)
    for (int64_t i = 0; i < n; ++i) {
        top = row[i] > top ? row[i] : top;
        has_nan |= row[i] != row[i];
    }
    /* The first position holding the maximum (or the first NaN): find its chunk with
     * a vectorized test, then the position inside it. */
    int64_t first = 0;
    for (int64_t start = 0; start < n; start += CHUNK) {
        const int64_t end = start + CHUNK < n ? start + CHUNK : n;
        int hit = 0;
#pragma omp simd reduction(| : hit)
        for (int64_t i = start; i < end; ++i)
            hit |= has_nan ? row[i] != row[i] : row[i] == top;
        if (hit) {
            for (first = start; first < end; ++first)
                if (has_nan ? row[first] != row[first] : row[first] == top) break;
            break;
        }
    }
    *index = first;
    if (has_nan) {
        *lse = NAN;
        return;
    }
    if (!isfinite(top)) { /* +inf, or every entry -inf */
        *lse = top;
        return;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += exp_nonpositive(row[i] - top);
    *lse = logf(sum) + top;
}

void argmax_logsumexp_f32(const float *logits, int64_t rows, int64_t n, int64_t *indices,
                          float *lse, int num_threads) {
    const int threads = rows > 1 ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r = 0; r < rows; ++r) row_stats(logits + r * n, n, indices + r, lse + r);
}
