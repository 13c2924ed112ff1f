// The reference dot products: one weight row's blocks with one row of quantized activations, written from the
// formats (formats.hpp) one value at a time. Every SIMD path is tested equal to these.
#include "formats.hpp"

namespace specdemo {

namespace {

float dot_q4_k_row(const uint8_t* w, const void* activations, int blocks) {
    const auto* a = static_cast<const BlockQ8K*>(activations);
    float sum = 0;
    for (int b = 0; b < blocks; ++b, w += Q4_K_BYTES) {
        uint8_t sc[8], m[8];
        unpack_q4_k_scales(w + 4, sc, m);
        const uint8_t* qs = w + 16;
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; ++j) {  // sub-block j: bytes 32·(j/2)…, low nibbles for even j, high for odd
            int s = 0;
            for (int i = 0; i < 32; ++i) {
                const uint8_t byte = qs[32 * (j / 2) + i];
                s += (j % 2 ? byte >> 4 : byte & 0x0F) * a[b].q[32 * j + i];
            }
            sumi += sc[j] * s;
            summ += m[j] * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
        }
        sum += a[b].d * (read_fp16(w) * float(sumi) - read_fp16(w + 2) * float(summ));
    }
    return sum;
}

float dot_q6_k_row(const uint8_t* w, const void* activations, int blocks) {
    const auto* a = static_cast<const BlockQ8K*>(activations);
    float sum = 0;
    for (int b = 0; b < blocks; ++b, w += Q6_K_BYTES) {
        const uint8_t *ql = w, *qh = w + 128;
        const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
        int q[256];
        for (int h = 0; h < 2; ++h) {  // each half: 128 weights from 64 bytes of low nibbles and 32 of high bits
            for (int i = 0; i < 32; ++i) {
                const uint8_t low0 = ql[64 * h + i], low1 = ql[64 * h + 32 + i], high = qh[32 * h + i];
                q[128 * h + i] = ((low0 & 0x0F) | ((high & 3) << 4)) - 32;
                q[128 * h + 32 + i] = ((low1 & 0x0F) | (((high >> 2) & 3) << 4)) - 32;
                q[128 * h + 64 + i] = ((low0 >> 4) | (((high >> 4) & 3) << 4)) - 32;
                q[128 * h + 96 + i] = ((low1 >> 4) | (((high >> 6) & 3) << 4)) - 32;
            }
        }
        int sumi = 0;
        for (int g = 0; g < 16; ++g) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += q[16 * g + i] * a[b].q[16 * g + i];
            sumi += sc[g] * s;
        }
        sum += a[b].d * read_fp16(w + 208) * float(sumi);
    }
    return sum;
}

float dot_q8_0_row(const uint8_t* w, const void* activations, int blocks) {
    const auto* a = static_cast<const BlockQ8_0*>(activations);
    float sum = 0;
    for (int b = 0; b < blocks; ++b, w += Q8_0_BYTES) {
        const auto* q = reinterpret_cast<const int8_t*>(w + 2);
        int s = 0;
        for (int i = 0; i < 32; ++i) s += q[i] * a[b].q[i];
        sum += read_fp16(w) * a[b].d * float(s);
    }
    return sum;
}

float dot_q5_0_row(const uint8_t* w, const void* activations, int blocks) {
    const auto* a = static_cast<const BlockQ8_0*>(activations);
    float sum = 0;
    for (int b = 0; b < blocks; ++b, w += Q5_0_BYTES) {
        const uint32_t high = uint32_t(w[2]) | uint32_t(w[3]) << 8 | uint32_t(w[4]) << 16 | uint32_t(w[5]) << 24;
        const uint8_t* qs = w + 6;
        int s = 0;
        for (int i = 0; i < 32; ++i) {
            const int low = i < 16 ? qs[i] & 0x0F : qs[i - 16] >> 4;
            s += ((low | ((high >> i) & 1) << 4) - 16) * a[b].q[i];
        }
        sum += read_fp16(w) * a[b].d * float(s);
    }
    return sum;
}

template <float (*Row)(const uint8_t*, const void*, int)>
void each_row(const uint8_t* w, int blocks, const uint8_t* activations, size_t row_bytes, int m_rows, float* out,
              size_t out_stride) {
    for (int m = 0; m < m_rows; ++m) out[m * out_stride] = Row(w, activations + m * row_bytes, blocks);
}

}  // namespace

const Kernels& scalar_kernels() {
    static const Kernels kernels{
        "scalar", {each_row<dot_q4_k_row>, each_row<dot_q6_k_row>, each_row<dot_q8_0_row>, each_row<dot_q5_0_row>}, {}, nullptr};
    return kernels;
}

}  // namespace specdemo
