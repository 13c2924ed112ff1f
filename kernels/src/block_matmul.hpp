// BlockMatMul: y = x · Wᵀ with W a GGUF tensor's own blocks.
//   input 0  x  f32 (…, columns)            activations: M = the product of the leading dimensions
//   input 1  W  u8  (rows, bytes per row)    the file's raw blocks, a row per output channel
//   output   y  f32 (…, rows); with the epilogue "swiglu", (…, rows / 2): silu(gate)·up, the rows the gate's then up's
//   attribute kind: "Q4_K", "Q6_K", "Q8_0" or "Q5_0"; columns: the number of weights a row; epilogue: "" or "swiglu"
//             (set where a model loads, graph.fuse_glu: the gated MLP's split, Swish and Multiply as no nodes at all),
//             "bias" (y + b) or "residual" (r + y); prologue: "" or "rms" (x / sqrt(mean(x²) + eps) · g first),
//             with eps
//   inputs after W, where the attributes ask for them: g f32 (columns) for "rms"; then b f32 (rows) for "bias", or
//             r f32 (y's shape) for "residual". Both set where a model loads (matmul_fusion.py): each takes a node of
//             the plugin's, and its hand-offs, out of every layer.
// Each activation row is quantized to 8 bits once a call (formats.hpp). A call of few rows (a step) dots every output
// row's blocks with them while they are in cache; a call of many (a verification, a prefill) multiplies them with the
// blocks repacked into panels (panel.hpp), packed at the op's first call (OVModel makes one as it loads a model) and
// kept. Output rows are shared among the plugin's threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "openvino/op/op.hpp"

namespace specdemo {

struct PackCache;  // the weights repacked for the gemm, made at the op's first call (block_matmul.cpp)

// Tensors packed for the gemm by this process so far: a test sees the packing happen as a model loads, and no more after.
uint64_t packings_so_far();

class BlockMatMul : public ov::op::Op {
public:
    OPENVINO_OP("BlockMatMul", "specdemo");

    BlockMatMul() = default;
    BlockMatMul(const ov::OutputVector& inputs, const std::string& kind, int64_t columns,
                const std::string& epilogue = "", const std::string& prologue = "", float eps = 0.f);

    void validate_and_infer_types() override;
    std::shared_ptr<ov::Node> clone_with_new_inputs(const ov::OutputVector& inputs) const override;
    bool visit_attributes(ov::AttributeVisitor& visitor) override;
    bool evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const override;
    bool has_evaluate() const override { return true; }

private:
    std::string m_kind;
    int64_t m_columns = 0;
    std::string m_epilogue;  // "", "swiglu", "bias" or "residual"
    std::string m_prologue;  // "" or "rms"
    float m_eps = 0.f;       // the rms prologue's epsilon
    std::shared_ptr<PackCache> m_cache = make_cache();  // shared by the op's copies (clone_with_new_inputs)
    static std::shared_ptr<PackCache> make_cache();
};

}  // namespace specdemo
