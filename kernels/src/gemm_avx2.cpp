// Many activation rows with AVX2: a panel of 16 weight rows (two ymm of 8 rows × 4 values) times 2 activation rows at a
// time, each activation's 4 values broadcast; two quads' maddubs added in i16 (|4 products| ≤ 4·63·127 < 2^15), then
// madd by ones to i32. Q8_0 has none here: its unsigned values (q + 128) would saturate maddubs, so its many rows take
// the dot products. Per slot: the i32 sums to f32, times s·d_a, and Q4_K's mins (panel.hpp).
// Compiled with -mavx2 -mfma -mf16c; chosen only where the CPU has them (dispatch.cpp).
#include <immintrin.h>

#include <algorithm>

#include "panel.hpp"

namespace specdemo {

namespace {

constexpr int NR = 2, ROWS = 8 * NR;  // ymm of weight rows a tile holds; the panel's rows
constexpr int MR = 2;                 // activation rows a tile holds: 16 ymm registers

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

template <Kind K, int M>
void tile(const PanelOf<K, ROWS>& panel, int slots, const ManyRows& a, int m0, int first_slot, float* y,
          size_t y_stride, bool first) {
    using F = Format<K>;
    constexpr int QUADS = F::SLOT / 4;
    const int a_slots = a.slots();
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[M][NR];
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < NR; ++n)
            acc[m][n] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + (m0 + m) * y_stride + 8 * n);
    for (int j = 0; j < slots; ++j) {
        const size_t at = size_t(m0) * a_slots + first_slot + j;
        const int8_t* q = a.q.data() + size_t(m0) * a.columns + (first_slot + j) * F::SLOT;
        __m256i sum[M][NR];
        for (int m = 0; m < M; ++m) {
            const __m256i start = _mm256_set1_epi32(a.start[at + m * a_slots]);
            for (int n = 0; n < NR; ++n) sum[m][n] = start;
        }
        const uint8_t* v = panel.values.data() + size_t(j) * QUADS * ROWS * 4;
        for (int quad = 0; quad < QUADS; quad += 2, v += 2 * ROWS * 4) {
            __m256i w0[NR], w1[NR];
            for (int n = 0; n < NR; ++n) {
                w0[n] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 32 * n));
                w1[n] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + ROWS * 4 + 32 * n));
            }
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
        for (int n = 0; n < NR; ++n) s[n] = _mm256_loadu_ps(panel.scale.data() + j * ROWS + 8 * n);
        for (int m = 0; m < M; ++m) {
            const __m256 d = _mm256_set1_ps(a.scale[at + m * a_slots]);
            for (int n = 0; n < NR; ++n)
                acc[m][n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[m][n]), _mm256_mul_ps(s[n], d), acc[m][n]);
        }
        if constexpr (F::FLOAT_OFFSET) {
            for (int m = 0; m < M; ++m) {
                const __m256 d_sum = _mm256_set1_ps(a.scaled_sum[at + m * a_slots]);
                for (int n = 0; n < NR; ++n)
                    acc[m][n] = _mm256_fnmadd_ps(_mm256_loadu_ps(panel.offset.data() + j * ROWS + 8 * n), d_sum,
                                                 acc[m][n]);
            }
        }
    }
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < NR; ++n) _mm256_storeu_ps(y + (m0 + m) * y_stride + 8 * n, acc[m][n]);
}

template <Kind K>
void gemm(const uint8_t* w, size_t row_bytes, const ManyRows& a, float* y, size_t y_stride, size_t first_row,
          size_t last_row) {
    using F = Format<K>;
    constexpr int SLOTS = F::VALUES / F::SLOT, CHUNK_BLOCKS = CHUNK_VALUES / F::VALUES;
    thread_local PanelOf<K, ROWS> panel;
    const int blocks = a.columns / F::VALUES;
    for (size_t n0 = first_row; n0 + ROWS <= last_row; n0 += ROWS) {
        for (int b0 = 0; b0 < blocks; b0 += CHUNK_BLOCKS) {
            const int chunk = std::min(CHUNK_BLOCKS, blocks - b0);
            panel.template fill<Interleave>(w + n0 * row_bytes, row_bytes, b0, chunk);
            in_groups_of_rows<MR>(a.rows, [&]<int R>(int m0) {
                tile<K, R>(panel, chunk * SLOTS, a, m0, b0 * SLOTS, y + n0, y_stride, b0 == 0);
            });
        }
    }
}

}  // namespace

const Gemms& avx2_gemms() {
    static const Gemms gemms{{gemm<Kind::Q4_K>, gemm<Kind::Q6_K>, nullptr, gemm<Kind::Q5_0>}, ROWS};
    return gemms;
}

}  // namespace specdemo
