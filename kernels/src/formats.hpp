// The GGUF block formats this op reads, and the 8-bit activations it multiplies them with.
//
// Notation (ggml's): d a block's scale, dmin its min scale, sc / m a sub-block's scale and min, q the quantized values.
//
//   Q4_K  256 weights, 144 bytes: d, dmin (f16), 12 bytes of 8 × (sc, m) 6-bit, 128 bytes of 4-bit q
//         w = d·sc·q − dmin·m; bytes 32c..32c+31 hold weights 64c+i (low nibble) and 64c+32+i (high nibble)
//   Q6_K  256 weights, 210 bytes: 128 bytes of low 4 bits, 64 of high 2 bits, 16 × sc (i8), d (f16)
//         w = d·sc·(q − 32), a scale per 16 weights
//   Q8_0   32 weights,  34 bytes: d (f16), 32 × q (i8)                     w = d·q
//   Q5_0   32 weights,  22 bytes: d (f16), 32 fifth bits, 16 bytes of nibbles  w = d·(q − 16)
//   Q4_0   32 weights,  18 bytes: d (f16), 16 bytes of nibbles (weight i low, 16 + i high)  w = d·(q − 8)
//
// Activations are quantized once per call, a row at a time, the way llama.cpp pairs them with each format:
//   Q8_K (for Q4_K, Q6_K): 256 values, one f32 scale, i8 q, and the sums of q per 16 (for the mins and offsets)
//   Q8_0 (for Q8_0, Q5_0, Q4_0):  32 values, one f16 scale (rounded as stored), i8 q
// so that a block's dot product is integer arithmetic times the two scales.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace specdemo {

enum class Kind { Q4_K, Q6_K, Q8_0, Q5_0, Q4_0 };
constexpr int KINDS = 5;
// By Kind, as the op's attribute says them.
constexpr const char* KIND_NAMES[KINDS] = {"Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_0"};

struct BlockQ8K {
    float d;              // the activations' scale: x ≈ d·q
    int8_t q[256];        // in order, unless the ISA's kernels arrange them (Kernels::arrange)
    int16_t bsums[16];    // Σ q over each 16 values, in order
    int16_t sums32[8];    // Σ q over each 32 values (Q4_K's sub-blocks), in order
};

struct BlockQ8_0 {
    float d;              // f16-rounded, as ggml stores it
    int8_t q[32];
};

constexpr size_t Q4_K_BYTES = 144, Q6_K_BYTES = 210, Q8_0_BYTES = 34, Q5_0_BYTES = 22, Q4_0_BYTES = 18;

float fp16_round(float x);  // x rounded to the nearest half (ties to even), as a float

// The helpers below are compiled into every file, each with its own ISA flags (dot_avx2.cpp, dot_avx512.cpp): internal
// linkage keeps the linker from keeping one file's copy (an AVX-512 one, say) for all, which an AVX2-only CPU could not
// run, and keeps each file's instantiations of shared_rows its own.
namespace {

constexpr size_t block_bytes(Kind kind) {
    switch (kind) {
    case Kind::Q4_K: return Q4_K_BYTES;
    case Kind::Q6_K: return Q6_K_BYTES;
    case Kind::Q8_0: return Q8_0_BYTES;
    case Kind::Q4_0: return Q4_0_BYTES;
    default: return Q5_0_BYTES;
    }
}

constexpr int block_values(Kind kind) { return kind == Kind::Q4_K || kind == Kind::Q6_K ? 256 : 32; }

// The gemm's slot (the weights that share a scale: panel.hpp) and the weights' integer offset c there (w = s·(v − c)).
constexpr int slot_values(Kind kind) { return kind == Kind::Q6_K ? 16 : 32; }
constexpr int weight_offset(Kind kind) {
    return kind == Kind::Q6_K ? 32 : kind == Kind::Q8_0 ? 128 : kind == Kind::Q5_0 ? 16 : kind == Kind::Q4_0 ? 8 : 0;
}

// Half to single precision, exactly (the scales are the only halves, read once per block).
inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16;
    uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
    if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            exponent = 127 - 15 + 1;
            while (!(mantissa & 0x400)) { mantissa <<= 1; --exponent; }
            bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
        }
    } else if (exponent == 31) {
        bits = sign | 0x7F800000 | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t read_bits(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }  // a stored half's bits

// Q4_K's 12 scale bytes as 8 scales and 8 mins (6 bits each), four at a time in 32-bit words:
//   sc 0–3 = s 0–3 & 63          sc 4–7 = (s 8–11 & 15) | (s 0–3 >> 6) << 4
//   m  0–3 = s 4–7 & 63          m  4–7 = (s 8–11 >> 4) | (s 4–7 >> 6) << 4
// As two 64-bit words, byte j the j-th scale (min): SIMD paths move them to vector registers without a store.
inline void unpack_q4_k_scales(const uint8_t* s, uint64_t& sc, uint64_t& m) {
    uint32_t word[3];
    std::memcpy(word, s, 12);
    sc = (word[0] & 0x3F3F3F3Fu) | uint64_t((word[2] & 0x0F0F0F0Fu) | (((word[0] >> 6) & 0x03030303u) << 4)) << 32;
    m = (word[1] & 0x3F3F3F3Fu) | uint64_t(((word[2] >> 4) & 0x0F0F0F0Fu) | (((word[1] >> 6) & 0x03030303u) << 4)) << 32;
}

// Each format's one scalar decoder, as ggml keeps one reference per format: a block's bytes as the values and scales of
//
//     w_i = d·sc_g·q_i − dmin·m_g      weight i of group g = i / G (G = slot_values: 32, Q6_K's 16)
//
// with sc = 1 and m = 0 where a format has no groups of its own (Q8_0, Q5_0, Q4_0; dmin 0 but for Q4_K), q as the
// formula takes it: Q4_K 0…15, Q6_K −32…31, Q8_0 −128…127, Q5_0 −16…15, Q4_0 −8…7 (q + weight_offset ≥ 0). The
// scalar dot products (dot_scalar.cpp), the unpacking (unpack.cpp) and the gemm's packing at load (panel.hpp) read
// blocks through these; every SIMD path is tested against them on every block type, tail and row count
// (tests/models/test_kernels.py), and Python's decoder (specdemo/models/blocks.py) against gguf-py's.
template <Kind K>
struct Decoded {
    static constexpr int VALUES = block_values(K), G = slot_values(K), GROUPS = VALUES / G;
    uint16_t d = 0, dmin = 0;                 // f16 bits, as stored
    int8_t sc[GROUPS] = {}, m[GROUPS] = {};   // Q4_K's 6-bit (0…63), Q6_K's signed 8-bit; 1 and 0 for the others
    int8_t q[VALUES];
};

template <Kind K>
Decoded<K> decode(const uint8_t* block);

template <>
inline Decoded<Kind::Q4_K> decode<Kind::Q4_K>(const uint8_t* block) {  // d, dmin, 12 bytes of scales, 128 of nibbles
    Decoded<Kind::Q4_K> out;
    out.d = read_bits(block), out.dmin = read_bits(block + 2);
    uint64_t sc, m;
    unpack_q4_k_scales(block + 4, sc, m);
    std::memcpy(out.sc, &sc, 8), std::memcpy(out.m, &m, 8);
    const uint8_t* nibbles = block + 16;
    for (int c = 0; c < 4; ++c) {  // 32 bytes: weights 64c + i in the low nibbles, 64c + 32 + i in the high
        for (int i = 0; i < 32; ++i) {
            out.q[64 * c + i] = int8_t(nibbles[32 * c + i] & 0x0F);
            out.q[64 * c + 32 + i] = int8_t(nibbles[32 * c + i] >> 4);
        }
    }
    return out;
}

template <>
inline Decoded<Kind::Q6_K> decode<Kind::Q6_K>(const uint8_t* block) {  // 128 bytes of nibbles, 64 of 2-bit highs, sc, d
    Decoded<Kind::Q6_K> out;
    for (int h = 0; h < 2; ++h) {  // each half: 128 weights from 64 bytes of nibbles and 32 of highs (4 a byte)
        const uint8_t *low = block + 64 * h, *high = block + 128 + 32 * h;
        int8_t* q = out.q + 128 * h;
        for (int i = 0; i < 32; ++i) {
            q[i] = int8_t(((low[i] & 0x0F) | (high[i] & 3) << 4) - 32);
            q[32 + i] = int8_t(((low[32 + i] & 0x0F) | (high[i] >> 2 & 3) << 4) - 32);
            q[64 + i] = int8_t(((low[i] >> 4) | (high[i] >> 4 & 3) << 4) - 32);
            q[96 + i] = int8_t(((low[32 + i] >> 4) | (high[i] >> 6) << 4) - 32);
        }
    }
    std::memcpy(out.sc, block + 192, 16);
    out.d = read_bits(block + 208);
    return out;
}

template <>
inline Decoded<Kind::Q8_0> decode<Kind::Q8_0>(const uint8_t* block) {  // d, 32 × q
    Decoded<Kind::Q8_0> out;
    out.d = read_bits(block), out.sc[0] = 1;
    std::memcpy(out.q, block + 2, 32);
    return out;
}

template <>
inline Decoded<Kind::Q5_0> decode<Kind::Q5_0>(const uint8_t* block) {  // d, 32 fifth bits, 16 bytes of nibbles
    Decoded<Kind::Q5_0> out;
    out.d = read_bits(block), out.sc[0] = 1;
    uint32_t fifth;  // bit i: weight i's
    std::memcpy(&fifth, block + 2, 4);
    const uint8_t* nibbles = block + 6;
    for (int i = 0; i < 16; ++i) {  // weight i in the low nibbles, 16 + i in the high
        out.q[i] = int8_t(((nibbles[i] & 0x0F) | (fifth >> i & 1) << 4) - 16);
        out.q[16 + i] = int8_t(((nibbles[i] >> 4) | (fifth >> (16 + i) & 1) << 4) - 16);
    }
    return out;
}

template <>
inline Decoded<Kind::Q4_0> decode<Kind::Q4_0>(const uint8_t* block) {  // d, 16 bytes of nibbles
    Decoded<Kind::Q4_0> out;
    out.d = read_bits(block), out.sc[0] = 1;
    for (int i = 0; i < 16; ++i) {  // weight i in the low nibbles, 16 + i in the high
        out.q[i] = int8_t((block[2 + i] & 0x0F) - 8);
        out.q[16 + i] = int8_t((block[2 + i] >> 4) - 8);
    }
    return out;
}

// A call reads its weights once, straight from memory: while a block is decoded, ask for the bytes PREFETCH_AHEAD
// further on (a line at a time), so a core has more lines in flight than its own loads would ask for (measured on the
// 2-core Xeon: a Q4_K layer from 12 to 17-20 GB/s; 1, 4, 8 and 16 KiB ahead tried, 4 KiB and more alike).
constexpr size_t PREFETCH_AHEAD = 4096;

inline void prefetch_ahead(const uint8_t* block, size_t bytes) {
    for (size_t line = 0; line < bytes; line += 64) __builtin_prefetch(block + PREFETCH_AHEAD + line, 0, 3);
}

// Runs a kernel templated on the number of activation rows it shares a weight block with (1 … Max), over all M rows:
// `call.template operator()<R>(first row)`, in groups of Max, then one group of what is left.
template <int R, typename Call>
inline void rest_of_rows(int left, int first, Call& call) {
    if constexpr (R > 0) {
        if (left == R) return call.template operator()<R>(first);
        rest_of_rows<R - 1>(left, first, call);
    }
}

template <int Max, typename Call>
inline void in_groups_of_rows(int m_rows, Call&& call) {
    int m = 0;
    for (; m + Max <= m_rows; m += Max) call.template operator()<Max>(m);
    rest_of_rows<Max - 1>(m_rows - m, m, call);
}

// The DotFn of a kernel over R rows, `Rows<R>::run(weights, blocks, R activation rows, R outputs)`: M rows in groups
// of Shared, then the rest.
template <typename Block, template <int> class Rows, int Shared>
void shared_rows(const uint8_t* w, int blocks, const uint8_t* activations, size_t row_bytes, int m_rows, float* out,
                 size_t out_stride) {
    in_groups_of_rows<Shared>(m_rows, [&]<int R>(int first) {
        const Block* a[R];
        float* o[R];
        for (int r = 0; r < R; ++r) {
            a[r] = reinterpret_cast<const Block*>(activations + (first + r) * row_bytes);
            o[r] = out + (first + r) * out_stride;
        }
        Rows<R>::run(w, blocks, a, o);
    });
}

}  // namespace

// Activations of one row (`columns` f32) in the form `kind`'s dot product takes; `out` holds columns/256 BlockQ8K
// (Q4_K, Q6_K) or columns/32 BlockQ8_0 (Q8_0, Q5_0, Q4_0).
void quantize_row(Kind kind, const float* x, int columns, void* out);
size_t quantized_row_bytes(Kind kind, int columns);

// One weight row's dot products with M quantized activation rows: out[m·out_stride] = Σ over `blocks` blocks, m < M.
// Activation row m starts at activations + m·row_bytes. Each block is decoded once for several rows (4: as many as
// the registers hold the sums of without spilling).
using DotFn = void (*)(const uint8_t* weights, int blocks, const uint8_t* activations, size_t row_bytes, int m_rows,
                       float* out, size_t out_stride);

// M activation rows as the gemm (panel.hpp) reads them: by slot (the run of weights that share a scale: 32, or 16 for
// Q6_K), each slot quantized to 8 bits with a scale of its own, d_a = max|x| / 127, q = x · 127 / max|x| rounded to
// nearest, ties to even; with −c·Σq (c: the weights' integer offset).
//
// Or, for a gemm that takes them (Gemms::q8_k: the K-quants' on AVX-512, Q4_K's on AVX2), as Q8_K blocks: a scale per
// 256, as the dot products take them, so that a block's sub-block scales apply inside the integer sums and its f32
// arithmetic runs once per 256 weights.
struct ManyRows {
    int rows = 0, columns = 0, slot = 0, offset = 0;
    std::vector<int8_t> q;            // (rows, columns)
    std::vector<float> scale;         // (rows, slots) d_a
    std::vector<int32_t> start;       // (rows, slots) −c·Σq: where the slot's integer sum starts
    // (rows, slots), Q6_K's, Q5_0's and Q4_0's only: −c·Σq over the values maddubs pairs into each quad's even i16 lane
    // (a quad's values 0 and 1) in the low half, over its odd lane (values 2 and 3) in the high half; |c·slot/2·127| <
    // 2^15 (Q6_K 32·8·127, Q5_0 16·16·127, Q4_0 8·16·127). AVX2's gemm starts a slot's i16 sums there, so that they
    // hold Σ(v − c)·q (gemm_avx2.cpp, tile_q6 and tile_q5).
    std::vector<int32_t> lane_start;
    std::vector<BlockQ8K> k;          // (rows, columns / 256) instead of the above, where the gemm takes Q8_K
    int slots() const { return columns / slot; }
    const BlockQ8K* k_row(int m) const { return k.data() + size_t(m) * (columns / 256); }
    void resize(Kind kind, int m_rows, int m_columns, bool q8_k);
};

// Row m of x (`a.columns` f32) quantized into `a` (resized for the call): by slot, or as Q8_K where `a.k` is sized, as
// quantize.cpp's quantize_row does (quantize_avx2.cpp: the gemms run on AVX2 or wider only).
using QuantizeFn = void (*)(const float* x, int m, ManyRows& a);
QuantizeFn avx2_quantizer();

// A tensor's blocks repacked for the gemm (panel.hpp): its whole panels, made once, kept for the model's life.
struct FreeBytes {
    void operator()(uint8_t* bytes) const { std::free(bytes); }
};

struct PackedWeights {
    std::unique_ptr<uint8_t[], FreeBytes> bytes;  // panel p's block b at (p·blocks + b)·the format's packed block bytes
    size_t panels = 0;                 // rows / the ISA's panel rows (the rows past them take the dot products)
    int blocks = 0;                    // blocks a row
};

// Packs the panel of rows `rows` on (a panel's rows, row_bytes apart) into panel `panel` of `out` (allocated).
using PackFn = void (*)(const uint8_t* rows, size_t row_bytes, size_t panel, int blocks, PackedWeights& out);
// Panels first_panel … last_panel − 1 of `w` with every activation row: y[m·y_stride + n] for those panels' rows n,
// from first_panel's first row.
using GemmFn = void (*)(const PackedWeights& w, const ManyRows& a, float* y, size_t y_stride, size_t first_panel,
                        size_t last_panel);

// The gemm of an ISA (gemm_avx2.cpp, gemm_avx512.cpp), by Kind (nullptr: that kind's many rows take the dot products).
struct Gemms {
    PackFn pack[KINDS];
    GemmFn gemm[KINDS];
    size_t packed_block_bytes[KINDS];  // a block of a panel, packed
    bool q8_k[KINDS];                  // the activations as Q8_K blocks (ManyRows::k), not by slot
    int panel_rows;
    int from_rows;                 // the fewest activation rows a call runs the gemm for (fewer: the dot products)
    QuantizeFn quantize;           // the activations, by slot or as Q8_K
};
const Gemms* avx2_gemms();
const Gemms* avx512_gemms();

// Reorders one quantized row's values in place (`columns` of them) into the order an ISA's dot product loads them.
using ArrangeFn = void (*)(void* row, int columns);

// out[j] = silu(gate[j])·up[j] = gate[j]·up[j] / (1 + e^−gate[j]) for j < n: the gated MLP's activation, applied by a
// BlockMatMul whose rows are the gate's, then the up projection's (its epilogue "swiglu").
using GluFn = void (*)(const float* gate, const float* up, float* out, size_t n);
void silu_times_scalar(const float* gate, const float* up, float* out, size_t n);  // std::exp (the SIMD paths: glu.hpp)

struct Kernels {
    const char* isa;       // "scalar", "avx2", "avx512"
    DotFn dot[KINDS];          // by Kind
    ArrangeFn arrange[KINDS];  // by Kind; nullptr: the values in order
    const Gemms* gemms;    // for many activation rows; nullptr: the dot products for any M
    GluFn glu;             // the swiglu epilogue (AVX-512's on 8 lanes too: a few thousand values a row, beside its weights)
};

const Kernels& scalar_kernels();
const Kernels* avx2_kernels();    // nullptr when not compiled in
const Kernels* avx512_kernels();  // nullptr when not compiled in

// The kernels every BlockMatMul runs: the widest ISA this CPU has, or the one SPECDEMO_KERNEL_ISA names (scalar, avx2,
// avx512) where the CPU has it; chosen at the first call, until use_kernels changes them.
const Kernels& chosen_kernels();
// Run `isa`'s kernels from now on ("" or nullptr: the widest again); false, changing nothing, where the CPU lacks it.
bool use_kernels(const char* isa);
// The activation rows from which a call runs the gemm, where the ISA has one for the kind: a bench sets it to time both
// ways on the same calls (0: the ISA's own, Gemms::from_rows).
int gemm_from(const Gemms& gemms);
void set_gemm_from(int rows);
// The kernels of `isa` if this CPU runs them, else nullptr.
const Kernels* kernels_for(const char* isa);

}  // namespace specdemo
