#include "block_matmul.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <mutex>
#include <vector>

#include "formats.hpp"

namespace specdemo {

namespace {

Kind parse_kind(const std::string& kind) {
    if (kind == "Q4_K") return Kind::Q4_K;
    if (kind == "Q6_K") return Kind::Q6_K;
    if (kind == "Q8_0") return Kind::Q8_0;
    if (kind == "Q5_0") return Kind::Q5_0;
    OPENVINO_THROW("BlockMatMul: block type ", kind, " is not one of Q4_K, Q6_K, Q8_0, Q5_0");
}

constexpr size_t TASKS_A_CALL = 32;  // output rows split into this many tasks (measured against a static halving: the
                                     // same or faster in a step of the 1.5B target, 2 threads)
constexpr size_t MIN_ROWS_A_TASK = 16;  // 16 Q4_K rows of 1536 weights are 14 KiB of blocks
constexpr size_t ACTIVATIONS_A_PASS = 64;
constexpr size_t GEMM_FROM = 8;  // activation rows from which a call decodes panels (panel.hpp) instead of dotting rows  // activation rows dotted with a weight row while it is in L1

}  // namespace

// The weights packed for the gemm, for the tensor at `from` and the ISA of `gemms`: packed again if either changes
// (a test holds another ISA; a compiled model's constant stays where it is).
struct PackCache {
    std::mutex lock;
    std::shared_ptr<const PackedWeights> packed;
    const void* from = nullptr;
    const Gemms* gemms = nullptr;
};

std::shared_ptr<PackCache> BlockMatMul::make_cache() { return std::make_shared<PackCache>(); }

namespace {

std::shared_ptr<const PackedWeights> packed_for(PackCache& cache, const Gemms& gemms, Kind kind, const uint8_t* w,
                                                size_t rows, size_t row_bytes, int blocks) {
    std::lock_guard<std::mutex> hold(cache.lock);
    if (cache.packed && cache.from == w && cache.gemms == &gemms) return cache.packed;
    auto packed = std::make_shared<PackedWeights>();
    packed->panels = rows / gemms.panel_rows, packed->blocks = blocks;
    packed->bytes.reset(new uint8_t[packed->panels * blocks * gemms.packed_block_bytes[int(kind)]]);
    const PackFn pack = gemms.pack[int(kind)];
    tbb::parallel_for(tbb::blocked_range<size_t>(0, packed->panels, 4), [&](const tbb::blocked_range<size_t>& range) {
        pack(w, row_bytes, range.begin(), range.end(), blocks, *packed);
    });
    cache.packed = packed, cache.from = w, cache.gemms = &gemms;
    return packed;
}

}  // namespace

BlockMatMul::BlockMatMul(const ov::Output<ov::Node>& x, const ov::Output<ov::Node>& weights, const std::string& kind,
                         int64_t columns)
    : Op({x, weights}), m_kind(kind), m_columns(columns) {
    constructor_validate_and_infer_types();
}

void BlockMatMul::validate_and_infer_types() {
    const Kind kind = parse_kind(m_kind);
    const auto& x = get_input_partial_shape(0);
    const auto& w = get_input_partial_shape(1);
    NODE_VALIDATION_CHECK(this, get_input_element_type(0) == ov::element::f32, "BlockMatMul takes f32 activations");
    NODE_VALIDATION_CHECK(this, get_input_element_type(1) == ov::element::u8, "BlockMatMul takes u8 blocks");
    NODE_VALIDATION_CHECK(this, m_columns > 0 && m_columns % block_values(kind) == 0,
                          "BlockMatMul: ", m_columns, " columns are not whole ", m_kind, " blocks");
    NODE_VALIDATION_CHECK(this, w.rank().is_static() && w.rank().get_length() == 2, "BlockMatMul: blocks must be 2-D");
    if (w[1].is_static()) {
        NODE_VALIDATION_CHECK(this, size_t(w[1].get_length()) == m_columns / block_values(kind) * block_bytes(kind),
                              "BlockMatMul: a row of ", w[1].get_length(), " bytes is not ", m_columns, " ", m_kind,
                              " weights");
    }
    ov::PartialShape y = x;
    if (x.rank().is_static()) {
        NODE_VALIDATION_CHECK(this, x.rank().get_length() >= 1 && x[x.rank().get_length() - 1].compatible(m_columns),
                              "BlockMatMul: activations' last dimension must be ", m_columns);
        y[y.rank().get_length() - 1] = w[0];
    }
    set_output_type(0, ov::element::f32, y);
}

std::shared_ptr<ov::Node> BlockMatMul::clone_with_new_inputs(const ov::OutputVector& inputs) const {
    check_new_args_count(this, inputs);
    return std::make_shared<BlockMatMul>(inputs[0], inputs[1], m_kind, m_columns);
}

bool BlockMatMul::visit_attributes(ov::AttributeVisitor& visitor) {
    visitor.on_attribute("kind", m_kind);
    visitor.on_attribute("columns", m_columns);
    return true;
}

bool BlockMatMul::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const {
    const Kind kind = parse_kind(m_kind);
    const ov::Shape x_shape = inputs[0].get_shape();
    const size_t columns = x_shape.back(), rows = inputs[1].get_shape()[0], row_bytes = inputs[1].get_shape()[1];
    const size_t m_rows = ov::shape_size(x_shape) / columns;
    ov::Shape y_shape = x_shape;
    y_shape.back() = rows;
    outputs[0].set_shape(y_shape);

    const float* x = inputs[0].data<const float>();
    const uint8_t* w = static_cast<const uint8_t*>(inputs[1].data());
    float* y = outputs[0].data<float>();

    // (M, columns) f32 → M quantized rows, once a call
    const size_t q_bytes = quantized_row_bytes(kind, int(columns));
    thread_local std::vector<uint8_t> quantized;
    quantized.resize(m_rows * q_bytes);
    uint8_t* q = quantized.data();
    const Kernels& kernels = chosen_kernels();
    const Gemms* gemms = kernels.gemms;
    const GemmFn gemm = gemms && m_rows >= size_t(gemm_from(*gemms)) && rows >= size_t(gemms->panel_rows)
                            ? gemms->gemm[int(kind)] : nullptr;
    const ArrangeFn arrange = kernels.arrange[int(kind)];
    tbb::parallel_for(size_t(0), m_rows, [&](size_t m) {
        quantize_row(kind, x + m * columns, int(columns), q + m * q_bytes);
        if (arrange && !gemm) arrange(q + m * q_bytes, int(columns));
    });

    const DotFn dot = kernels.dot[int(kind)];
    const int blocks = int(columns / block_values(kind));
    auto dots = [&](size_t first_row, size_t last_row) {
        for (size_t first = 0; first < m_rows; first += ACTIVATIONS_A_PASS) {
            const size_t last = std::min(m_rows, first + ACTIVATIONS_A_PASS);
            for (size_t n = first_row; n < last_row; ++n)
                dot(w + n * row_bytes, blocks, q + first * q_bytes, q_bytes, int(last - first), y + first * rows + n, rows);
        }
    };
    if (!gemm) {
        // Tasks of rows / TASKS_A_CALL rows, taken by whichever thread is free: a worker that wakes late (a step runs
        // ~130 of these calls between the plugin's own nodes) leaves the first thread no fixed half to finish alone.
        tbb::parallel_for(tbb::blocked_range<size_t>(0, rows, std::max(MIN_ROWS_A_TASK, rows / TASKS_A_CALL)),
                          [&](const tbb::blocked_range<size_t>& range) { dots(range.begin(), range.end()); },
                          tbb::simple_partitioner());
        return true;
    }
    // Many rows: the packed panels, a few a task; the rows past the last whole panel (a trimmed LM head's) take the
    // dot products.
    const auto packed = packed_for(*m_cache, *gemms, kind, w, rows, row_bytes, blocks);
    thread_local ManyRows this_threads;
    ManyRows& many = this_threads;  // the caller's, by reference: named in a task, a thread_local is the worker's own
    many_rows(kind, q, q_bytes, int(m_rows), int(columns), many);  // the values in order, copied
    const size_t panel = size_t(gemms->panel_rows), panels = packed->panels;
    if (arrange && panels * panel < rows) {
        tbb::parallel_for(size_t(0), m_rows, [&](size_t m) { arrange(q + m * q_bytes, int(columns)); });
    }
    tbb::parallel_for(tbb::blocked_range<size_t>(0, panels, 1), [&](const tbb::blocked_range<size_t>& range) {
        gemm(*packed, many, y, rows, range.begin(), range.end());
    }, tbb::simple_partitioner());
    dots(panels * panel, rows);
    return true;
}

}  // namespace specdemo
