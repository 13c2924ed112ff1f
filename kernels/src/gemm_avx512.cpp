// Many activation rows with AVX-512 VNNI: a panel of 32 weight rows (two zmm of 16 rows × 4 values) times 4 activation
// rows at a time, each activation's 4 values broadcast, one vpdpbusd per 64 products (u8 weights × i8 activations,
// summed in i32 without saturation). Per slot: the i32 sums to f32, times s·d_a, and Q4_K's mins (panel.hpp).
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni; chosen only where the CPU has them (dispatch.cpp).
#include <immintrin.h>

#include <algorithm>

#include "panel.hpp"

namespace specdemo {

namespace {

constexpr int NR = 2, ROWS = 16 * NR;  // zmm of weight rows a tile holds; the panel's rows
constexpr int MR = 4;                  // activation rows a tile holds: 2·4 sums and 2·4 accumulators in registers

inline __m512i broadcast4(const int8_t* p) {
    int32_t word;
    std::memcpy(&word, p, 4);
    return _mm512_set1_epi32(word);
}

// Rows' 32 bytes (16 rows at a time, `stride` apart) as 8 quads of those rows, `quad_bytes` apart: a 16 × 8 transpose of
// i32, the two halves of a zmm (rows i and i + 8) transposed at once as two 8 × 8 (unpacks in 128-bit lanes, then
// one vpermt2q to gather the lanes).
struct Interleave {
    static void run(const uint8_t* v, size_t stride, uint8_t* dst, size_t quad_bytes) {
        for (int group = 0; group < NR; ++group, v += 16 * stride, dst += 64) {
            __m512i r[8], t[8], u[8];
            for (int i = 0; i < 8; ++i) {
                const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i * stride));
                const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + (i + 8) * stride));
                r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
            }
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);      // 128-bit lane: a0 b0 a1 b1
                t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);  //                a2 b2 a3 b3
            }
            for (int h = 0; h < 8; h += 4) {  // rows 0–3 (h = 0), 4–7: columns c (lane 0) and c + 4 (lane 1) of each
                u[h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);
                u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);
                u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
                u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
            }
            const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
            const __m512i second = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
            for (int c = 0; c < 4; ++c) {
                _mm512_storeu_si512(dst + c * quad_bytes, _mm512_permutex2var_epi64(u[c], first, u[c + 4]));
                _mm512_storeu_si512(dst + (c + 4) * quad_bytes, _mm512_permutex2var_epi64(u[c], second, u[c + 4]));
            }
        }
    }
};

// y[m0 + m, 0…ROWS) (+)= the panel's `slots` slots (the activations' first_slot on) dotted with activation row m0 + m.
template <Kind K, int M>
void tile(const PanelOf<K, ROWS>& panel, int slots, const ManyRows& a, int m0, int first_slot, float* y,
          size_t y_stride, bool first) {
    using F = Format<K>;
    constexpr int QUADS = F::SLOT / 4;
    const int a_slots = a.slots();
    __m512 acc[M][NR];
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < NR; ++n)
            acc[m][n] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + (m0 + m) * y_stride + 16 * n);
    for (int j = 0; j < slots; ++j) {
        const size_t at = size_t(m0) * a_slots + first_slot + j;  // activation row m0's slot j
        const int8_t* q = a.q.data() + size_t(m0) * a.columns + (first_slot + j) * F::SLOT;
        __m512i sum[M][NR];
        for (int m = 0; m < M; ++m) {
            const __m512i start = _mm512_set1_epi32(a.start[at + m * a_slots]);
            for (int n = 0; n < NR; ++n) sum[m][n] = start;
        }
        const uint8_t* v = panel.values.data() + size_t(j) * QUADS * ROWS * 4;
        for (int quad = 0; quad < QUADS; ++quad, v += ROWS * 4) {
            __m512i w[NR];
            for (int n = 0; n < NR; ++n) w[n] = _mm512_loadu_si512(v + 64 * n);
            for (int m = 0; m < M; ++m) {
                const __m512i x = broadcast4(q + m * a.columns + 4 * quad);
                for (int n = 0; n < NR; ++n) sum[m][n] = _mm512_dpbusd_epi32(sum[m][n], w[n], x);
            }
        }
        __m512 s[NR];
        for (int n = 0; n < NR; ++n) s[n] = _mm512_loadu_ps(panel.scale.data() + j * ROWS + 16 * n);
        for (int m = 0; m < M; ++m) {
            const __m512 d = _mm512_set1_ps(a.scale[at + m * a_slots]);
            for (int n = 0; n < NR; ++n)
                acc[m][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[m][n]), _mm512_mul_ps(s[n], d), acc[m][n]);
        }
        if constexpr (F::FLOAT_OFFSET) {
            __m512 o[NR];
            for (int n = 0; n < NR; ++n) o[n] = _mm512_loadu_ps(panel.offset.data() + j * ROWS + 16 * n);
            for (int m = 0; m < M; ++m) {
                const __m512 d_sum = _mm512_set1_ps(a.scaled_sum[at + m * a_slots]);
                for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_fnmadd_ps(o[n], d_sum, acc[m][n]);
            }
        }
    }
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < NR; ++n) _mm512_storeu_ps(y + (m0 + m) * y_stride + 16 * n, acc[m][n]);
}

template <Kind K>
void gemm(const uint8_t* w, size_t row_bytes, const ManyRows& a, float* y, size_t y_stride, size_t first_row,
          size_t last_row) {
    using F = Format<K>;
    constexpr int SLOTS = F::VALUES / F::SLOT, CHUNK_BLOCKS = CHUNK_VALUES / F::VALUES;
    thread_local PanelOf<K, ROWS> panel;
    const int blocks = a.columns / F::VALUES;
    for (size_t n0 = first_row; n0 + ROWS <= last_row; n0 += ROWS) {
        for (int b0 = 0; b0 < blocks; b0 += CHUNK_BLOCKS) {  // a chunk of columns decoded, then every activation row
            const int chunk = std::min(CHUNK_BLOCKS, blocks - b0);
            panel.template fill<Interleave>(w + n0 * row_bytes, row_bytes, b0, chunk);
            in_groups_of_rows<MR>(a.rows, [&]<int R>(int m0) {
                tile<K, R>(panel, chunk * SLOTS, a, m0, b0 * SLOTS, y + n0, y_stride, b0 == 0);
            });
        }
    }
}

}  // namespace

const Gemms& avx512_gemms() {
    static const Gemms gemms{{gemm<Kind::Q4_K>, gemm<Kind::Q6_K>, gemm<Kind::Q8_0>, gemm<Kind::Q5_0>}, ROWS};
    return gemms;
}

}  // namespace specdemo
