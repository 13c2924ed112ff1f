// The swiglu epilogue on 8 lanes, for the SIMD files (dot_avx2.cpp, dot_avx512.cpp), each compiling its own copy with
// its own flags: in an anonymous namespace, so that the linker never shares one between ISAs.
#pragma once

#include <immintrin.h>

#include <initializer_list>

#include "formats.hpp"

namespace specdemo {
namespace {

// e^x for x clamped to [−87, 88] (a finite, normal result): 2^k·e^r with k = round(x·log2 e) and r = x − k·ln 2 in
// [−ln2/2, ln2/2] (ln 2 in two parts, so that k·ln 2 is exact to f32), e^r by its Taylor polynomial to r^6 (the next
// term, r^7/7! ≤ 1.2e-7 relative), 2^k written into the exponent bits.
inline __m256 exp_ps(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.428606765330187e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    for (const float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    const __m256i two_k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_k));
}

// GluFn (formats.hpp): gate·up / (1 + e^−gate), 8 at a time, the tail by the scalar path.
inline void silu_times_ymm(const float* gate, const float* up, float* out, size_t n) {
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 g = _mm256_loadu_ps(gate + j);
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(out + j, _mm256_div_ps(_mm256_mul_ps(g, _mm256_loadu_ps(up + j)),
                                                _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    }
    if (j < n) silu_times_scalar(gate + j, up + j, out + j, n - j);
}

}  // namespace
}  // namespace specdemo
