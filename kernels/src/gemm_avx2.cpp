// Many activation rows with AVX2: a packed panel of 16 weight rows (two ymm of 8 rows × 4 values) times 2 activation
// rows at a time, each activation's 4 values broadcast; two quads' maddubs added in i16 (|4 products| ≤ 4·63·127 <
// 2^15), then madd by ones to i32. Q8_0 has none here: its unsigned values (q + 128) would saturate maddubs, so its many rows take
// the dot products. Per slot: the i32 sums to f32, times s·d_a, and Q4_K's mins (panel.hpp).
// Compiled with -mavx2 -mfma -mf16c; chosen only where the CPU has them (dispatch.cpp).
#include <immintrin.h>

#include <algorithm>

#include "panel.hpp"

namespace specdemo {

namespace {

constexpr int NR = 2, ROWS = 8 * NR;  // ymm of weight rows a tile holds; the panel's rows
constexpr int MR = 2;                 // activation rows a tile holds: 16 ymm registers
// From a single step on, as on AVX-512, though a step streams at 0.87–0.90× the dot products' rate (28 Q4_K layers with
// the AVX2 path held on the 2-core Xeon; 5 rows 0.70–0.85× their time): one way for every call, so a row's logits do
// not depend on how many rows its call holds (each row quantized and summed alike), and a verification of K drafts
// scores them exactly as K single steps would.
constexpr int FROM_ROWS = 1;
// Q6_K decoded a chunk at a time from 5 rows a call on (panel.hpp: Decoded6). On the 2-core Xeon, the AVX2 path held,
// 14 ffn_down, 2 threads, decoded ÷ decoded in each tile: 3 rows 1.10×, 4 1.09×, 5 0.98×, 9 0.86×, 64 0.75×.
constexpr int DECODED_FROM_ROWS = 5;

inline __m256i broadcast4(const int8_t* p) {
    int32_t word;
    std::memcpy(&word, p, 4);
    return _mm256_set1_epi32(word);
}

// Rows' 32 bytes (8 rows at a time, `stride` apart) as 8 quads of those rows, `quad_bytes` apart: an 8 × 8 transpose of
// i32 (unpacks in 128-bit lanes, then the lanes gathered).
struct Interleave {
    static void run(const uint8_t* v, size_t stride, uint8_t* dst, size_t quad_bytes) {
        for (int group = 0; group < NR; ++group, v += 8 * stride, dst += 32) {
            __m256i r[8], t[8], u[8];
            for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i * stride));
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
            }
            for (int h = 0; h < 8; h += 4) {
                u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
                u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
                u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
                u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
            }
            for (int c = 0; c < 4; ++c) {
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c * quad_bytes),
                                    _mm256_permute2x128_si256(u[c], u[c + 4], 0x20));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (c + 4) * quad_bytes),
                                    _mm256_permute2x128_si256(u[c], u[c + 4], 0x31));
            }
        }
    }
};

// The 8·n-th to 8·n + 7-th rows' values of quad q of slot j in a packed block.
template <Kind K, typename P>
inline __m256i values(const uint8_t* block, int j, int q, int n) {
    if constexpr (K == Kind::Q4_K) {  // slots 2c and 2c + 1 share the nibbles of quad q of group c
        const __m256i nibbles = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(block + P::V + ((j / 2) * 8 + q) * P::QUAD + 32 * n));
        return _mm256_and_si256(j % 2 ? _mm256_srli_epi16(nibbles, 4) : nibbles, _mm256_set1_epi8(0x0F));
    } else if constexpr (NIBBLES_AND_HIGHS<P>) {  // the quad's nibbles, and its 2 high bits moved to bits 4 and 5
        const uint8_t* slot = block + P::V + j * P::SLOT_BYTES + 32 * n;
        const __m256i nibbles = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(slot + (q / 2) * P::QUAD));
        const __m256i highs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(slot + 2 * P::QUAD));
        const __m256i low = _mm256_and_si256(q % 2 ? _mm256_srli_epi16(nibbles, 4) : nibbles, _mm256_set1_epi8(0x0F));
        const __m256i high = q == 0 ? _mm256_slli_epi16(highs, 4) : q == 1 ? _mm256_slli_epi16(highs, 2)
                           : q == 2 ? highs : _mm256_srli_epi16(highs, 2);
        return _mm256_or_si256(low, _mm256_and_si256(high, _mm256_set1_epi8(0x30)));
    } else {
        const uint8_t* quad = block + P::V + (j * (P::SLOT / 4) + q) * P::QUAD;
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad + 32 * n));
    }
}

// 8 bytes of a packed block's per-slot bytes (sc, m) as f32: unsigned for Q4_K, signed for Q6_K's scales.
template <bool Signed>
inline __m256 bytes_as_floats(const uint8_t* p) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(Signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes));
}

// 8 f16 of a packed block's (d, dmin) as f32.
inline __m256 halves(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <Kind K, typename P, int M>
void tile(const uint8_t* panel, int blocks, const ManyRows& a, int m0, int first_block, float* y, size_t y_stride,
          bool first) {
    constexpr int SLOTS = P::VALUES / P::SLOT, QUADS = P::SLOT / 4;
    const int a_slots = a.slots();
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[M][NR];
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < NR; ++n)
            acc[m][n] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + (m0 + m) * y_stride + 8 * n);
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = panel + b * P::BYTES;
        __m256 d[NR];
        for (int n = 0; n < NR; ++n) d[n] = halves(block + P::D + 16 * n);
        for (int j = 0; j < SLOTS; ++j) {
            if (STREAMED<P> && m0 == 0) prefetch_slot_of_next(block, j, SLOTS, P::BYTES);
            const int slot = (first_block + b) * SLOTS + j;
            const size_t at = size_t(m0) * a_slots + slot;
            const int8_t* q = a.q.data() + size_t(m0) * a.columns + slot * P::SLOT;
            __m256i sum[M][NR];
            for (int m = 0; m < M; ++m) {
                const __m256i start = _mm256_set1_epi32(a.start[at + m * a_slots]);
                for (int n = 0; n < NR; ++n) sum[m][n] = start;
            }
            for (int quad = 0; quad < QUADS; quad += 2) {
                __m256i w0[NR], w1[NR];
                for (int n = 0; n < NR; ++n)
                    w0[n] = values<K, P>(block, j, quad, n), w1[n] = values<K, P>(block, j, quad + 1, n);
                for (int m = 0; m < M; ++m) {
                    const __m256i x0 = broadcast4(q + m * a.columns + 4 * quad);
                    const __m256i x1 = broadcast4(q + m * a.columns + 4 * quad + 4);
                    for (int n = 0; n < NR; ++n) {
                        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(w0[n], x0),
                                                               _mm256_maddubs_epi16(w1[n], x1));
                        sum[m][n] = _mm256_add_epi32(sum[m][n], _mm256_madd_epi16(pairs, ones));
                    }
                }
            }
            __m256 s[NR];
            for (int n = 0; n < NR; ++n) {
                if constexpr (K == Kind::Q4_K || K == Kind::Q6_K)
                    s[n] = _mm256_mul_ps(d[n],
                                         bytes_as_floats<K == Kind::Q6_K>(block + P::SC + j * ROWS + 8 * n));
                else
                    s[n] = d[n];
            }
            for (int m = 0; m < M; ++m) {
                const __m256 da = _mm256_set1_ps(a.scale[at + m * a_slots]);
                for (int n = 0; n < NR; ++n)
                    acc[m][n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[m][n]), _mm256_mul_ps(s[n], da), acc[m][n]);
            }
            if constexpr (K == Kind::Q4_K) {  // − dmin·m · d_a·Σa
                for (int m = 0; m < M; ++m) {
                    const __m256 d_sum = _mm256_set1_ps(a.scaled_sum[at + m * a_slots]);
                    for (int n = 0; n < NR; ++n) {
                        const __m256 o = _mm256_mul_ps(halves(block + P::DMIN + 16 * n),
                                                       bytes_as_floats<false>(block + P::M + j * ROWS + 8 * n));
                        acc[m][n] = _mm256_fnmadd_ps(o, d_sum, acc[m][n]);
                    }
                }
            }
        }
    }
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < NR; ++n) _mm256_storeu_ps(y + (m0 + m) * y_stride + 8 * n, acc[m][n]);
}

// A chunk's Q6_K blocks decoded for the tiles of a call of many rows, the next blocks asked for meanwhile.
void decode6(const uint8_t* packed, int blocks, uint8_t* out) {
    using P = Packed<Kind::Q6_K, ROWS>;
    using D6 = Decoded6<ROWS>;
    for (int b = 0; b < blocks; ++b, packed += P::BYTES, out += D6::BYTES) {
        std::memcpy(out, packed, D6::V);  // d and sc
        for (int j = 0; j < 16; ++j) {
            prefetch_slot_of_next(packed, j, 16, P::BYTES);
            for (int q = 0; q < 4; ++q)
                for (int n = 0; n < NR; ++n)
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + D6::V + (4 * j + q) * D6::QUAD + 32 * n), values<Kind::Q6_K, P>(packed, j, q, n));
        }
    }
}

template <Kind K>
constexpr GemmFn GEMM = gemm_panels<K, ROWS, MR, DECODED_FROM_ROWS>;
template <Kind K>
constexpr PackFn PACK = pack_panel<K, ROWS, Interleave>;

}  // namespace

const Gemms* avx2_gemms() {  // no Q8_0: its unsigned values (q + 128) would saturate maddubs
    static const Gemms gemms{{PACK<Kind::Q4_K>, PACK<Kind::Q6_K>, nullptr, PACK<Kind::Q5_0>},
                             {GEMM<Kind::Q4_K>, GEMM<Kind::Q6_K>, nullptr, GEMM<Kind::Q5_0>},
                             {Packed<Kind::Q4_K, ROWS>::BYTES, Packed<Kind::Q6_K, ROWS>::BYTES, 0,
                              Packed<Kind::Q5_0, ROWS>::BYTES},
                             ROWS, FROM_ROWS};
    return &gemms;
}

}  // namespace specdemo
