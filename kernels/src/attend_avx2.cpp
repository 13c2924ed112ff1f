// CachedAttention's kernel with AVX2 and FMA (attention.hpp): the scores of a block's rows 4 positions at a time with
// those 4 keys in L1 for all rows, e^x on 8 lanes (glu.hpp), then the values POSITIONS_A_PASS positions at a time for
// all rows, 64 columns of a row's sums in registers. A key-value head's cache is read once a block of rows, not once a
// row. Compiled with -mavx2 -mfma -mf16c; chosen only where the CPU has them.
#include <immintrin.h>

#include <algorithm>
#include <limits>

#include "attention.hpp"
#include "glu.hpp"

namespace specdemo {

namespace {

constexpr size_t POSITIONS_A_PASS = 16;  // values summed into every row's output while they are in L1 (8 KiB at d 128)

// q·k over d columns for 4 positions (k, k + stride, …): 4 sums in one vector, each (per 128-bit half: lanes 0+1 plus
// lanes 2+3) then the two halves added.
inline __m128 dot4(const float* q, const float* k, size_t stride, size_t d) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < d; i += 8) {
        const __m256 x = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + i), a0);
        a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + stride + i), a1);
        a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 2 * stride + i), a2);
        a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k + 3 * stride + i), a3);
    }
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// dot4 for two query rows at once (each row's sums in dot4's order: the same bits): the keys loaded once for both, and
// 8 independent sums in flight where one row's 4 would wait on the FMA's latency.
inline void dot4x2(const float* q0, const float* q1, const float* k, size_t stride, size_t d, __m128& s0, __m128& s1) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (size_t i = 0; i < d; i += 8) {
        const __m256 x = _mm256_loadu_ps(q0 + i), y = _mm256_loadu_ps(q1 + i);
        const __m256 k0 = _mm256_loadu_ps(k + i), k1 = _mm256_loadu_ps(k + stride + i);
        const __m256 k2 = _mm256_loadu_ps(k + 2 * stride + i), k3 = _mm256_loadu_ps(k + 3 * stride + i);
        a0 = _mm256_fmadd_ps(x, k0, a0), b0 = _mm256_fmadd_ps(y, k0, b0);
        a1 = _mm256_fmadd_ps(x, k1, a1), b1 = _mm256_fmadd_ps(y, k1, b1);
        a2 = _mm256_fmadd_ps(x, k2, a2), b2 = _mm256_fmadd_ps(y, k2, b2);
        a3 = _mm256_fmadd_ps(x, k3, a3), b3 = _mm256_fmadd_ps(y, k3, b3);
    }
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
    s0 = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    s1 = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

// One position's q·k, summed in dot4's order (the same bits as there: which one scores a position depends on the call).
inline float dot1(const float* q, const float* k, size_t d) {
    __m256 a = _mm256_setzero_ps();
    for (size_t i = 0; i < d; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), a);
    const __m256 pairs = _mm256_hadd_ps(a, a);
    const __m256 t = _mm256_hadd_ps(pairs, pairs);
    return _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}

// A row's scores (n of them) → e^(score − their max), in place; returns their sum.
float exponentiate(float* scores, size_t n) {
    __m256 tops = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    size_t s = 0;
    for (; s + 8 <= n; s += 8) tops = _mm256_max_ps(tops, _mm256_loadu_ps(scores + s));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, tops);
    float top = *std::max_element(lanes, lanes + 8);
    for (; s < n; ++s) top = std::max(top, scores[s]);
    __m256 sums = _mm256_setzero_ps();
    s = 0;
    for (; s + 8 <= n; s += 8) {
        const __m256 p = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(scores + s), _mm256_set1_ps(top)));
        _mm256_storeu_ps(scores + s, p);
        sums = _mm256_add_ps(sums, p);
    }
    _mm256_store_ps(lanes, sums);
    float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (; s < n; ++s) total += scores[s] = _mm256_cvtss_f32(exp_ps(_mm256_set1_ps(scores[s] - top)));
    return total;
}

// out[c .. c + 8·NV) += Σ_{s in [first, last)} p_s·v_s[c ..] for c = column.
template <int NV>
void add_values(const float* p, const float* v, size_t stride, size_t first, size_t last, size_t column, float* out) {
    __m256 acc[NV];
    for (int j = 0; j < NV; ++j) acc[j] = _mm256_loadu_ps(out + column + 8 * j);
    for (size_t s = first; s < last; ++s) {
        const __m256 weight = _mm256_broadcast_ss(p + s);
        const float* row = v + s * stride + column;
        for (int j = 0; j < NV; ++j) acc[j] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(row + 8 * j), acc[j]);
    }
    for (int j = 0; j < NV; ++j) _mm256_storeu_ps(out + column + 8 * j, acc[j]);
}

template <int NV>
void weigh_values(const Rows& rows, const float* p, size_t width, const float* v, size_t stride, size_t d) {
    const size_t most = *std::max_element(rows.n, rows.n + rows.rows);
    for (size_t column = 0; column < d; column += 8 * NV)
        for (size_t first = 0; first < most; first += POSITIONS_A_PASS)
            for (size_t r = 0; r < rows.rows; ++r)
                if (first < rows.n[r])
                    add_values<NV>(p + r * width, v, stride, first, std::min(first + POSITIONS_A_PASS, rows.n[r]),
                                   column, rows.out[r]);
}

// AttendFn (attention.hpp).
void attend(const Rows& rows, const float* k, const float* v, size_t stride, size_t d, float scale, float* scores) {
    const size_t most = *std::max_element(rows.n, rows.n + rows.rows), width = (most + 3) / 4 * 4;
    const __m128 scaled = _mm_set1_ps(scale);
    size_t s = 0;
    for (; s + 4 <= most; s += 4) {
        size_t r = 0;
        for (; r + 2 <= rows.rows; r += 2) {
            if (s < rows.n[r] && s < rows.n[r + 1]) {
                __m128 s0, s1;
                dot4x2(rows.q[r], rows.q[r + 1], k + s * stride, stride, d, s0, s1);
                _mm_storeu_ps(scores + r * width + s, _mm_mul_ps(s0, scaled));
                _mm_storeu_ps(scores + (r + 1) * width + s, _mm_mul_ps(s1, scaled));
                continue;
            }
            for (const size_t one : {r, r + 1})
                if (s < rows.n[one])
                    _mm_storeu_ps(scores + one * width + s,
                                  _mm_mul_ps(dot4(rows.q[one], k + s * stride, stride, d), scaled));
        }
        if (r < rows.rows && s < rows.n[r])
            _mm_storeu_ps(scores + r * width + s, _mm_mul_ps(dot4(rows.q[r], k + s * stride, stride, d), scaled));
    }
    for (; s < most; ++s)
        for (size_t r = 0; r < rows.rows; ++r)
            if (s < rows.n[r]) scores[r * width + s] = dot1(rows.q[r], k + s * stride, d) * scale;
    float* totals = scores + rows.rows * width;  // no std::vector here: its code would be an inline this file shares
    for (size_t r = 0; r < rows.rows; ++r) {
        totals[r] = exponentiate(scores + r * width, rows.n[r]);
        std::fill(rows.out[r], rows.out[r] + d, 0.0f);
    }
    if (d % 64 == 0) weigh_values<8>(rows, scores, width, v, stride, d);
    else if (d % 32 == 0) weigh_values<4>(rows, scores, width, v, stride, d);
    else weigh_values<1>(rows, scores, width, v, stride, d);
    for (size_t r = 0; r < rows.rows; ++r) {
        const __m256 inverse = _mm256_set1_ps(totals[r] > 0 ? 1.0f / totals[r] : 0.0f);
        for (size_t i = 0; i < d; i += 8)
            _mm256_storeu_ps(rows.out[r] + i, _mm256_mul_ps(_mm256_loadu_ps(rows.out[r] + i), inverse));
    }
}

}  // namespace

AttendFn avx2_attention() { return attend; }

}  // namespace specdemo
