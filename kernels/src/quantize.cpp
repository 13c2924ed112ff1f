// Activations to 8 bits, a row at a time, as llama.cpp quantizes them for each weight format (see formats.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats.hpp"

namespace specdemo {

namespace {

// Round to nearest, ties to even: the rounding ggml's reference quantizer uses for Q8_K (nearest_int). Adding 1.5·2^23
// leaves the integer in the mantissa's low bits (exact for |x| < 2^22; here |x| ≤ 127.5): no call into libm
// (nearbyint is one on baseline x86-64, ~20 µs a call of the op), so the loops vectorize.
inline int nearest(float x) {
    const float shifted = x + 12582912.f;
    int32_t bits;
    std::memcpy(&bits, &shifted, 4);
    return (bits & 0x007FFFFF) - 0x00400000;
}

// The larger of a running max|x| and |x| (NaN ignored, as fmax does), without libm's fmaxf.
inline float larger_magnitude(float amax, float x) { return std::max(amax, std::fabs(x)); }

void quantize_q8_k(const float* x, int columns, BlockQ8K* out) {
    for (int b = 0; b < columns / 256; ++b, x += 256) {
        float amax = 0, largest = 0;  // the largest magnitude (a loop that vectorizes), then its first value, signed
        for (int i = 0; i < 256; ++i) amax = larger_magnitude(amax, x[i]);
        for (int i = 0; i < 256; ++i) {
            if (std::fabs(x[i]) == amax) { largest = x[i]; break; }
        }
        BlockQ8K& block = out[b];
        if (amax == 0) {
            block.d = 0;
            std::memset(block.q, 0, sizeof block.q);
            std::memset(block.bsums, 0, sizeof block.bsums);
            std::memset(block.sums32, 0, sizeof block.sums32);
            continue;
        }
        const float inverse = -127.f / largest;  // the largest value becomes ∓127 exactly
        for (int i = 0; i < 256; ++i) {
            const int q = nearest(inverse * x[i]);
            block.q[i] = int8_t(q > 127 ? 127 : q);
        }
        for (int g = 0; g < 16; ++g) {
            int sum = 0;
            for (int i = 0; i < 16; ++i) sum += block.q[16 * g + i];
            block.bsums[g] = int16_t(sum);
        }
        for (int j = 0; j < 8; ++j) block.sums32[j] = int16_t(block.bsums[2 * j] + block.bsums[2 * j + 1]);
        block.d = 1 / inverse;
    }
}

void quantize_q8_0(const float* x, int columns, BlockQ8_0* out) {
    for (int b = 0; b < columns / 32; ++b, x += 32) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = larger_magnitude(amax, x[i]);
        const float d = amax / 127, inverse = d ? 1 / d : 0;
        for (int i = 0; i < 32; ++i) out[b].q[i] = int8_t(std::round(x[i] * inverse));
        out[b].d = fp16_round(d);
    }
}

}  // namespace

float fp16_round(float x) {
    // Through the half's bits: round the mantissa to 10 bits, ties to even; the scales are normal, finite halves.
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    const uint32_t sign = bits & 0x80000000u;
    bits &= 0x7FFFFFFFu;
    if (bits < 0x38800000u) {  // below the smallest normal half: flush through the subnormal grid
        const float step = 5.9604644775390625e-08f;  // 2^-24
        float magnitude;
        std::memcpy(&magnitude, &bits, 4);
        float rounded = std::nearbyint(magnitude / step) * step;
        uint32_t out;
        std::memcpy(&out, &rounded, 4);
        out |= sign;
        std::memcpy(&x, &out, 4);
        return x;
    }
    const uint32_t lsb = (bits >> 13) & 1;
    bits = (bits + 0x0FFF + lsb) & ~0x1FFFu;
    bits |= sign;
    std::memcpy(&x, &bits, 4);
    return x;
}

size_t quantized_row_bytes(Kind kind, int columns) {
    if (kind == Kind::Q4_K || kind == Kind::Q6_K) return size_t(columns / 256) * sizeof(BlockQ8K);
    return size_t(columns / 32) * sizeof(BlockQ8_0);
}

void ManyRows::resize(Kind kind, int m_rows, int m_columns, bool q8_k) {
    rows = m_rows, columns = m_columns, slot = slot_values(kind), offset = weight_offset(kind);
    const size_t by_slot = q8_k ? 0 : size_t(rows);  // one form or the other: the unused one holds nothing
    q.resize(by_slot * columns);
    scale.resize(by_slot * slots());
    start.resize(by_slot * slots());
    lane_start.resize(kind == Kind::Q6_K || kind == Kind::Q5_0 || kind == Kind::Q4_0 ? by_slot * slots() : 0);
    k.resize(q8_k ? size_t(rows) * (columns / 256) : 0);
}

void quantize_row(Kind kind, const float* x, int columns, void* out) {
    if (kind == Kind::Q4_K || kind == Kind::Q6_K) {
        quantize_q8_k(x, columns, static_cast<BlockQ8K*>(out));
    } else {
        quantize_q8_0(x, columns, static_cast<BlockQ8_0*>(out));
    }
}

}  // namespace specdemo
