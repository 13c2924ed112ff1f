// The reference dot products: one weight row's blocks with one row of quantized activations, each block read through
// its format's decoder (formats.hpp: decode), one value at a time. Every SIMD path is tested equal to these.
#include <cmath>
#include <type_traits>

#include "formats.hpp"

namespace specdemo {

namespace {

// Σ over `blocks` blocks of kind K: d_a·(d·Σ_g sc_g·Σ_i q_i·a_i − dmin·Σ_g m_g·Σ_i a_i), a the activations' i8 values
// (Q8_K for the K-quants, Q8_0 for the others: formats.hpp), the sums exact in integers, then f32 once a block.
template <Kind K>
float dot_row(const uint8_t* w, const void* activations, int blocks) {
    using Block = Decoded<K>;
    using Activations = std::conditional_t<Block::VALUES == 256, BlockQ8K, BlockQ8_0>;
    const auto* a = static_cast<const Activations*>(activations);
    float sum = 0;
    for (int b = 0; b < blocks; ++b, w += block_bytes(K)) {
        const Block v = decode<K>(w);
        int sumi = 0;
        for (int g = 0; g < Block::GROUPS; ++g) {
            int s = 0;
            for (int i = Block::G * g; i < Block::G * (g + 1); ++i) s += v.q[i] * a[b].q[i];
            sumi += v.sc[g] * s;
        }
        if constexpr (K == Kind::Q4_K) {
            int summ = 0;  // Σ_g m_g·Σa, the activations' sums per group of 32 taken as they are
            for (int g = 0; g < Block::GROUPS; ++g) summ += v.m[g] * a[b].sums32[g];
            sum += a[b].d * (fp16_to_fp32(v.d) * float(sumi) - fp16_to_fp32(v.dmin) * float(summ));
        } else {
            sum += a[b].d * fp16_to_fp32(v.d) * float(sumi);
        }
    }
    return sum;
}

template <Kind K>
void each_row(const uint8_t* w, int blocks, const uint8_t* activations, size_t row_bytes, int m_rows, float* out,
              size_t out_stride) {
    for (int m = 0; m < m_rows; ++m) out[m * out_stride] = dot_row<K>(w, activations + m * row_bytes, blocks);
}

}  // namespace

void silu_times_scalar(const float* gate, const float* up, float* out, size_t n) {
    for (size_t j = 0; j < n; ++j) out[j] = gate[j] * up[j] / (1.0f + std::exp(-gate[j]));
}

const Kernels& scalar_kernels() {
    static const Kernels kernels{"scalar",
                                 {each_row<Kind::Q4_K>, each_row<Kind::Q6_K>, each_row<Kind::Q8_0>,
                                  each_row<Kind::Q5_0>, each_row<Kind::Q4_0>},
                                 {}, nullptr, silu_times_scalar};
    return kernels;
}

}  // namespace specdemo
