#include "attention.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "formats.hpp"

namespace specdemo {

// The cache: keys and values by head, (kv_heads, room, head_dim) each, so that a step reads each head's positions as one
// sequential stream. (By position, (positions, kv_heads, head_dim), a head's reads skip the other heads' and the
// prefetcher follows them less well: the 1.5B target's attention, 28 layers at 300 positions read from memory, took
// 1.2× the time on the Zen 3.) Grown by doubling `room` as calls need (every head moved once a doubling) and never
// shrunk: a rolled-back or emptied cache keeps its memory for the next prompt.
struct KVStore {
    std::mutex lock;  // one call at a time (a compiled model runs one infer request here; this makes sure)
    std::vector<float> k, v;
    std::vector<float> q;  // a call's queries rotated (L, heads, d), where the op applies the rotary embedding
    std::vector<float> turns;  // a call's (cos, sin) of each row's angles, (L, 2, d / 2)
    size_t room = 0;       // positions each head has space for
    size_t positions = 0;  // written and not rolled back past
};

std::shared_ptr<KVStore> CachedAttention::make_store() { return std::make_shared<KVStore>(); }

void attend_scalar(const Rows& rows, const float* k, const float* v, size_t stride, size_t d, float scale,
                   float* scores) {
    for (size_t r = 0; r < rows.rows; ++r) {
        const float* q = rows.q[r];
        float* out = rows.out[r];
        const size_t n = rows.n[r];
        float top = -std::numeric_limits<float>::infinity();
        for (size_t s = 0; s < n; ++s) {
            float sum = 0;
            for (size_t i = 0; i < d; ++i) sum += q[i] * k[s * stride + i];
            scores[s] = sum * scale;
            top = std::max(top, scores[s]);
        }
        float total = 0;
        for (size_t s = 0; s < n; ++s) total += scores[s] = std::exp(scores[s] - top);
        std::fill(out, out + d, 0.0f);
        for (size_t s = 0; s < n; ++s)
            for (size_t i = 0; i < d; ++i) out[i] += scores[s] * v[s * stride + i];
        const float inverse = total > 0 ? 1.0f / total : 0.0f;
        for (size_t i = 0; i < d; ++i) out[i] *= inverse;
    }
}

namespace {

constexpr size_t ROWS_A_TASK = 16;  // query rows a task scores against its key-value head's cache

// The row kernel of the kernels running (dispatch.cpp): AVX2's on every SIMD path (a row's few thousand products
// are read-bound, AVX-512 would add nothing worth a third copy), the scalar one where that is held or d is not whole
// vectors.
AttendFn attend_for(size_t d) {
    return std::strcmp(chosen_kernels().isa, "scalar") != 0 && d % 8 == 0 ? avx2_attention() : attend_scalar;
}

// Makes room for `total` positions a head, keeping each head's first `kept`.
void make_room(KVStore& store, size_t total, size_t kept, size_t kv_heads, size_t d) {
    if (total <= store.room) return;
    const size_t room = std::max({total, 2 * store.room, size_t(64)});
    for (std::vector<float>* cache : {&store.k, &store.v}) {
        std::vector<float> grown(kv_heads * room * d);
        for (size_t h = 0; h < kv_heads && kept > 0; ++h)
            std::memcpy(grown.data() + h * room * d, cache->data() + h * store.room * d, kept * d * sizeof(float));
        cache->swap(grown);
    }
    store.room = room;
}

// Copies the call's L rows of (1, L, kv_heads, d) into the cache at positions past .. past + L − 1.
void store_rows(const float* from, std::vector<float>& to, size_t room, size_t past, size_t rows, size_t kv_heads,
                size_t d) {
    for (size_t l = 0; l < rows; ++l)
        for (size_t h = 0; h < kv_heads; ++h)
            std::memcpy(to.data() + (h * room + past + l) * d, from + (l * kv_heads + h) * d, d * sizeof(float));
}

// The (cos, sin) of rows positions past … past + L − 1 at each frequency, (L, 2, d / 2), in f32 as the graph's own
// rotary embedding has them (gguf_graph._rotary: the position times the frequency, then cos and sin).
void turn(const std::vector<float>& frequencies, size_t past, size_t rows, std::vector<float>& turns) {
    const size_t half = frequencies.size();
    turns.resize(rows * 2 * half);
    for (size_t l = 0; l < rows; ++l)
        for (size_t i = 0; i < half; ++i) {
            const float angle = float(past + l) * frequencies[i];
            turns[(2 * l) * half + i] = std::cos(angle), turns[(2 * l + 1) * half + i] = std::sin(angle);
        }
}

// Rows of (L, heads, d) rotated by their row's turns, row l of head h to `to` + where(h, l)·d.
template <typename Where>
void rotate(const float* from, size_t heads, size_t rows, size_t d, const float* turns, float* to, Where where) {
    const size_t half = d / 2;
    for (size_t l = 0; l < rows; ++l)
        for (size_t h = 0; h < heads; ++h) {
            const float *x = from + (l * heads + h) * d, *cos = turns + 2 * l * half, *sin = cos + half;
            float* y = to + where(h, l) * d;
            for (size_t i = 0; i < half; ++i) {
                y[i] = x[i] * cos[i] - x[i + half] * sin[i];
                y[i + half] = x[i + half] * cos[i] + x[i] * sin[i];
            }
        }
}

// "f,f,…" as floats, each rounded once from its decimal (a float's shortest decimal gives back that float).
std::vector<float> floats(const std::string& text) {
    std::vector<float> values;
    for (const char* at = text.c_str(); *at;) {
        char* end = nullptr;
        values.push_back(std::strtof(at, &end));
        OPENVINO_ASSERT(end != at, "CachedAttention: frequencies \"", text, "\" are not numbers");
        at = *end == ',' ? end + 1 : end;
    }
    return values;
}

}  // namespace

CachedAttention::CachedAttention(const ov::OutputVector& inputs, float scale, std::string frequencies)
    : Op(inputs), m_scale(scale), m_rotary(std::move(frequencies)), m_frequencies(floats(m_rotary)) {
    constructor_validate_and_infer_types();
}

void CachedAttention::validate_and_infer_types() {
    NODE_VALIDATION_CHECK(this, get_input_size() == 4, "CachedAttention takes q, k, v and their positions");
    for (size_t i = 0; i < 3; ++i) {
        NODE_VALIDATION_CHECK(this, get_input_element_type(i) == ov::element::f32, "CachedAttention takes f32 q, k, v");
        NODE_VALIDATION_CHECK(this, get_input_partial_shape(i).rank().compatible(4),
                              "CachedAttention: q, k, v are 4-D");
    }
    // i64 as written; the plugin hands integer inputs on as i32
    const auto positions = get_input_element_type(3);
    NODE_VALIDATION_CHECK(this, positions == ov::element::i64 || positions == ov::element::i32,
                          "CachedAttention takes integer positions");
    const auto& q = get_input_partial_shape(0);
    ov::PartialShape y{ov::Dimension::dynamic(), ov::Dimension::dynamic(), ov::Dimension::dynamic()};
    if (q.rank().is_static()) y = {q[0], q[1], q[2] * q[3]};
    set_output_type(0, ov::element::f32, y);
}

std::shared_ptr<ov::Node> CachedAttention::clone_with_new_inputs(const ov::OutputVector& inputs) const {
    check_new_args_count(this, inputs);
    auto clone = std::make_shared<CachedAttention>(inputs, m_scale, m_rotary);
    clone->m_store = m_store;  // one cache for the op and its copies: the models one graph is compiled into (OVModel's
                               // step-sized variant beside the general one) read and write the same keys and values
    return clone;
}

bool CachedAttention::visit_attributes(ov::AttributeVisitor& visitor) {
    visitor.on_attribute("scale", m_scale);
    visitor.on_attribute("frequencies", m_rotary);
    m_frequencies = floats(m_rotary);
    return true;
}

bool CachedAttention::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const {
    const ov::Shape q_shape = inputs[0].get_shape(), k_shape = inputs[1].get_shape();
    const size_t rows = q_shape[1], heads = q_shape[2], d = q_shape[3], kv_heads = k_shape[2];
    OPENVINO_ASSERT(q_shape[0] == 1 && k_shape[0] == 1, "CachedAttention: a batch of one");
    OPENVINO_ASSERT(k_shape[1] == rows && k_shape[3] == d && inputs[2].get_shape() == k_shape,
                    "CachedAttention: k and v must be (1, L, kv_heads, head_dim) for q's L and head_dim");
    OPENVINO_ASSERT(kv_heads > 0 && heads % kv_heads == 0, "CachedAttention: ", heads, " query heads over ", kv_heads,
                    " key-value heads");
    OPENVINO_ASSERT(inputs[3].get_shape() == ov::Shape({1, rows}), "CachedAttention: positions must be (1, L) for q's L");
    OPENVINO_ASSERT(m_frequencies.empty() || 2 * m_frequencies.size() == d, "CachedAttention: ", m_frequencies.size(),
                    " rotary frequencies for heads of ", d);
    const int64_t first = inputs[3].get_element_type() == ov::element::i64 ? inputs[3].data<const int64_t>()[0]
                                                                            : inputs[3].data<const int32_t>()[0];
    OPENVINO_ASSERT(first >= 0, "CachedAttention: a call at position ", first);
    const size_t past = size_t(first), total = past + rows;
    outputs[0].set_shape({1, rows, heads * d});

    std::lock_guard<std::mutex> hold(m_store->lock);
    KVStore& store = *m_store;
    OPENVINO_ASSERT(past <= store.positions, "CachedAttention: the call follows ", past, " positions, the cache holds ",
                    store.positions);
    make_room(store, total, past, kv_heads, d);
    const float* q = inputs[0].data<const float>();
    if (m_frequencies.empty()) {
        store_rows(inputs[1].data<const float>(), store.k, store.room, past, rows, kv_heads, d);
    } else {
        turn(m_frequencies, past, rows, store.turns);
        const size_t room = store.room;
        rotate(inputs[1].data<const float>(), kv_heads, rows, d, store.turns.data(), store.k.data(),
               [&](size_t h, size_t l) { return h * room + past + l; });
        store.q.resize(rows * heads * d);
        rotate(q, heads, rows, d, store.turns.data(), store.q.data(), [&](size_t h, size_t l) { return l * heads + h; });
        q = store.q.data();
    }
    store_rows(inputs[2].data<const float>(), store.v, store.room, past, rows, kv_heads, d);
    store.positions = total;

    float* y = outputs[0].data<float>();
    const AttendFn attend = attend_for(d);
    // A task per key-value head and block of its query rows (its query heads' rows, (head, l) in order): the head's
    // cache is read once a block. The blocks as even as ROWS_A_TASK allows.
    const size_t group = heads / kv_heads, per_head = group * rows;
    const size_t blocks = (per_head + ROWS_A_TASK - 1) / ROWS_A_TASK, block = (per_head + blocks - 1) / blocks;
    tbb::parallel_for(size_t(0), kv_heads * blocks, [&](size_t task) {
        thread_local std::vector<float> scores;
        const size_t h = task / blocks, first = task % blocks * block, count = std::min(block, per_head - first);
        const float* queries[ROWS_A_TASK];
        float* outs[ROWS_A_TASK];
        size_t positions[ROWS_A_TASK];
        for (size_t i = 0; i < count; ++i) {
            const size_t head = h * group + (first + i) / rows, l = (first + i) % rows;
            queries[i] = q + (l * heads + head) * d, outs[i] = y + (l * heads + head) * d, positions[i] = past + l + 1;
        }
        const size_t width = (total + 3) / 4 * 4;
        if (scores.size() < count * (width + 1)) scores.resize(count * (width + 1));
        const size_t start = h * store.room * d;  // the head's first position
        attend({queries, outs, positions, count}, store.k.data() + start, store.v.data() + start, d, d, m_scale,
               scores.data());
    });
    return true;
}

}  // namespace specdemo
