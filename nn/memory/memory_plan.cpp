// nn/memory/memory_plan.cpp: predict_peak's replay of a training step (Note [The step replayed],
// nn/memory/memory_plan.h): a byte-counting copy of the GPT's modules, of what each op it uses allocates
// and saves, of the backward engine and of checkpoint(). Every function here names the code it
// follows; a storage is a Buf, released when its last handle goes, so that the C++ scopes below
// free bytes where the real code's scopes free tensors. Not here: the model's math, which the
// replay never computes.
#include "nn/memory/memory_plan.h"

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/allocator.h"
#include "core/check.h"
#include "nn/parallel/data_parallel.h"
#include "nn/optim/muon.h"
#include "ops/attention.h"
#include "ops/linear_cross_entropy.h"

namespace normtape {

namespace {

class Replay;

// One storage: its bytes count as live while a Buf holds it (core/storage.h).
class Bytes {
public:
    Bytes(Replay& replay, int64_t n) : replay_(replay), n_(n) {}
    ~Bytes();
    Bytes(const Bytes&) = delete;
    Bytes& operator=(const Bytes&) = delete;

private:
    Replay& replay_;
    int64_t n_;
};
using Buf = std::shared_ptr<Bytes>;

struct Node;
struct Recipe;
struct Frame;

// A Tensor handle as the replay sees it: its storage (null for a parameter's and the batch's, which
// are resident) and what autograd knows of it.
struct Ten {
    bool defined = false;
    Buf buf;
    int64_t bytes = 0;        // numel * element size of this view: its gradient's bytes too
    bool requires_grad = false;
    bool parameter = false;   // a parameter's storage (or a view of it): saved as itself
    int leaf = -1;            // a parameter: the index of its gradient
    std::shared_ptr<Node> grad_fn;
    std::shared_ptr<const Recipe> recipe;  // Note [Rematerialization]
};

// SavedTensor (core/autograd.cpp): the storage it keeps, or the recipe that makes it again.
struct Saved {
    bool defined = false;
    Buf data;
    std::shared_ptr<const Recipe> recipe;
    Buf unpack(Replay& r) const;
    void release() {
        data.reset();
        recipe.reset();
    }
};

// Recipe: its inputs (what it keeps alive) and what make() allocates; a checkpoint's hands out
// tensor k of its frame instead.
struct Recipe {
    std::vector<Saved> inputs;
    int64_t bytes = 0;
    std::shared_ptr<Frame> frame;
    size_t k = 0;
};

struct Edge {
    bool valid = false;
    std::shared_ptr<Node> node;  // or a leaf:
    int leaf = -1;
};

struct Node {
    uint64_t seq = 0;
    std::string where;  // module path and node name, for StepMemory::peak_at
    std::vector<Edge> edges;
    std::vector<Saved> saved;
    std::function<std::vector<Ten>(const Ten& grad)> apply;

    Node() = default;
    Node(const Node&) = delete;
    Node& operator=(const Node&) = delete;
    // Releases the chain of producers behind it without recursion: a node held only by this one
    // gives up its edges here, before it goes, so that a model of 20,000 blocks does not release
    // 100,000 nodes one inside the other's destructor, on the stack.
    // (Where the list cannot grow, the edges not yet taken are released the recursive way.)
    ~Node() {
        std::vector<std::shared_ptr<Node>> pending;
        const auto take_edges = [&](Node& n) {
            for (Edge& e : n.edges)
                if (e.node) pending.push_back(std::move(e.node));  // e.node stays if push_back throws
        };
        try {
            take_edges(*this);
            while (!pending.empty()) {
                std::shared_ptr<Node> n = std::move(pending.back());
                pending.pop_back();
                if (n.use_count() == 1) take_edges(*n);
            }
        } catch (const std::bad_alloc&) {
        }
    }
};

// detail::CheckpointFrame (core/activation_checkpoint.cpp).
struct Frame : std::enable_shared_from_this<Frame> {
    std::function<Ten(const Ten&)> fn;
    Saved input;
    int64_t input_bytes = 0;
    std::string where;
    size_t saved = 0;             // tensors dropped in the forward
    std::vector<Buf> recomputed;  // by the last rerun
    std::vector<bool> handed_out;

    Buf take(Replay& r, size_t k);
    void rerun(Replay& r);
};

struct SaveScope {
    Frame* frame;
    bool rerun;  // checkpoint_rerun, else checkpoint_forward
};

// The allocator's counters, and the autograd state a step touches: the save scopes of
// checkpoint(), the sequence numbers, the parameters' gradients.
class Replay {
public:
    explicit Replay(int64_t resident) : live_(resident), peak_(resident), peak_at_("the step's start") {}

    Buf alloc(int64_t n) {
        if (n <= 0) return nullptr;  // allocate(0) is nullptr, counted nowhere
        live_ += n;
        if (allocations) allocations->push_back(live_);
        if (live_ > peak_) {
            peak_ = live_;
            peak_at_ = phase;
            if (!where.empty()) peak_at_ += ", " + where;
        }
        return std::make_shared<Bytes>(*this, n);
    }
    void transient(int64_t n) { Buf b = alloc(n); }  // allocated and freed with nothing between
    void release(int64_t n) { live_ -= n; }
    int64_t peak() const { return peak_; }
    const std::string& peak_at() const { return peak_at_; }

    // SavedTensor's constructor, in its order: a parameter as itself; inside checkpoint()'s function
    // a recipe (forward) or a capture (rerun); a tensor's own recipe; else its storage.
    Saved save(const Ten& t) {
        Saved s;
        if (!t.defined) return s;
        s.defined = true;
        if (!t.parameter && !save_scopes.empty()) {
            const SaveScope& scope = save_scopes.back();
            if (!scope.rerun) {  // detail::checkpoint_drop
                auto recipe = std::make_shared<Recipe>();
                recipe->inputs = {scope.frame->input};
                recipe->frame = scope.frame->shared_from_this();
                recipe->k = scope.frame->saved++;
                s.recipe = recipe;
                return s;
            }
            scope.frame->recomputed.push_back(t.buf);  // detail::checkpoint_capture
        }
        if (t.recipe) {
            s.recipe = t.recipe;
            return s;
        }
        s.data = t.buf;
        return s;
    }

    // set_recipe: a recipe of `inputs` that makes `bytes` again.
    void set_recipe(Ten& t, std::initializer_list<const Ten*> inputs, int64_t bytes) {
        auto recipe = std::make_shared<Recipe>();
        for (const Ten* in : inputs) recipe->inputs.push_back(save(*in));
        recipe->bytes = bytes;
        t.recipe = recipe;
    }

    // record(): one edge per input, the next sequence number, out's grad_fn.
    void record(const std::shared_ptr<Node>& node, Ten& out, std::initializer_list<const Ten*> inputs,
                const char* name) {
        for (const Ten* in : inputs) {
            Edge e;
            if (in && in->defined && in->requires_grad) {
                e.valid = true;
                if (in->grad_fn) e.node = in->grad_fn;
                else e.leaf = in->leaf;
            }
            node->edges.push_back(e);
        }
        node->seq = next_seq_++;
        node->where = where + (where.empty() ? "" : " ") + name;
        out.grad_fn = node;
        out.requires_grad = true;
    }

    // detail::run_backward from a 0-dim root, implicit gradient (ones).
    void backward(const Ten& root) {
        Ten g = fresh(root.bytes);
        std::vector<Node*> order;
        std::unordered_set<Node*> seen{root.grad_fn.get()};
        std::vector<Node*> stack{root.grad_fn.get()};
        while (!stack.empty()) {
            Node* n = stack.back();
            stack.pop_back();
            order.push_back(n);
            for (const Edge& e : n->edges)
                if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
        }
        std::sort(order.begin(), order.end(), [](Node* a, Node* b) { return a->seq > b->seq; });
        std::unordered_map<Node*, Ten> pending{{root.grad_fn.get(), g}};
        for (Node* node : order) {
            auto it = pending.find(node);
            if (it == pending.end()) continue;
            Ten grad_output = std::move(it->second);
            pending.erase(it);
            where = node->where;
            std::vector<Ten> grad_inputs = node->apply(grad_output);
            for (Saved& s : node->saved) s.release();
            for (size_t i = 0; i < node->edges.size(); ++i) {
                const Edge& e = node->edges[i];
                if (!e.valid || i >= grad_inputs.size() || !grad_inputs[i].defined) continue;
                if (e.node) {
                    Ten& slot = pending[e.node.get()];
                    if (!slot.defined) slot = grad_inputs[i];
                    else slot = fresh(slot.bytes);  // clone, then add_ the new one into it
                } else if (e.leaf >= 0 && !gradients[e.leaf]) {
                    gradients[e.leaf] = alloc(gradient_bytes[e.leaf]);  // the first: a copy
                }                                                       // later: add_ in place
            }
        }
        where.clear();
    }

    Ten fresh(int64_t bytes) {
        Ten t;
        t.defined = true;
        t.buf = alloc(bytes);
        t.bytes = bytes;
        return t;
    }

    std::string phase;                  // the micro-batch and phase (forward, backward, optimizer)
    std::string where;                  // the module path, or the node in backward
    std::vector<SaveScope> save_scopes;
    std::vector<int64_t> gradient_bytes;  // per parameter
    // Per parameter, [rows, cols] of a blocks' matrix (Muon's under StepOptimizer::Muon), else {0, 0}.
    std::vector<std::pair<int64_t, int64_t>> block_matrix;
    std::vector<Buf> gradients;           // per parameter, once made
    std::vector<int64_t>* allocations = nullptr;  // live bytes after each allocation, when set

private:
    int64_t live_, peak_;
    std::string peak_at_;
    uint64_t next_seq_ = 0;
};

Bytes::~Bytes() { replay_.release(n_); }

Buf Saved::unpack(Replay& r) const {
    if (!defined) return nullptr;
    if (!recipe) return data;
    if (recipe->frame) return recipe->frame->take(r, recipe->k);
    return r.alloc(recipe->bytes);  // its inputs are alive (it holds them)
}

// CheckpointFrame::take and rerun: the first unpack runs fn again on the saved input, keeping what
// the rerun saves, in order, each handed out once; the rerun's own graph goes with its output.
Buf Frame::take(Replay& r, size_t k) {
    if (k >= handed_out.size() || handed_out[k]) rerun(r);
    handed_out[k] = true;
    return std::move(recomputed[k]);
}

void Frame::rerun(Replay& r) {
    Ten a;  // inputs[0].unpack(), held through the rerun
    a.defined = true;
    a.buf = input.unpack(r);
    a.bytes = input_bytes;
    a.requires_grad = true;
    recomputed.clear();
    const std::string outer_phase = r.phase, outer_where = r.where;
    r.phase += " (" + outer_where + " runs the forward of checkpointed " + where + " again)";
    r.where.clear();
    r.save_scopes.push_back({this, true});
    fn(a);  // its output and graph are dropped here
    r.save_scopes.pop_back();
    r.phase = outer_phase;
    r.where = outer_where;
    handed_out.assign(saved, false);
}

// Module::ModuleScope for the replay's labels.
class Scope {
public:
    Scope(Replay& r, const std::string& name) : r_(r), outer_(r.where) {
        r.where = outer_.empty() ? name : outer_ + "." + name;
    }
    ~Scope() { r_.where = outer_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

private:
    Replay& r_;
    std::string outer_;
};

struct LinearP {
    Ten weight, bias;
    int64_t in = 0, out = 0;
};
struct NormP {
    Ten weight, bias;  // undefined without elementwise_affine (bias: LayerNorm only)
    NormKind kind = NormKind::Layer;
};
struct BlockP {
    NormP ln_1, ln_2, q_norm, k_norm;
    LinearP c_attn, c_q, c_k, c_v, attn_proj, c_fc, mlp_proj;
};

// The column sums' partial rows of ops/cuda_common.cu column_sum_cuda<In, Out>: more than a chunk
// of rows (256 in 16-byte vectors, 32 * 64 otherwise, at least 32 rows) are summed per chunk into
// [chunks, n] acc_t<Out>, summed again the same way. Bytes alive at once.
int64_t column_sum_partials(int64_t rows, int64_t n, int64_t in_size, bool in_f64, int64_t acc_size) {
    if (n == 0 || rows < 32) return 0;
    const bool vectors = !in_f64 && n % (16 / in_size) == 0;  // the allocator's blocks are aligned
    const int64_t chunk_rows = vectors ? 256 : 32 * 64;
    if (rows <= chunk_rows) return 0;
    const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    return chunks * n * acc_size + column_sum_partials(chunks, n, acc_size, acc_size == 8, acc_size);
}

// The most partial rows a norm backward's dweight and dbias take on CUDA: the fast kernels write
// one per resident block (ops/norm/norm_backward.cu; a GPU's SM count times at most 32 blocks
// each, bounded here by 160 SMs), the reference one per 64 rows (ops/norm/norm_reference.cu);
// both at most M. A bound read from the code.
int64_t norm_partial_rows(int64_t M) {
    return std::max(std::min<int64_t>(M, 160 * 32), (M + 63) / 64);
}

// The replay of a GPT's step (nn/model/gpt.cpp), on micro-batches of `rows` rows of T positions.
class GptReplay {
public:
    GptReplay(Replay& r, const GPTConfig& c, int64_t rows, int64_t T)
        : r_(r), c_(c), cuda_(c.device.is_cuda()), B_(rows), T_(T), E_(rows * T), C_(c.n_embd), NH_(c.n_head),
          NKV_(c.kv_heads()), hs_(c.n_embd / c.n_head), H_(c.hidden()), V_(c.vocab_size),
          es_(static_cast<int64_t>(element_size(c.dtype))),
          ss_(static_cast<int64_t>(element_size(stat_dtype(c.dtype)))) {
        // The parameters, as GPT's constructor makes them (only their sizes and identity matter).
        wte_ = param(V_ * C_);
        if (c.pos_embedding == PosEmbedding::Learned) wpe_ = param(c.block_size * C_);
        if (c.embedding_norm) emb_norm_ = norm_params(c.norm, C_);
        for (int64_t i = 0; i < c.n_layer; ++i) {
            BlockP b;
            b.ln_1 = norm_params(c.norm, C_);
            if (c.separate_qkv()) {
                b.c_q = linear_params(C_, NH_ * hs_);
                b.c_k = linear_params(C_, NKV_ * hs_);
                b.c_v = linear_params(C_, NKV_ * hs_);
                if (c.qk_norm) {
                    b.q_norm = norm_params(NormKind::RMS, hs_);
                    b.k_norm = norm_params(NormKind::RMS, hs_);
                }
            } else {
                b.c_attn = linear_params(C_, 3 * C_);
            }
            b.attn_proj = linear_params(C_, C_);
            b.ln_2 = norm_params(c.norm, C_);
            b.c_fc = linear_params(C_, c.mlp == MLPKind::SwiGLU ? 2 * H_ : H_);
            b.mlp_proj = linear_params(H_, C_);
            blocks_.push_back(b);
        }
        ln_f_ = norm_params(c.norm, C_);
        lm_head_.in = C_;
        lm_head_.out = V_;
        lm_head_.weight = c.tie_embeddings ? wte_ : param(V_ * C_);
    }

    // The batch's ids or targets for one micro-batch: the resident batch itself, or with several
    // micro-batches rows copied into storage of their own (train_gpt's micro_rows).
    Ten batch(bool copied) const {
        if (copied) return r_.fresh(E_ * 8);
        Ten t;
        t.defined = true;
        t.bytes = E_ * 8;
        return t;
    }

    // GPT::loss.
    Ten loss(const Ten& idx, const Ten& targets) {
        if (c_.fused_head_loss) return fused_loss(idx, targets);
        return cross_entropy(forward(idx), targets);
    }

    // scale(loss, 1/n) (ops/elementwise.cpp): a 0-dim output; its backward makes another.
    Ten scale(const Ten& a) {
        Ten out = r_.fresh(a.bytes);
        auto node = std::make_shared<Node>();
        const int64_t bytes = a.bytes;
        node->apply = [this, bytes](const Ten&) -> std::vector<Ten> { return {r_.fresh(bytes)}; };
        r_.record(node, out, {&a}, "ScaleBackward");
        return out;
    }

private:
    Ten param(int64_t numel) {
        Ten t;
        t.defined = true;
        t.bytes = numel * es_;
        t.requires_grad = true;
        t.parameter = true;
        t.leaf = static_cast<int>(r_.gradient_bytes.size());
        r_.gradient_bytes.push_back(t.bytes);
        r_.block_matrix.emplace_back(0, 0);
        r_.gradients.emplace_back();
        return t;
    }
    // Only the blocks' Linear layers are made here (lm_head is not).
    LinearP linear_params(int64_t in, int64_t out) {
        LinearP p;
        p.in = in;
        p.out = out;
        p.weight = param(out * in);
        r_.block_matrix.back() = {out, in};
        if (c_.bias) p.bias = param(out);
        return p;
    }
    NormP norm_params(NormKind kind, int64_t N) {
        NormP p;
        p.kind = kind;
        if (c_.norm_affine) {
            p.weight = param(N);
            if (kind == NormKind::Layer) p.bias = param(N);  // NormOptions::bias
        }
        return p;
    }

    // ops/matmul.cpp gemm(): on the cpu a bf16 product runs on f32 copies of its operands into an
    // f32 output, rounded into a bf16 copy (elements of out, a, b); on CUDA cuBLAS copies nothing.
    // The two copies are arguments of one call: GCC makes b's first (right to left), which only the
    // order of the trace sees.
    void gemm(int64_t out, int64_t a, int64_t b) {
        if (cuda_ || c_.dtype != DType::BF16) return;
        Buf tmp = r_.alloc(out * 4);
        {
            Buf b32 = r_.alloc(b * 4), a32 = r_.alloc(a * 4);
        }
        Buf rounded = r_.alloc(out * 2);
    }

    // sum_rows / column sums of a [rows, n] gradient of the model's dtype (CUDA partials only).
    void column_sum(int64_t rows, int64_t n) {
        if (cuda_) r_.transient(column_sum_partials(rows, n, es_, c_.dtype == DType::F64, ss_));
    }

    // linear (ops/matmul.cpp) on x [rows, in]: out, and LinearBackward saving x (and the weight).
    Ten linear(const Ten& x, const LinearP& p, int64_t rows, const char* name) {
        Scope scope(r_, name);
        Ten out = r_.fresh(rows * p.out * es_);
        gemm(rows * p.out, rows * p.in, p.out * p.in);
        auto node = std::make_shared<Node>();
        node->saved = {r_.save(x)};
        Node* self = node.get();
        const bool bias = p.bias.defined;
        node->apply = [this, self, rows, in = p.in, n = p.out, bias](const Ten& g) {
            return linear_backward(g, self->saved[0], rows, in, n, bias);
        };
        r_.record(node, out, {&x, &p.weight, &p.bias}, "LinearBackward");
        return out;
    }

    // linear_backward: dx = g @ weight; dweight = g^T @ x (x unpacked in its own scope); dbias.
    std::vector<Ten> linear_backward(const Ten&, const Saved& x, int64_t rows, int64_t in, int64_t n, bool bias) {
        Ten dx = r_.fresh(rows * in * es_);
        gemm(rows * in, rows * n, n * in);
        Ten dweight;
        {
            Buf xs = x.unpack(r_);
            dweight = r_.fresh(n * in * es_);
            gemm(n * in, rows * n, rows * in);
        }
        Ten dbias;
        if (bias) {
            dbias = r_.fresh(n * es_);
            column_sum(rows, n);
        }
        return {dx, dweight, dbias};
    }

    // linear_gelu (ops/matmul.cpp): h, then gelu(h) (on CUDA without a recipe both by one epilogue:
    // the same two allocations); saves x, h; gelu(h) gets a recipe with recompute_activation.
    Ten linear_gelu(const Ten& x, const LinearP& p, int64_t rows) {
        Scope scope(r_, "c_fc");
        const int64_t hidden = rows * p.out * es_;
        Ten h = r_.fresh(hidden), out;
        if (cuda_ && !c_.recompute_activation) {
            out = r_.fresh(hidden);
        } else {
            gemm(rows * p.out, rows * p.in, p.out * p.in);
            out = r_.fresh(hidden);  // detail::gelu_forward
        }
        auto node = std::make_shared<Node>();
        node->saved = {r_.save(x), r_.save(h)};
        Node* self = node.get();
        node->apply = [this, self, rows, in = p.in, n = p.out, hidden](const Ten&) {
            Buf hs = self->saved[1].unpack(r_);
            Ten dh = r_.fresh(hidden);  // detail::gelu_backward, alive through linear_backward
            return linear_backward(dh, self->saved[0], rows, in, n, true);
        };
        r_.record(node, out, {&x, &p.weight, &p.bias}, "LinearGeluBackward");
        if (c_.recompute_activation) r_.set_recipe(out, {&h}, hidden);
        return out;
    }

    // relu_squared and swiglu (ops/activation.cpp): out [rows, H] from h; saves h; out's recipe.
    Ten activation(const Ten& h, int64_t rows, const char* name) {
        const int64_t out_bytes = rows * H_ * es_, h_bytes = h.bytes;
        Ten out = r_.fresh(out_bytes);
        auto node = std::make_shared<Node>();
        node->saved = {r_.save(h)};
        Node* self = node.get();
        node->apply = [this, self, h_bytes](const Ten&) -> std::vector<Ten> {
            Buf hs = self->saved[0].unpack(r_);
            return {r_.fresh(h_bytes)};  // dh
        };
        r_.record(node, out, {&h}, name);
        if (c_.recompute_activation) r_.set_recipe(out, {&h}, out_bytes);
        return out;
    }

    // detail::norm_forward (ops/norm/norm.cpp) over M rows of N: y, x_hat (Normalized with an
    // affine), mean (LayerNorm), rstd; saves x (Input), y (Output, or Normalized without affine) or
    // x_hat, whose y gets the "norm affine" recipe.
    Ten norm(const Ten& x, const NormP& p, int64_t M, int64_t N) {
        const bool centered = p.kind == NormKind::Layer;
        const bool affine = p.weight.defined || p.bias.defined;
        const bool normalized = c_.policy == SavePolicy::Normalized && affine;
        Ten y = r_.fresh(M * N * es_);
        Ten x_hat = normalized ? r_.fresh(M * N * es_) : Ten();
        Ten mean = centered ? r_.fresh(M * ss_) : Ten();
        Ten rstd = r_.fresh(M * ss_);
        auto node = std::make_shared<Node>();
        if (normalized) node->saved = {r_.save(x_hat), r_.save(Ten()), r_.save(rstd)};
        else if (c_.policy == SavePolicy::Input) node->saved = {r_.save(x), r_.save(mean), r_.save(rstd)};
        else node->saved = {r_.save(y), r_.save(Ten()), r_.save(rstd)};
        Node* self = node.get();
        const bool has_w = p.weight.defined, has_b = p.bias.defined;
        node->apply = [this, self, M, N, has_w, has_b](const Ten&) -> std::vector<Ten> {
            Buf s = self->saved[0].unpack(r_), m = self->saved[1].unpack(r_), rs = self->saved[2].unpack(r_);
            Ten dx = r_.fresh(M * N * es_);
            Ten dw = has_w ? r_.fresh(N * es_) : Ten();
            Ten db = has_b ? r_.fresh(N * es_) : Ten();
            if (cuda_ && (has_w || has_b)) {  // per-block partial rows of dweight, dbias (f32; f64 for f64)
                const int64_t rows = norm_partial_rows(M), arrays = (has_w ? 1 : 0) + (has_b ? 1 : 0);
                r_.transient(arrays * rows * N * ss_ + column_sum_partials(rows, N, ss_, ss_ == 8, ss_));
            }
            return {dx, dw, db};
        };
        r_.record(node, y, {&x, &p.weight, &p.bias},
                  p.kind == NormKind::Layer ? "LayerNormBackward" : "RMSNormBackward");
        if (normalized) r_.set_recipe(y, {&x_hat, &p.weight, &p.bias}, M * N * es_);
        return y;
    }

    // Tensor::view: the same storage; ViewBackward returns the gradient's storage as it is.
    Ten view(const Ten& t) {
        Ten out;
        out.defined = true;
        out.buf = t.buf;
        out.bytes = t.bytes;
        out.parameter = t.parameter;
        auto node = std::make_shared<Node>();
        node->apply = [](const Ten& g) -> std::vector<Ten> { return {g}; };
        r_.record(node, out, {&t}, "ViewBackward");
        return out;
    }

    // rotary_embedding (ops/rotary.cpp): out; saves nothing; backward rotates into a new tensor.
    Ten rotary(const Ten& x) {
        Ten out = r_.fresh(x.bytes);
        auto node = std::make_shared<Node>();
        const int64_t bytes = x.bytes;
        node->apply = [this, bytes](const Ten&) -> std::vector<Ten> { return {r_.fresh(bytes)}; };
        r_.record(node, out, {&x}, "RotaryEmbeddingBackward");
        return out;
    }

    // Dropout::forward (ops/dropout.cpp): x itself at p = 0; else out, and a backward that draws
    // the mask again into a new tensor.
    Ten dropout(const Ten& x) {
        if (c_.dropout == 0) return x;
        Ten out = r_.fresh(x.bytes);
        auto node = std::make_shared<Node>();
        const int64_t bytes = x.bytes;
        node->apply = [this, bytes](const Ten&) -> std::vector<Ten> { return {r_.fresh(bytes)}; };
        r_.record(node, out, {&x}, "DropoutBackward");
        return out;
    }

    // add (ops/elementwise.cpp): out; AddBackward hands g to a, and to b when shapes are equal,
    // else b's broadcast sum (wpe's rows: b [T, C] over B rows).
    Ten add(const Ten& a, const Ten& b) {
        Ten out = r_.fresh(a.bytes);
        auto node = std::make_shared<Node>();
        const int64_t b_bytes = b.bytes, rows = a.bytes / b.bytes, n = b.bytes / es_;
        node->apply = [this, b_bytes, rows, n](const Ten& g) -> std::vector<Ten> {
            if (g.bytes == b_bytes) return {g, g};
            Ten db = r_.fresh(b_bytes);
            column_sum(rows, n);
            return {g, db};
        };
        r_.record(node, out, {&a, &b}, "AddBackward");
        return out;
    }

    // embedding (ops/embedding.cpp): out [E, C]; saves the ids (the batch); dweight [V, C].
    Ten embedding(const Ten& ids, const Ten& weight) {
        Ten out = r_.fresh(E_ * C_ * es_);
        auto node = std::make_shared<Node>();
        node->saved = {r_.save(ids)};
        node->apply = [this](const Ten&) -> std::vector<Ten> {
            Ten dweight = r_.fresh(V_ * C_ * es_);
            if (cuda_) {  // ops/embedding.cu: order, sorted, positions [E], offsets [V + 1] (i64), CUB's
                          // scratch (estimated: double buffers of keys and values, and its tile state)
                const int64_t n = E_;
                r_.transient(3 * n * 8 + (V_ + 1) * 8 + 16 * n + 4 * n + 65536);
            }
            return {Ten(), dweight};
        };
        r_.record(node, out, {&ids, &weight}, "EmbeddingBackward");
        return out;
    }

    // Tensor::narrow of wpe [block_size, C] to T rows: a view; NarrowBackward makes zeros of wpe's
    // shape and copies the gradient into them.
    Ten positions() {
        Ten out;
        out.defined = true;
        out.bytes = T_ * C_ * es_;
        out.parameter = true;
        auto node = std::make_shared<Node>();
        const int64_t bytes = wpe_.bytes;
        node->apply = [this, bytes](const Ten&) -> std::vector<Ten> { return {r_.fresh(bytes)}; };
        r_.record(node, out, {&wpe_}, "NarrowBackward");
        return out;
    }

    // The attention backward's own allocations, alive together (ops/attention.h): on CUDA our
    // kernels' row sums D [B, NH, T] acc_t, or cuDNN's row sums, dq accumulator and workspace.
    void attention_scratch(bool packed) {
        std::vector<Buf> held;
        for (int64_t n : detail::attention_backward_allocations(B_, T_, NH_, NKV_, hs_, packed, c_.dtype,
                                                                c_.dropout > 0, c_.device))
            held.push_back(r_.alloc(n));
    }

    // causal_self_attention on GPT-2's packed qkv: out [E, C] and lse [B, NH, T]; saves qkv, out,
    // lse; backward dqkv and the scratch above.
    Ten attention_packed(const Ten& qkv) {
        Ten out = r_.fresh(E_ * C_ * es_), lse = r_.fresh(B_ * NH_ * T_ * ss_);
        auto node = std::make_shared<Node>();
        node->saved = {r_.save(qkv), r_.save(out), r_.save(lse)};
        Node* self = node.get();
        node->apply = [this, self](const Ten&) -> std::vector<Ten> {
            Buf x = self->saved[0].unpack(r_), o = self->saved[1].unpack(r_), l = self->saved[2].unpack(r_);
            Ten dqkv = r_.fresh(3 * E_ * C_ * es_);
            attention_scratch(true);
            return {dqkv};
        };
        r_.record(node, out, {&qkv}, "CausalSelfAttentionBackward");
        return out;
    }

    // causal_attention (grouped): out [E, NH hs], lse; saves q, k, v, out, lse; dq, dk, dv and the
    // scratch above.
    Ten attention(const Ten& q, const Ten& k, const Ten& v) {
        Ten out = r_.fresh(E_ * NH_ * hs_ * es_), lse = r_.fresh(B_ * NH_ * T_ * ss_);
        auto node = std::make_shared<Node>();
        node->saved = {r_.save(q), r_.save(k), r_.save(v), r_.save(out), r_.save(lse)};
        Node* self = node.get();
        const int64_t qb = q.bytes, kb = k.bytes, vb = v.bytes;
        node->apply = [this, self, qb, kb, vb](const Ten&) -> std::vector<Ten> {
            Buf qs = self->saved[0].unpack(r_), ks = self->saved[1].unpack(r_), vs = self->saved[2].unpack(r_);
            Buf o = self->saved[3].unpack(r_), l = self->saved[4].unpack(r_);
            Ten dq = r_.fresh(qb), dk = r_.fresh(kb), dv = r_.fresh(vb);
            attention_scratch(false);
            return {dq, dk, dv};
        };
        r_.record(node, out, {&q, &k, &v}, "CausalAttentionBackward");
        return out;
    }

    // cross_entropy (ops/cross_entropy.cpp): lse [E], the loss; on CUDA the per-row terms [E];
    // saves logits, lse, targets; backward writes dlogits over the logits when nothing else holds
    // them (Note [Cross-entropy writes its gradient over its logits]).
    Ten cross_entropy(const Ten& logits, const Ten& targets) {
        Scope scope(r_, "cross_entropy");
        Ten lse = r_.fresh(E_ * ss_), loss = r_.fresh(es_);
        if (cuda_) r_.transient(E_ * ss_);
        auto node = std::make_shared<Node>();
        node->saved = {r_.save(logits), r_.save(lse), r_.save(targets)};
        Node* self = node.get();
        const int64_t bytes = logits.bytes;
        node->apply = [this, self, bytes](const Ten&) -> std::vector<Ten> {
            const Saved& l = self->saved[0];
            const bool in_place = !l.recipe && l.data && l.data.use_count() == 1;
            Ten dlogits;
            dlogits.defined = true;
            dlogits.bytes = bytes;
            Buf ls = l.unpack(r_), s = self->saved[1].unpack(r_), t = self->saved[2].unpack(r_);
            dlogits.buf = in_place ? ls : r_.alloc(bytes);
            return {dlogits, Ten()};
        };
        r_.record(node, loss, {&logits, &targets}, "CrossEntropyBackward");
        return loss;
    }

    // checkpoint(fn, x) (core/activation_checkpoint.cpp): x saved by the frame; fn's saves dropped.
    Ten checkpoint(std::function<Ten(const Ten&)> fn, const Ten& x, const std::string& where) {
        auto frame = std::make_shared<Frame>();
        frame->input = r_.save(x);
        frame->input_bytes = x.bytes;
        frame->where = where;
        r_.save_scopes.push_back({frame.get(), false});
        Ten out = fn(x);
        r_.save_scopes.pop_back();
        frame->fn = std::move(fn);
        return out;
    }

    // CausalSelfAttention::forward (no cache).
    Ten attn(const Ten& x, const BlockP& p) {
        Scope scope(r_, "attn");
        Ten y;
        if (!c_.separate_qkv()) {
            Ten qkv = linear(x, p.c_attn, E_, "c_attn");
            y = attention_packed(qkv);
        } else {
            Ten q = view(linear(x, p.c_q, E_, "c_q"));
            Ten k = view(linear(x, p.c_k, E_, "c_k"));
            Ten v = view(linear(x, p.c_v, E_, "c_v"));
            if (c_.pos_embedding == PosEmbedding::Rotary) {
                q = rotary(q);
                k = rotary(k);
            }
            if (c_.qk_norm) {
                q = norm(q, p.q_norm, E_ * NH_, hs_);
                k = norm(k, p.k_norm, E_ * NKV_, hs_);
            }
            y = attention(q, k, v);
            y = view(y);
        }
        return dropout(linear(y, p.attn_proj, E_, "c_proj"));
    }

    // MLP::forward.
    Ten mlp(const Ten& x, const BlockP& p) {
        Scope scope(r_, "mlp");
        Ten hidden;
        if (c_.mlp == MLPKind::GELU)
            hidden = linear_gelu(x, p.c_fc, E_);
        else if (c_.mlp == MLPKind::ReLU2)
            hidden = activation(linear(x, p.c_fc, E_, "c_fc"), E_, "ReluSquaredBackward");
        else
            hidden = activation(linear(x, p.c_fc, E_, "c_fc"), E_, "SwigluBackward");
        return dropout(linear(hidden, p.mlp_proj, E_, "c_proj"));
    }

    // Block::forward: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), temporaries alive to the end of
    // each statement.
    Ten block(Ten x, size_t i) {
        Scope scope(r_, "h." + std::to_string(i));
        const BlockP& p = blocks_[i];
        x = add(x, attn(norm(x, p.ln_1, E_, C_), p));
        x = add(x, mlp(norm(x, p.ln_2, E_, C_), p));
        return x;
    }

    // GPT::embed.
    Ten embed(const Ten& idx) {
        Ten x = embedding(idx, wte_);
        if (wpe_.defined) x = add(x, positions());
        x = dropout(x);
        return c_.embedding_norm ? norm(x, emb_norm_, E_, C_) : x;
    }

    // GPT::forward up to ln_f: the embedding and the blocks (checkpointed where checkpoint_every says).
    Ten body(const Ten& idx) {
        Ten x = embed(idx);
        for (size_t i = 0; i < blocks_.size(); ++i) {
            if (c_.checkpoint_blocks && static_cast<int64_t>(i) % c_.checkpoint_every == 0)
                x = checkpoint([this, i](const Ten& in) { return block(in, i); }, x, "h." + std::to_string(i));
            else
                x = block(std::move(x), i);
        }
        return x;
    }

    // GPT::forward: head(x) = lm_head(ln_f(x)), with x alive until forward returns.
    Ten forward(const Ten& idx) {
        Ten x = body(idx);
        Scope scope(r_, "head");
        return linear(norm(x, ln_f_, E_, C_), lm_head_, E_, "lm_head");
    }

    // GPT::loss under fused_head_loss: ln_f of the blocks' output (freed once ln_f has read it),
    // then linear_cross_entropy (ops/linear_cross_entropy.cpp). Forward: lse [E] and the 0-dim
    // loss; then the [E] row losses and one [rows, V] chunk buffer, each chunk's logits made into
    // it (on the cpu in bf16 through its product's f32 copies), the buffer dropped before the row
    // losses. Saves ln_f's output, the weight (resident), lse and the targets. Backward: the saved
    // input unpacked (made again under Normalized), dx [E, C], dweight's accumulator [V, C] of the
    // stat dtype (dweight itself unless bf16), one chunk buffer, and per chunk its logits again,
    // dx's rows and dweight's sum (cpu bf16: each product's f32 copies); the buffer goes, then a
    // bf16 dweight is rounded from the accumulator, which goes on return.
    Ten fused_loss(const Ten& idx, const Ten& targets) {
        Ten y;
        {
            Ten x = body(idx);
            Scope scope(r_, "head");
            y = norm(x, ln_f_, E_, C_);
        }
        Scope scope(r_, "lm_head");
        const int64_t rows = linear_cross_entropy_chunk_rows(E_, V_, C_);
        Ten lse = r_.fresh(E_ * ss_), loss = r_.fresh(es_);
        {
            Buf row_losses = r_.alloc(E_ * ss_);
            Buf chunk = r_.alloc(std::min(rows, E_) * V_ * es_);
            for (int64_t r0 = 0; r0 < E_; r0 += rows) {
                const int64_t n = std::min(rows, E_ - r0);
                gemm(n * V_, n * C_, V_ * C_);
            }
        }
        auto node = std::make_shared<Node>();
        node->saved = {r_.save(y), r_.save(lse), r_.save(targets)};
        Node* self = node.get();
        node->apply = [this, self, rows](const Ten&) -> std::vector<Ten> {
            Buf xs = self->saved[0].unpack(r_), s = self->saved[1].unpack(r_), t = self->saved[2].unpack(r_);
            Ten dx = r_.fresh(E_ * C_ * es_), accumulator = r_.fresh(V_ * C_ * ss_);
            {
                Buf chunk = r_.alloc(std::min(rows, E_) * V_ * es_);
                for (int64_t r0 = 0; r0 < E_; r0 += rows) {
                    const int64_t n = std::min(rows, E_ - r0);
                    gemm(n * V_, n * C_, V_ * C_);  // the chunk's logits again
                    gemm(n * C_, n * V_, V_ * C_);  // dx[chunk] = dz @ weight
                    if (!cuda_ && c_.dtype == DType::BF16) {  // dweight += dz^T @ x[chunk], on f32 copies
                        Buf x32 = r_.alloc(n * C_ * 4), dz32 = r_.alloc(n * V_ * 4);
                    }
                }
            }
            if (c_.dtype != DType::BF16) return {dx, accumulator, Ten()};
            Ten dweight = r_.fresh(V_ * C_ * es_);
            return {dx, dweight, Ten()};
        };
        r_.record(node, loss, {&y, &lm_head_.weight, &targets}, "LinearCrossEntropyBackward");
        return loss;
    }

    Replay& r_;
    const GPTConfig& c_;
    const bool cuda_;
    const int64_t B_, T_, E_, C_, NH_, NKV_, hs_, H_, V_, es_, ss_;
    Ten wte_, wpe_;
    NormP emb_norm_, ln_f_;
    std::vector<BlockP> blocks_;
    LinearP lm_head_;
};

// AdamW's device table of the multi-tensor CUDA step (nn/optim/adamw.cpp build_table), built by the
// first step and kept: per parameter an AdamWTensor (4 pointers, numel, weight decay, lr scale:
// 56 bytes), per 65536-element chunk 8 bytes, one more i64; one table for the one dtype.
int64_t adamw_table_bytes(const std::vector<int64_t>& numels) {
    int64_t chunks = 0;
    for (int64_t n : numels) chunks += (n + 65535) / 65536;
    return 8 * ((static_cast<int64_t>(numels.size()) * 56 + chunks * 8) / 8 + 1);
}

}  // namespace

GPTConfig with_settings(GPTConfig config, const MemorySettings& s) {
    NT_CHECK(s.checkpoint_every >= 0, "with_settings: expected checkpoint_every >= 0 (0: no block checkpointed), got ",
             s.checkpoint_every);
    NT_CHECK(s.micro_batch >= 0, "with_settings: expected micro_batch >= 0 (0: the whole batch), got ", s.micro_batch);
    config.policy = s.policy;
    config.recompute_activation = s.recompute_activation;
    config.fused_head_loss = s.fused_head_loss;
    config.checkpoint_blocks = s.checkpoint_every > 0;
    config.checkpoint_every = s.checkpoint_every > 0 ? s.checkpoint_every : 1;
    config.offload = s.offload;
    return config;
}

void detail::check_step_settings(const char* op, const GPTConfig& config, const MemorySettings& s, int64_t B,
                                 int64_t T) {
    NT_CHECK(s.checkpoint_every >= 0, op, ": expected checkpoint_every >= 0 (0: no block checkpointed), got ",
             s.checkpoint_every);
    NT_CHECK(s.micro_batch >= 0, op, ": expected micro_batch 0 (the whole batch) or a divisor of B, got ",
             s.micro_batch);
    detail::check_step_shape(op, with_settings(config, s), B, T);
    NT_CHECK(s.micro_batch <= B && (s.micro_batch == 0 || B % s.micro_batch == 0), op,
             ": expected micro_batch 0 (the whole batch) or a divisor of B = ", B, ", got ", s.micro_batch);
    NT_CHECK(s.world_size >= 1 && s.rank >= 0 && s.rank < s.world_size, op, ": expected world_size >= 1 and "
             "a rank in [0, world_size), got world_size ", s.world_size, " and rank ", s.rank);
    NT_CHECK(!s.shard_optimizer_state || s.world_size > 1, op,
             ": expected shard_optimizer_state with world_size > 1 (there is nothing to shard across), got "
             "world_size 1");
    NT_CHECK(s.bucket_cap_bytes >= 1, op, ": expected bucket_cap_bytes >= 1, got ", s.bucket_cap_bytes);
    // A rank's buckets hold world_size parts, and a part of Muon's is a whole matrix.
    const int64_t parameters = num_parameters(config);
    NT_CHECK_AS(ShapeError, double(s.world_size) * double(parameters) * 8.0 <= 0x1p60, op,
                ": expected world_size * num_parameters * 8 bytes (a bound of the gradient buckets) to fit in 2^60 "
                "bytes, got world_size ", s.world_size, " and ", parameters, " parameters");
}

namespace {

// step_memory's replay, for a config with the settings' fields set and sizes checked.
StepMemory replay_step(const GPTConfig& c, const MemorySettings& s, int64_t B, int64_t T) {
    const int64_t rows = s.micro_batch > 0 ? s.micro_batch : B, n_micro = B / rows;
    const int64_t ss = static_cast<int64_t>(element_size(stat_dtype(c.dtype)));

    // The parameters' sizes and which are Muon's, from the replay's own list of them.
    const bool muon = s.optimizer == StepOptimizer::Muon;
    std::vector<int64_t> numels, adamw_numels;
    std::vector<std::pair<int64_t, int64_t>> block_matrix;
    {
        Replay sizes(0);
        GptReplay model(sizes, c, rows, T);
        for (int64_t bytes : sizes.gradient_bytes)
            numels.push_back(bytes / static_cast<int64_t>(element_size(c.dtype)));
        block_matrix = sizes.block_matrix;
    }
    // Muon's classes (Note [Muon on CUDA], nn/optim/muon.cu): [rows, cols] and count, in order of first appearance.
    std::vector<std::pair<std::pair<int64_t, int64_t>, int64_t>> classes;
    StepMemory plan;
    int64_t elements = 0;
    for (size_t k = 0; k < numels.size(); ++k) {
        elements += numels[k];
        if (!muon || block_matrix[k].first == 0) {
            adamw_numels.push_back(numels[k]);
            plan.adamw_moments += 2 * ss * numels[k];
            continue;
        }
        plan.muon_momentum += ss * numels[k];
        auto it = std::find_if(classes.begin(), classes.end(), [&](const auto& e) { return e.first == block_matrix[k]; });
        if (it == classes.end()) classes.push_back({block_matrix[k], 1});
        else ++it->second;
    }
    const int64_t es = static_cast<int64_t>(element_size(c.dtype));
    plan.parameters = elements * es;
    plan.gradients = plan.parameters;
    int64_t stepped = elements;  // the elements the optimizers update on this rank
    if (s.world_size > 1) {      // nn/parallel/data_parallel.h: the buckets, and under ZeRO-1 this rank's shards
        std::vector<BucketParam> params;
        for (size_t k = 0; k < numels.size(); ++k) {
            const bool matrix = muon && block_matrix[k].first != 0;
            params.push_back({numels[k], matrix, block_matrix[k].first, block_matrix[k].second});
        }
        const std::vector<BucketPlan> buckets = plan_buckets(params, es, s.world_size, s.bucket_cap_bytes);
        for (const BucketPlan& b : buckets) plan.data_parallel += s.world_size * b.part * es;
        if (s.shard_optimizer_state) {
            plan.adamw_moments = plan.muon_momentum = 0;
            adamw_numels.clear();
            classes.clear();
            stepped = 0;
            for (const ShardPlan& sp : plan_shards(buckets, params, s.rank)) {
                stepped += sp.numel;
                if (!params[sp.param].matrix) {
                    adamw_numels.push_back(sp.numel);
                    plan.adamw_moments += 2 * ss * sp.numel;
                    continue;
                }
                plan.muon_momentum += ss * sp.numel;
                const std::pair<int64_t, int64_t> shape = block_matrix[sp.param];
                auto it = std::find_if(classes.begin(), classes.end(), [&](const auto& e) { return e.first == shape; });
                if (it == classes.end()) classes.push_back({shape, 1});
                else ++it->second;
            }
            plan.data_parallel += stepped * es;
        }
    }
    plan.optimizer_state = plan.adamw_moments + plan.muon_momentum + (c.dtype == DType::BF16 ? 4 * stepped : 0);
    if (c.device.is_cuda()) plan.optimizer_state += adamw_table_bytes(adamw_numels);
    plan.batch = 2 * B * T * 8;

    Replay r(plan.parameters + plan.optimizer_state + plan.batch + plan.data_parallel);
    r.allocations = &plan.allocations;
    {
        GptReplay model(r, c, rows, T);
        // The first micro-batch makes the gradients; a later one finds them all (the third and on
        // repeat the second).
        // Each micro-batch's loss, detached, is kept until the step ends (train_gpt reads them then):
        // one 0-dim tensor each, the later ones' as the second's.
        std::vector<Buf> losses;
        const int64_t model_loss_bytes = static_cast<int64_t>(element_size(c.dtype));
        for (int64_t k = 0; k < std::min<int64_t>(n_micro, 2); ++k) {
            const std::string which = n_micro == 1 ? ""
                                      : k == 0     ? " of the first micro-batch"
                                                   : " of a later micro-batch";
            r.phase = "forward" + which;
            // The later micro-batch stands for the last: the losses of those between are kept too.
            if (k == 1 && n_micro > 2) losses.push_back(r.alloc((n_micro - 2) * model_loss_bytes));
            Ten loss = model.loss(model.batch(n_micro > 1), model.batch(n_micro > 1));
            r.phase = "backward" + which;
            // Under offload on CUDA the saved ids and targets (resident on the device anyway) come
            // back as copies, the ids maybe prefetched early: a bound holds both through the backward.
            Buf copies = c.offload && c.device.is_cuda() ? r.alloc(2 * rows * T * 8) : nullptr;
            if (n_micro > 1) r.backward(model.scale(loss));
            else r.backward(loss);
            losses.push_back(loss.buf);
        }
        // clip_grad_norm_tensor_: the norm, 0-dim f64 (on CUDA after its partial sums, one f64 per
        // 65536-element chunk of every gradient, and the clip coefficient); AdamW::step allocates
        // nothing; on CUDA Muon::step takes each class's scratch in turn (on the cpu Eigen's heap,
        // not the allocator's); zero_grad drops the gradients.
        r.phase = "optimizer";
        if (c.device.is_cuda()) {
            int64_t chunks = 0;
            for (int64_t n : numels) chunks += (n + 65535) / 65536;
            Buf partial = r.alloc((chunks + 1) * 8);
            Buf norm = r.alloc(8);
            partial.reset();
            for (const auto& [shape, count] : classes) {
                std::vector<Buf> scratch;
                for (int64_t bytes : muon_scratch_bytes(c.dtype, count, shape.first, shape.second))
                    scratch.push_back(r.alloc(bytes));
            }
            r.gradients.clear();
        } else {
            Buf norm = r.alloc(8);
            r.gradients.clear();
        }
    }
    plan.peak = r.peak();
    plan.peak_at = r.peak_at();
    return plan;
}

// The replay's host memory per layer, a bound: about 9 KB were measured (the nodes, their saved
// tensors and closures, the allocation trace) on a small gpt2 config.
constexpr int64_t kReplayBytesPerLayer = 16 << 10;

// step_memory, naming `op` in its errors: the checks, then the replay if the host can hold it.
StepMemory checked_replay(const char* op, const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T) {
    detail::check_step_settings(op, config, s, B, T);
    const double need = double(config.n_layer) * double(kReplayBytesPerLayer);
    const int64_t available = memory_available_bytes(Device::CPU);
    NT_CHECK_AS(OutOfMemoryError, need <= double(available), op, ": the replay of a step of ", config.n_layer,
                " layers needs about ", need, " bytes of host memory, more than the ", available, " available");
    try {
        return replay_step(with_settings(config, s), s, B, T);
    } catch (const std::bad_alloc&) {
        detail::throw_error<OutOfMemoryError>(op, ": the replay of a step of ", config.n_layer,
                                              " layers needs more host memory than this process can allocate");
    }
}

}  // namespace

StepMemory step_memory(const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T) {
    return checked_replay("step_memory", config, s, B, T);
}

int64_t predict_peak(const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T) {
    return checked_replay("predict_peak", config, s, B, T).peak;
}

int64_t predicted_checkpoint_every_saved_bytes(const GPTConfig& config, int64_t B, int64_t T) {
    detail::check_step_shape("predicted_checkpoint_every_saved_bytes", config, B, T);
    GPTConfig c = config;
    c.checkpoint_blocks = false;
    const int64_t full = predicted_saved_bytes(c, B, T);
    if (!config.checkpoint_blocks) return full;
    const int64_t layer = detail::layer_saved_bytes(c, B, T);
    const int64_t x = B * T * c.n_embd * static_cast<int64_t>(element_size(c.dtype));
    const int64_t checkpointed = c.n_layer / config.checkpoint_every + (c.n_layer % config.checkpoint_every != 0);
    const bool first_input_saved = c.embedding_norm && c.policy != SavePolicy::Input;
    return full - checkpointed * (layer - x) - (first_input_saved ? x : 0);
}

}  // namespace normtape
