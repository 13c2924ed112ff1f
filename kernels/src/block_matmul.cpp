#include "block_matmul.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "formats.hpp"

namespace specdemo {

namespace {

Kind parse_kind(const std::string& kind) {
    for (int k = 0; k < KINDS; ++k)
        if (kind == KIND_NAMES[k]) return Kind(k);
    OPENVINO_THROW("BlockMatMul: block type ", kind, " is not one of Q4_K, Q6_K, Q8_0, Q5_0, Q4_0");
}

constexpr size_t TASKS_A_CALL = 32;  // output rows split into this many tasks (measured against a static halving: the
                                     // same or faster in a step of the 1.5B target, 2 threads)
constexpr size_t MIN_ROWS_A_TASK = 16;  // 16 Q4_K rows of 1536 weights are 14 KiB of blocks
constexpr size_t HUGE_PAGE = size_t(2) << 20;
constexpr size_t GLU_COLUMNS = 2048;  // the swiglu epilogue's task: 24 KiB read, 8 KiB written
constexpr size_t ACTIVATIONS_A_PASS = 64;  // activation rows dotted with a weight row while it is in L1

}  // namespace

// One call's weight tensor: `rows` rows of `row_bytes` bytes of `kind` blocks, `columns` weights (`blocks` blocks)
// each.
struct Weights {
    Kind kind;
    const uint8_t* bytes;
    size_t rows, row_bytes;
    int columns, blocks;
};

// The weights packed for the gemm, each for the tensor at `from` (its rows) and the ISA of `gemms`: packed again if
// either changes (a test holds another ISA; a compiled model's constant stays where it is). A few at once: an op's
// copies may hold other rows (a trimmed LM head's copy over the rows it left out, graph.head_over_rows), and with one
// entry the two called in turn repacked at every call (15 ms a call for the 0.5B draft's 119,933 other rows).
struct PackCache {
    struct Entry {
        std::shared_ptr<const PackedWeights> packed;
        const void* from;
        size_t rows;
        const Gemms* gemms;
    };
    static constexpr size_t KEPT = 4;  // the latest packings kept, the oldest let go first
    std::mutex lock;
    std::vector<Entry> entries;

    std::shared_ptr<const PackedWeights> find(const void* from, size_t rows, const Gemms* gemms) const {
        for (const Entry& e : entries)
            if (e.from == from && e.rows == rows && e.gemms == gemms) return e.packed;
        return nullptr;
    }
};

std::shared_ptr<PackCache> BlockMatMul::make_cache() { return std::make_shared<PackCache>(); }

namespace {

// A padded copy of the rows past the last whole panel (zero bytes are blocks of zero weights), so that they are packed
// and multiplied as one more panel.
std::vector<uint8_t> last_panel_rows(const Weights& w, size_t panel) {
    std::vector<uint8_t> padded(panel * w.row_bytes, 0);
    const size_t whole = w.rows / panel * panel;
    std::memcpy(padded.data(), w.bytes + whole * w.row_bytes, (w.rows - whole) * w.row_bytes);
    return padded;
}

// `bytes` for a tensor's packed panels, on huge pages where the kernel gives them (best effort: madvise fails
// harmlessly where transparent huge pages are off). A step streams every panel once: with 4 KiB pages each page is a
// TLB miss and the hardware's prefetchers stop at its end; on 2 MiB pages the gemm at M = 1 took 0.71–0.77× the time on
// the 2-core Xeon (avx512, 217 MB of Q4_K; 0.81× on its AVX2 path), M = 5 0.75–0.87×.
uint8_t* allocate_streamed(size_t bytes) {
    void* p = nullptr;
    if (posix_memalign(&p, HUGE_PAGE, bytes) != 0) throw std::bad_alloc();
    madvise(p, bytes, MADV_HUGEPAGE);
    return static_cast<uint8_t*>(p);
}

std::atomic<uint64_t> packings{0};  // tensors packed by this process (specdemo_kernels_packings)

// The lock guards the cache's fields only, never a parallel region: a thread waiting in one may run another
// BlockMatMul's task (TBB steals within an arena), which would then wait on a lock its own thread holds. Two calls that
// find nothing packed both pack; the first to finish is kept.
std::shared_ptr<const PackedWeights> packed_for(PackCache& cache, const Gemms& gemms, const Weights& w) {
    {
        std::lock_guard<std::mutex> hold(cache.lock);
        if (auto found = cache.find(w.bytes, w.rows, &gemms)) return found;
    }
    const size_t panel = size_t(gemms.panel_rows), whole = w.rows / panel;
    auto packed = std::make_shared<PackedWeights>();
    packed->panels = (w.rows + panel - 1) / panel, packed->blocks = w.blocks;
    packed->bytes.reset(allocate_streamed(packed->panels * w.blocks * gemms.packed_block_bytes[int(w.kind)]));
    const PackFn pack = gemms.pack[int(w.kind)];
    tbb::parallel_for(tbb::blocked_range<size_t>(0, whole, 4), [&](const tbb::blocked_range<size_t>& range) {
        for (size_t p = range.begin(); p < range.end(); ++p)
            pack(w.bytes + p * panel * w.row_bytes, w.row_bytes, p, w.blocks, *packed);
    });
    if (whole < packed->panels) pack(last_panel_rows(w, panel).data(), w.row_bytes, whole, w.blocks, *packed);
    packings.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> hold(cache.lock);
    if (auto found = cache.find(w.bytes, w.rows, &gemms)) return found;
    if (cache.entries.size() == PackCache::KEPT) cache.entries.erase(cache.entries.begin());
    cache.entries.push_back({packed, w.bytes, w.rows, &gemms});
    return packed;
}

// A call's quantized activations, taken from its thread's spares and given back when the call ends: a call its thread
// runs while it waits takes another, so no two calls share one. (Allocated a call, they cost ~1 % of the 0.5B draft's
// step on the Zen 3, in malloc's slow path: ~110 calls a step, of a few KiB each.) Only a call of at most KEPT_ROWS rows
// (a step's, a verification's) gives its buffers back, so that a thread keeps at most ~0.5 MiB (16 rows of 8,960
// columns, both forms' capacity): the app's many threads do not each hold a prompt piece's 12 MiB.
class Activations {
public:
    static constexpr int KEPT_ROWS = 16;

    Activations() {
        auto& spares = thread_spares();
        if (spares.empty()) {
            rows_ = std::make_unique<ManyRows>();
        } else {
            rows_ = std::move(spares.back());
            spares.pop_back();
        }
    }
    ~Activations() {
        if (rows_->rows <= KEPT_ROWS) thread_spares().push_back(std::move(rows_));
    }
    Activations(const Activations&) = delete;
    Activations& operator=(const Activations&) = delete;
    ManyRows& rows() { return *rows_; }

private:
    static std::vector<std::unique_ptr<ManyRows>>& thread_spares() {
        thread_local std::vector<std::unique_ptr<ManyRows>> spares;
        return spares;
    }
    std::unique_ptr<ManyRows> rows_;
};

// What a call does to x before quantizing it: nothing, or the rms prologue's x / sqrt(mean(x²) + eps) · g.
struct Prologue {
    const float* g = nullptr;  // (columns) f32; nullptr: x as it is
    float eps = 0.f;
};

// Row m of x as the call quantizes it: x's own row, or (rms) that row normalized into `buffer`. As the graph's
// decomposition computes it (gguf_graph._rms_norm): g · (x · 1 / sqrt(mean(x²) + eps)), the sum of squares in double
// (as llama.cpp sums it).
const float* prepared_row(const float* x, size_t columns, const Prologue& prologue, std::vector<float>& buffer) {
    if (!prologue.g) return x;
    double lanes[8] = {};  // 8 sums, not 1: a step's ~60 norms are on its critical path, and one sum is latency-bound
    size_t i = 0;
    for (; i + 8 <= columns; i += 8)
        for (int l = 0; l < 8; ++l) lanes[l] += double(x[i + l]) * x[i + l];
    for (; i < columns; ++i) lanes[0] += double(x[i]) * x[i];
    double squares = 0;
    for (double lane : lanes) squares += lane;
    const float inverse = 1.f / std::sqrt(float(squares / double(columns)) + prologue.eps);
    buffer.resize(columns);
    for (size_t i = 0; i < columns; ++i) buffer[i] = prologue.g[i] * (x[i] * inverse);
    return buffer.data();
}

// What a call adds to its products as it writes them: nothing, a bias b (rows) or a residual r (M, rows).
struct Addend {
    const float* values = nullptr;
    bool per_row_of_x = false;  // r: a value for every (m, row); b: one for every row
};

// y[m, first … last) += the addend's, for every activation row m: a task's own output rows, while they are in cache.
// The same f32 sum as the plugin's Add (y + b, r + y): the logits are the same bits as with the Add.
void add_to(const Addend& addend, float* y, size_t m_rows, size_t rows, size_t first, size_t last) {
    if (!addend.values) return;
    for (size_t m = 0; m < m_rows; ++m) {
        const float* add = addend.values + (addend.per_row_of_x ? m * rows : 0);
        for (size_t r = first; r < last; ++r) y[m * rows + r] += add[r];
    }
}

// y (M, rows) = x (M, columns) · Wᵀ on the packed panels: the activations quantized a slot at a time (formats.hpp:
// ManyRows), then a few panels a task; the last panel, when rows end inside it, into a buffer of its own first.
void multiply_packed(const Weights& w, const Gemms& gemms, const PackedWeights& packed, const float* x, size_t m_rows,
                     const Prologue& prologue, const Addend& addend, float* y) {
    Activations held;
    ManyRows& a = held.rows();
    a.resize(w.kind, int(m_rows), w.columns, gemms.q8_k[int(w.kind)]);
    tbb::parallel_for(size_t(0), m_rows, [&](size_t m) {
        thread_local std::vector<float> normed;
        gemms.quantize(prepared_row(x + m * w.columns, size_t(w.columns), prologue, normed), int(m), a);
    });
    const size_t panel = size_t(gemms.panel_rows), whole = w.rows / panel;
    const GemmFn gemm = gemms.gemm[int(w.kind)];
    // Tasks of about whole / TASKS_A_CALL panels, not one each: a panel of the 0.5B draft's Q5_0 layers is 10 KiB, ~1.5 µs
    // of a core's streaming, and a TBB task costs a good part of that. One panel a task took 1.02× the time of 32 tasks
    // a call in a step of either model on a quiet host, 1.03-1.05× on a loaded one, 1.09× in 5 tokens of the draft
    // (2-core Zen 3, paired in one process; 8 tasks a call left a thread idle: the draft's step 1.03×).
    const size_t grain = std::max<size_t>(1, whole / TASKS_A_CALL);
    tbb::parallel_for(tbb::blocked_range<size_t>(0, whole, grain), [&](const tbb::blocked_range<size_t>& range) {
        gemm(packed, a, y + range.begin() * panel, w.rows, range.begin(), range.end());
        add_to(addend, y, m_rows, w.rows, range.begin() * panel, range.end() * panel);
    }, tbb::simple_partitioner());
    if (whole < packed.panels) {
        std::vector<float> last(m_rows * panel);
        gemm(packed, a, last.data(), panel, whole, whole + 1);
        for (size_t m = 0; m < m_rows; ++m)
            std::memcpy(y + m * w.rows + whole * panel, last.data() + m * panel, (w.rows - whole * panel) * 4);
        add_to(addend, y, m_rows, w.rows, whole * panel, w.rows);
    }
}

// y (M, rows) = x (M, columns) · Wᵀ by dot products of each weight row with the M rows quantized as llama.cpp does
// (formats.hpp): a step's way where the ISA has no gemm for it.
void dot_rows(const Weights& w, const Kernels& kernels, const float* x, size_t m_rows, const Prologue& prologue,
              const Addend& addend, float* y) {
    const size_t q_bytes = quantized_row_bytes(w.kind, w.columns);
    std::vector<uint8_t> quantized(m_rows * q_bytes);  // this call's own (a thread_local would be shared with any call
                                                       // its thread runs while it waits)
    uint8_t* q = quantized.data();
    const ArrangeFn arrange = kernels.arrange[int(w.kind)];
    tbb::parallel_for(size_t(0), m_rows, [&](size_t m) {
        thread_local std::vector<float> normed;
        quantize_row(w.kind, prepared_row(x + m * w.columns, size_t(w.columns), prologue, normed), w.columns,
                     q + m * q_bytes);
        if (arrange) arrange(q + m * q_bytes, w.columns);
    });
    const DotFn dot = kernels.dot[int(w.kind)];
    // Tasks of rows / TASKS_A_CALL rows, taken by whichever thread is free: a worker that wakes late (a step runs ~130
    // of these calls between the plugin's own nodes) leaves the first thread no fixed half to finish alone.
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, w.rows, std::max(MIN_ROWS_A_TASK, w.rows / TASKS_A_CALL)),
        [&](const tbb::blocked_range<size_t>& range) {
            for (size_t first = 0; first < m_rows; first += ACTIVATIONS_A_PASS) {
                const size_t last = std::min(m_rows, first + ACTIVATIONS_A_PASS);
                for (size_t n = range.begin(); n < range.end(); ++n)
                    dot(w.bytes + n * w.row_bytes, w.blocks, q + first * q_bytes, q_bytes, int(last - first),
                        y + first * w.rows + n, w.rows);
            }
            add_to(addend, y, m_rows, w.rows, range.begin(), range.end());
        },
        tbb::simple_partitioner());
}

// out (M, half) = silu(both[:, :half])·both[:, half:], a task per row and GLU_COLUMNS columns.
void apply_glu(GluFn glu, const float* both, size_t m_rows, size_t half, float* out) {
    const size_t chunks = (half + GLU_COLUMNS - 1) / GLU_COLUMNS;
    tbb::parallel_for(size_t(0), m_rows * chunks, [&](size_t task) {
        const size_t m = task / chunks, first = task % chunks * GLU_COLUMNS, n = std::min(GLU_COLUMNS, half - first);
        glu(both + m * 2 * half + first, both + m * 2 * half + half + first, out + m * half + first, n);
    });
}

}  // namespace

BlockMatMul::BlockMatMul(const ov::OutputVector& inputs, const std::string& kind, int64_t columns,
                         const std::string& epilogue, const std::string& prologue, float eps)
    : Op(inputs), m_kind(kind), m_columns(columns), m_epilogue(epilogue), m_prologue(prologue), m_eps(eps) {
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
    const bool glu = m_epilogue == "swiglu", bias = m_epilogue == "bias", residual = m_epilogue == "residual";
    NODE_VALIDATION_CHECK(this, glu || bias || residual || m_epilogue.empty(), "BlockMatMul: epilogue ", m_epilogue,
                          " is not swiglu, bias or residual");
    NODE_VALIDATION_CHECK(this, !glu || w[0].is_dynamic() || w[0].get_length() % 2 == 0,
                          "BlockMatMul: swiglu needs the gate's rows and as many of up's");
    const bool rms = m_prologue == "rms";
    NODE_VALIDATION_CHECK(this, rms || m_prologue.empty(), "BlockMatMul: prologue ", m_prologue, " is not rms");
    const size_t extra = size_t(rms) + size_t(bias || residual);
    NODE_VALIDATION_CHECK(this, get_input_size() == 2 + extra, "BlockMatMul: ", get_input_size(), " inputs, not ",
                          2 + extra, " for the prologue '", m_prologue, "' and the epilogue '", m_epilogue, "'");
    for (size_t i = 2; i < get_input_size(); ++i)
        NODE_VALIDATION_CHECK(this, get_input_element_type(i) == ov::element::f32, "BlockMatMul: input ", i,
                              " must be f32");
    if (rms && get_input_partial_shape(2).is_static())
        NODE_VALIDATION_CHECK(this, ov::shape_size(get_input_shape(2)) == size_t(m_columns),
                              "BlockMatMul: the rms prologue's weights must be ", m_columns, " values");
    if (bias && get_input_partial_shape(2 + rms).is_static() && w[0].is_static())
        NODE_VALIDATION_CHECK(this, ov::shape_size(get_input_shape(2 + rms)) == size_t(w[0].get_length()),
                              "BlockMatMul: the bias must be ", w[0].get_length(), " values");
    ov::PartialShape y = x;
    if (x.rank().is_static()) {
        NODE_VALIDATION_CHECK(this, x.rank().get_length() >= 1 && x[x.rank().get_length() - 1].compatible(m_columns),
                              "BlockMatMul: activations' last dimension must be ", m_columns);
        y[y.rank().get_length() - 1] = glu && w[0].is_static() ? ov::Dimension(w[0].get_length() / 2) : w[0];
    }
    if (residual)
        NODE_VALIDATION_CHECK(this, get_input_partial_shape(2 + rms).compatible(y), "BlockMatMul: the residual's "
                              "shape ", get_input_partial_shape(2 + rms), " is not the output's ", y);
    set_output_type(0, ov::element::f32, y);
}

std::shared_ptr<ov::Node> BlockMatMul::clone_with_new_inputs(const ov::OutputVector& inputs) const {
    check_new_args_count(this, inputs);
    auto clone = std::make_shared<BlockMatMul>(inputs, m_kind, m_columns, m_epilogue, m_prologue, m_eps);
    clone->m_cache = m_cache;  // one packing for the op and its copies: a model compiled twice (OVModel's step-sized
                               // variant) packs each tensor once; the cache keys a packing by the tensor's address
    return clone;
}

bool BlockMatMul::visit_attributes(ov::AttributeVisitor& visitor) {
    visitor.on_attribute("kind", m_kind);
    visitor.on_attribute("columns", m_columns);
    visitor.on_attribute("epilogue", m_epilogue);
    visitor.on_attribute("prologue", m_prologue);
    visitor.on_attribute("eps", m_eps);
    return true;
}

bool BlockMatMul::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const {
    const Kind kind = parse_kind(m_kind);
    const ov::Shape x_shape = inputs[0].get_shape();
    const size_t columns = x_shape.back(), rows = inputs[1].get_shape()[0], row_bytes = inputs[1].get_shape()[1];
    const size_t m_rows = ov::shape_size(x_shape) / columns;
    const bool glu = m_epilogue == "swiglu";
    ov::Shape y_shape = x_shape;
    y_shape.back() = glu ? rows / 2 : rows;
    outputs[0].set_shape(y_shape);

    const float* x = inputs[0].data<const float>();
    const uint8_t* w = static_cast<const uint8_t*>(inputs[1].data());
    // (M, rows): the gate's then up's, before the epilogue; left uninitialized (every value is written): a prefill's
    // chunk would otherwise clear megabytes a layer
    std::unique_ptr<float[]> both(glu ? new float[m_rows * rows] : nullptr);
    float* y = glu ? both.get() : outputs[0].data<float>();
    const Weights weights{kind, w, rows, row_bytes, int(columns), int(columns / block_values(kind))};
    const Kernels& kernels = chosen_kernels();
    const bool rms = m_prologue == "rms";
    const Prologue prologue{rms ? inputs[2].data<const float>() : nullptr, m_eps};
    const bool added = m_epilogue == "bias" || m_epilogue == "residual";
    const Addend addend{added ? inputs[2 + rms].data<const float>() : nullptr, m_epilogue == "residual"};
    const Gemms* gemms = kernels.gemms;
    // Packed at the op's first call whatever its rows, which OVModel makes while the model loads (runtime.py: _pack),
    // so that no prompt pays for it; kept for the rest.
    const auto packed = gemms && gemms->gemm[int(kind)] ? packed_for(*m_cache, *gemms, weights) : nullptr;
    if (packed && m_rows >= size_t(gemm_from(*gemms))) {
        multiply_packed(weights, *gemms, *packed, x, m_rows, prologue, addend, y);
    } else {
        dot_rows(weights, kernels, x, m_rows, prologue, addend, y);
    }
    if (glu) apply_glu(kernels.glu, both.get(), m_rows, rows / 2, outputs[0].data<float>());
    return true;
}

uint64_t packings_so_far() { return packings.load(std::memory_order_relaxed); }

}  // namespace specdemo
