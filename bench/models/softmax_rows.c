// A C model of two schedules for softmax rows streamed to memory (1024 rows of 4096 f32,
// 16 MiB in and out), each timed beside a memcpy of the same size, interleaved, so that
// a noisy shared machine moves both alike. Prints the median of the per-run ratios as
// "% of copy", as `fusebox bench ops` does.
//
//   two-pass:  per row, exps into a scratch row (the next row prefetched meanwhile),
//              then a pass of streaming stores that folds the next row's max
//              (the schedule of `cpu/softmax.rs` when its output streams).
//   pipelined: one loop stores row k - 1 from scratch, computes the exps of row k into
//              the other scratch row and prefetches D floats ahead; row k's max is a
//              pass of its own over the prefetched row.
//
// Build and run (AVX-512 machines only):
//   gcc -O2 -march=native -fopenmp bench/models/softmax_rows.c -o /tmp/softmax_rows -lm
//   OMP_NUM_THREADS=1 /tmp/softmax_rows [D]      (D defaults to 4096)
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ROWS = 1024, ROW = 4096, N = ROWS * ROW, RUNS = 61 };

static float *x, *y, *copy_src, *copy_dst;
static int ahead = ROW;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// e^v for v <= 0, as `simd::exp_lane`: 2^n by the 1.5*2^23 trick, degree-5 polynomial.
static inline __m512 exp16(__m512 v) {
    v = _mm512_max_ps(v, _mm512_set1_ps(-88.f));
    __m512 big = _mm512_fmadd_ps(v, _mm512_set1_ps(1.44269504f), _mm512_set1_ps(12582912.f));
    __m512 n = _mm512_sub_ps(big, _mm512_set1_ps(12582912.f));
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.69314575f), v);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.4286068e-6f), r);
    const float c[5] = {0.04189793f, 0.16667636f, 0.4999915f, 0.9999997f, 1.f};
    __m512 p = _mm512_set1_ps(0.008290313f);
    for (int k = 0; k < 5; k++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[k]));
    __m512i e = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_castps_si512(big), _mm512_set1_epi32(0x4B400000 - 127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

static inline float row_max(const float *r) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < ROW; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(r + i));
    return _mm512_reduce_max_ps(m);
}

// e = e^(z - m), returning the sum; prefetches `pf` (may be NULL) alongside.
static inline float exps(const float *z, float m, float *e, const float *pf) {
    __m512 mm = _mm512_set1_ps(m), acc = _mm512_setzero_ps();
    for (int i = 0; i < ROW; i += 16) {
        if (pf) _mm_prefetch((const char *)(pf + i), _MM_HINT_T1);
        __m512 w = exp16(_mm512_sub_ps(_mm512_loadu_ps(z + i), mm));
        acc = _mm512_add_ps(acc, w);
        _mm512_store_ps(e + i, w);
    }
    return _mm512_reduce_add_ps(acc);
}

static void two_pass(void) {
#pragma omp parallel
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int r0 = t * ROWS / nt, r1 = (t + 1) * ROWS / nt;
        float e[ROW] __attribute__((aligned(64)));
        float m = row_max(x + (size_t)r0 * ROW);
        for (int r = r0; r < r1; r++) {
            const float *z = x + (size_t)r * ROW, *next = r + 1 < r1 ? z + ROW : NULL;
            __m512 inv = _mm512_set1_ps(1.f / exps(z, m, e, next));
            __m512 mx = _mm512_set1_ps(-INFINITY);
            for (int i = 0; i < ROW; i += 16) {
                _mm512_stream_ps(y + (size_t)r * ROW + i, _mm512_mul_ps(_mm512_load_ps(e + i), inv));
                if (next) mx = _mm512_max_ps(mx, _mm512_loadu_ps(next + i));
            }
            m = _mm512_reduce_max_ps(mx);
        }
        _mm_sfence();
    }
}

static void pipelined(void) {
#pragma omp parallel
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int r0 = t * ROWS / nt, r1 = (t + 1) * ROWS / nt;
        float scratch[2][ROW] __attribute__((aligned(64)));
        const float *end = x + (size_t)r1 * ROW;
        float inv_prev = 0;
        for (int r = r0; r < r1; r++) {
            const float *z = x + (size_t)r * ROW;
            float *e = scratch[r & 1], *e_prev = scratch[(r + 1) & 1], *out_prev = y + (size_t)(r - 1) * ROW;
            __m512 mm = _mm512_set1_ps(row_max(z)), acc = _mm512_setzero_ps(), inv = _mm512_set1_ps(inv_prev);
            for (int i = 0; i < ROW; i += 16) {
                if (z + i + ahead < end) _mm_prefetch((const char *)(z + i + ahead), _MM_HINT_T1);
                __m512 w = exp16(_mm512_sub_ps(_mm512_loadu_ps(z + i), mm));
                acc = _mm512_add_ps(acc, w);
                _mm512_store_ps(e + i, w);
                if (r > r0) _mm512_stream_ps(out_prev + i, _mm512_mul_ps(_mm512_load_ps(e_prev + i), inv));
            }
            inv_prev = 1.f / _mm512_reduce_add_ps(acc);
            if (r + 1 == r1) {
                __m512 last = _mm512_set1_ps(inv_prev);
                for (int i = 0; i < ROW; i += 16)
                    _mm512_stream_ps(y + (size_t)r * ROW + i, _mm512_mul_ps(_mm512_load_ps(e + i), last));
            }
        }
        _mm_sfence();
    }
}

static void copy(void) {
#pragma omp parallel
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t per = N / nt;
        for (size_t o = t * per; o < (t + 1) * per; o += 16384) memcpy(copy_dst + o, copy_src + o, 16384 * 4);
    }
}

static int by_value(const void *a, const void *b) {
    double d = *(const double *)a - *(const double *)b;
    return (d > 0) - (d < 0);
}

int main(int argc, char **argv) {
    if (argc > 1) ahead = atoi(argv[1]);
    float **bufs[4] = {&x, &y, &copy_src, &copy_dst};
    for (int b = 0; b < 4; b++) {
        *bufs[b] = aligned_alloc(64, (size_t)N * 4);
        for (size_t i = 0; i < N; i++) (*bufs[b])[i] = (float)(i * 2654435761u % 1000) / 125.f;
    }
    void (*schedule[2])(void) = {two_pass, pipelined};
    const char *name[2] = {"two-pass", "pipelined"};
    static double ratio[2][RUNS];
    for (int run = 0; run < RUNS; run++)
        for (int s = 0; s < 2; s++) {
            double t = now();
            schedule[s]();
            t = now() - t;
            double c = now();
            copy();
            ratio[s][run] = (now() - c) / t;
        }
    for (int s = 0; s < 2; s++) {
        qsort(ratio[s], RUNS, sizeof(double), by_value);
        printf("%-10s %5.1f%% of copy (quartiles %5.1f, %5.1f)\n", name[s], 100 * ratio[s][RUNS / 2],
               100 * ratio[s][RUNS / 4], 100 * ratio[s][3 * RUNS / 4]);
    }
    return 0;
}
