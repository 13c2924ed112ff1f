// CachedAttention: a layer's attention over a key-value cache the op keeps itself, for batch 1.
//   input 0  q          f32 (1, L, heads, head_dim)      the new positions' queries
//   input 1  k          f32 (1, L, kv_heads, head_dim)   their keys
//   input 2  v          f32 (1, L, kv_heads, head_dim)   their values
//   input 3  positions  i64 or i32 (1, L)                their positions, past .. past + L − 1 (the first is read)
//   output   y          f32 (1, L, heads · head_dim)     each query's attended values, the heads side by side
//   attribute scale: the scores' factor (1/√head_dim)
//   attribute frequencies: the rotary embedding's θ^(−2i/d), head_dim / 2 f32 written out in full ("1,0.65793324,…":
//     the IR writes a list of floats to 6 digits), which the op then applies to q and k (rotate-half: (x₁, x₂) →
//     (x₁·cos − x₂·sin, x₂·cos + x₁·sin), the angles position · frequency in f32, as the graph computes them); empty: q
//     and k come rotated.
// Why the rotary embedding here, and q, k and v as the projection lays them out (position-major, not head-major): in the
// graph they are two RoPE nodes a layer, ~8 more a call computing the angles and, in a call of more than one position,
// three Transposes a layer, run on one thread between the kernels while the other waits. Three instances of each
// graph alternating in one process, 2-core Zen 3, quiet: the 0.5B draft's step 0.974× and 0.982×, the target's 1.00×.
// A call writes its L keys and values at positions past .. past + L − 1 of the cache, over what was there: a caller rolls
// back by calling at an earlier position, and empties the cache with past = 0. Query row l (position past + l) attends
// to the positions ≤ past + l, each query head to its key-value head (heads / kv_heads queries share one).
// Why positions and not the attention mask: a one-token call's inputs then all have fixed shapes, so the plugin runs the
// op as a static node, with no shape inference a call (for an op it does not know, a copy of the op made and checked:
// the 0.5B draft's step took 0.93× the time on the Zen 3 without it).
// Why not the plugin's SDPA: its multi-query path packs a key-value head again for each of its query heads, and a call
// of 5 rows cost 3-4 of 1 (the 1.5B target on the Zen 3, 300 positions); here a key-value head's cache is read once for
// the rows of all its queries, and a row's arithmetic is the same whatever the call's L (greedy verification equals
// decoding token for token).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "openvino/op/op.hpp"

namespace specdemo {

struct KVStore;  // the op's cache (attention.cpp)

// Query rows against one key-value head: for each row r, out_r (d) = Σ_s p_rs·v_s / Σ_s p_rs over s < n[r], with
// p_rs = e^(scale·q_r·k_s − max_r), the max over s < n[r]; k_s at k + s·stride (v likewise). A row's result is the
// same bit for bit whatever the other rows: its scores, exponentials and sums are computed in the same order for any
// rows beside it. scores: room for rows × (max n rounded up to 4) + rows floats.
struct Rows {
    const float* const* q;  // rows pointers, d floats each
    float* const* out;      // rows pointers, d floats each
    const size_t* n;        // each row's positions (its own and those before it)
    size_t rows;
};
using AttendFn = void (*)(const Rows& rows, const float* k, const float* v, size_t stride, size_t d, float scale,
                          float* scores);
void attend_scalar(const Rows& rows, const float* k, const float* v, size_t stride, size_t d, float scale,
                   float* scores);
AttendFn avx2_attention();  // for d a multiple of 8 (attend_avx2.cpp: its function, called only where the CPU has AVX2)

class CachedAttention : public ov::op::Op {
public:
    OPENVINO_OP("CachedAttention", "specdemo");

    CachedAttention() = default;
    CachedAttention(const ov::OutputVector& inputs, float scale, std::string frequencies = "");

    void validate_and_infer_types() override;
    std::shared_ptr<ov::Node> clone_with_new_inputs(const ov::OutputVector& inputs) const override;
    bool visit_attributes(ov::AttributeVisitor& visitor) override;
    bool evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const override;
    bool has_evaluate() const override { return true; }

private:
    float m_scale = 1.0f;
    std::string m_rotary;              // the attribute `frequencies`
    std::vector<float> m_frequencies;  // read from it (empty: no rotary embedding)
    std::shared_ptr<KVStore> m_store = make_store();  // shared by the op's copies (clone_with_new_inputs)
    static std::shared_ptr<KVStore> make_store();
};

}  // namespace specdemo
