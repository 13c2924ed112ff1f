// The gemm's activations (formats.hpp: ManyRows) quantized with AVX2: f32 products rounded to nearest, ties to even (the
// conversion's default mode; quantize.cpp's nearest() for the dot products), clamped, and the slot's sums; Q8_K blocks
// bit for bit as quantize.cpp makes them. A step of the 0.5B draft quantizes ~180k values: baseline loops took ~2.5 % of
// it on the 2-core Zen 3, all on the thread that runs the plugin's nodes, with the other one waiting. Against them,
// paired in one process on a quiet host: the draft's step 0.968×, 5 tokens 0.961×; the 1.5B target's 0.976×, 0.980×.
#include <immintrin.h>

#include <cstring>

#include "formats.hpp"

namespace specdemo {

namespace {

// |v| lane by lane, then the larger of it and amax: _mm256_max_ps returns its second operand where either is NaN, so a
// NaN is ignored, as larger_magnitude() does.
inline __m256 larger_magnitude(__m256 amax, __m256 v) {
    return _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), v), amax);
}

inline float largest_lane(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

inline int sum_of_lanes(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// 16 i32 (two vectors, in order) as 16 i8 in order (each already within i8).
inline __m128i narrow(__m256i a, __m256i b) {
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);  // 16 i16 in order
    return _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
}

// One row by slot (a.slot values: 16 or 32): q = x·(127 / max|x|) rounded, clamped to ±127, and the slot's sums.
void quantize_by_slot(const float* x, int m, ManyRows& a) {
    int8_t* q = a.q.data() + size_t(m) * a.columns;
    const int vectors = a.slot / 8;  // 2 or 4
    const __m256i top = _mm256_set1_epi32(127), bottom = _mm256_set1_epi32(-127);
    for (int j = 0; j < a.slots(); ++j, x += a.slot, q += a.slot) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int i = 0; i < vectors; ++i) amax = larger_magnitude(amax, v[i] = _mm256_loadu_ps(x + 8 * i));
        const float largest = largest_lane(amax);
        const __m256 inverse = _mm256_set1_ps(largest > 0 ? 127.f / largest : 0.f);
        __m256i values[4], lanes = _mm256_setzero_si256();  // lanes: Σ values at each position mod 8
        for (int i = 0; i < vectors; ++i) {
            values[i] = _mm256_max_epi32(bottom, _mm256_min_epi32(top, _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse))));
            lanes = _mm256_add_epi32(lanes, values[i]);
        }
        for (int i = 0; i < vectors; i += 2) _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 8 * i), narrow(values[i], values[i + 1]));
        int lane[8];
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(lane), lanes);
        const int even = lane[0] + lane[1] + lane[4] + lane[5], odd = lane[2] + lane[3] + lane[6] + lane[7];
        const int sum = even + odd;
        const size_t at = size_t(m) * a.slots() + j;
        const float d = largest / 127.f;
        a.scale[at] = d, a.start[at] = -a.offset * sum;
        if (!a.lane_start.empty())  // a quad's values 0 and 1 (the even i16 lane of maddubs) and 2 and 3 (the odd)
            a.lane_start[at] = int32_t(uint32_t(uint16_t(-a.offset * even)) | uint32_t(uint16_t(-a.offset * odd)) << 16);
    }
}

// One row as Q8_K blocks: the scale from the first value of the largest magnitude, signed, so that it becomes ∓127.
void quantize_q8_k(const float* x, int columns, BlockQ8K* out) {
    for (int b = 0; b < columns / 256; ++b, x += 256) {
        __m256 amax = _mm256_setzero_ps();
        for (int i = 0; i < 256; i += 8) amax = larger_magnitude(amax, _mm256_loadu_ps(x + i));
        const float largest_magnitude = largest_lane(amax);
        BlockQ8K& block = out[b];
        if (largest_magnitude == 0) {
            std::memset(&block, 0, sizeof block);
            continue;
        }
        float largest = 0;
        const __m256 wanted = _mm256_set1_ps(largest_magnitude), sign = _mm256_set1_ps(-0.f);
        for (int i = 0; i < 256; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i);
            const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v), wanted, _CMP_EQ_OQ));
            if (hits) {
                largest = x[i + __builtin_ctz(hits)];
                break;
            }
        }
        const float inverse = -127.f / largest;
        const __m256 scale = _mm256_set1_ps(inverse);
        const __m256i top = _mm256_set1_epi32(127);
        __m256i sixteens[16];  // Σ over each 16 values, lane by lane
        for (int g = 0; g < 16; ++g) {
            const float* at = x + 16 * g;
            const __m256i lo = _mm256_min_epi32(top, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(at), scale)));
            const __m256i hi = _mm256_min_epi32(top, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(at + 8), scale)));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(block.q + 16 * g), narrow(lo, hi));
            sixteens[g] = _mm256_add_epi32(lo, hi);
        }
        for (int g = 0; g < 16; ++g) block.bsums[g] = int16_t(sum_of_lanes(sixteens[g]));
        for (int j = 0; j < 8; ++j) block.sums32[j] = int16_t(block.bsums[2 * j] + block.bsums[2 * j + 1]);
        block.d = 1 / inverse;
    }
}

void quantize_rows(const float* x, int m, ManyRows& a) {
    if (!a.k.empty()) return quantize_q8_k(x, a.columns, a.k.data() + size_t(m) * (a.columns / 256));
    quantize_by_slot(x, m, a);
}

}  // namespace

// A pointer, not the function: only code of this file's own holds its AVX2 instructions (tests/models/
// test_kernels_isa_leak.py), and only the gemms of AVX2 and AVX-512 take it.
QuantizeFn avx2_quantizer() { return quantize_rows; }

}  // namespace specdemo
