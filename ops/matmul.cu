// ops/matmul.cu: matrix products through cuBLAS (cublasGemmEx), and through cuBLASLt where an
// epilogue (bias, bias + GELU) saves a pass over the output, and for strided batches whose output
// is apart from the matrix they add (Muon's Newton-Schulz products). The bias row add used
// without cuBLASLt is add_bias_rows_cuda, in ops/elementwise.cu.
#include <array>
#include <map>
#include <memory>
#include <optional>
#include <type_traits>

#include "core/cuda_allocator.h"
#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

// Row-major out = op(a) @ op(b) (+ out, with accumulate) is column-major out^T = op(b)^T @ op(a)^T:
// a row-major matrix is its transpose in column-major order, so the operands swap and keep their
// own transposition. out is T, or acc_t<T> (O) for a product accumulated at the product's precision.
template <class T, class O>
void gemm_any(O* out, const T* a, int64_t a_rows, int64_t a_cols, bool trans_a, const T* b, int64_t b_rows,
              int64_t b_cols, bool trans_b, bool accumulate, int device) {
    int64_t M = trans_a ? a_cols : a_rows, K = trans_a ? a_rows : a_cols;
    int64_t N = trans_b ? b_rows : b_cols;
    NT_CHECK_AS(ShapeError, (trans_b ? b_cols : b_rows) == K, "matmul: expected equal inner dimensions, got ", K,
                " and ", trans_b ? b_cols : b_rows);
    NT_CHECK_AS(ShapeError, M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX, "matmul: expected sizes <= ", INT32_MAX,
                " (cuBLAS's int), got M ", M, ", N ", N, ", K ", K);
    if (M == 0 || N == 0) return;
    using A = acc_t<T>;
    A alpha = 1, beta = accumulate ? 1 : 0;
    cublasComputeType_t compute = std::is_same_v<T, double> ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmEx(cuda::cublas(device), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                              static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, b, cuda_type<T>(),
                              static_cast<int>(b_cols), a, cuda_type<T>(), static_cast<int>(a_cols), &beta, out,
                              cuda_type<O>(), static_cast<int>(N), compute, CUBLAS_GEMM_DEFAULT));
    // cuBLAS writes all of out when K > 0 (with accumulate, out was written before).
    if (!accumulate && K > 0) cuda_mark_written(device, out, M * N * int64_t(sizeof(O)));
}

}  // namespace

template <class T>
void gemm_cuda(T* out, const T* a, int64_t a_rows, int64_t a_cols, bool trans_a, const T* b, int64_t b_rows,
               int64_t b_cols, bool trans_b, int device) {
    gemm_any(out, a, a_rows, a_cols, trans_a, b, b_rows, b_cols, trans_b, false, device);
}

template <class T>
void gemm_accumulate_cuda(acc_t<T>* out, const T* a, int64_t a_rows, int64_t a_cols, bool trans_a, const T* b,
                          int64_t b_rows, int64_t b_cols, bool trans_b, int device) {
    gemm_any(out, a, a_rows, a_cols, trans_a, b, b_rows, b_cols, trans_b, true, device);
}

namespace {

// The largest power of two, up to 256, that divides p's address: what cuBLASLt's heuristic may
// assume of each operand (its default assumes 256).
int64_t alignment(const void* p) {
    auto v = reinterpret_cast<uintptr_t>(p);
    int64_t a = 256;
    while (a > 1 && v % a != 0) a /= 2;
    return a;
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
    switch (e) {
        case GemmEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
        case GemmEpilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    }
    return CUBLASLT_EPILOGUE_DEFAULT;
}

// Owners of cuBLASLt's descriptors, destroyed on every path out of gemm_epilogue_cuda.
struct LtDesc {
    cublasLtMatmulDesc_t d = nullptr;
    ~LtDesc() { if (d) cublasLtMatmulDescDestroy(d); }
};
struct LtLayout {
    cublasLtMatrixLayout_t l = nullptr;
    ~LtLayout() { if (l) cublasLtMatrixLayoutDestroy(l); }
};
struct LtPreference {
    cublasLtMatmulPreference_t p = nullptr;
    ~LtPreference() { if (p) cublasLtMatmulPreferenceDestroy(p); }
};

template <class V>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

// The heuristic's first choice for each problem (sizes, transpositions, dtype, epilogue, operand
// alignments and device), or none; asked once per problem: asking costs more host time than a
// small product takes on the GPU.
using LtKey = std::array<int64_t, 13>;
std::map<LtKey, std::optional<cublasLtMatmulAlgo_t>>& lt_algorithms() {
    static std::map<LtKey, std::optional<cublasLtMatmulAlgo_t>> m;
    return m;
}

}  // namespace

template <class T>
bool gemm_epilogue_cuda(T* out, const T* a, int64_t a_rows, int64_t a_cols, bool trans_a, const T* b, int64_t b_rows,
                        int64_t b_cols, bool trans_b, GemmEpilogue epilogue, T* bias, T* aux, int device) {
    if constexpr (std::is_same_v<T, double>) {
        return false;
    } else {
        int64_t M = trans_a ? a_cols : a_rows, K = trans_a ? a_rows : a_cols;
        int64_t N = trans_b ? b_rows : b_cols;
        if (M == 0 || N == 0 || K == 0) return false;
        if (epilogue == GemmEpilogue::GeluAuxBias && N % 8 != 0) return false;  // cuBLASLt's aux leading dimension
        const cudaDataType_t type = cuda_type<T>();
        const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        LtDesc desc;
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        set(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
        set(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
        set(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(epilogue));
        set(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(bias));
        if (aux) {
            set(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(aux));
            set(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, N);
        }
        // Column-major, as gemm_cuda: cuBLAS's A is b, its B is a, its D is out^T [N, M].
        LtLayout la, lb, ld;
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la.l, type, b_cols, b_rows, b_cols));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb.l, type, a_cols, a_rows, a_cols));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld.l, type, N, M, N));
        const LtKey key = {M, N, K, trans_a, trans_b, static_cast<int64_t>(type), static_cast<int64_t>(epilogue),
                           alignment(a), alignment(b), alignment(out), alignment(bias), alignment(aux), device};
        auto found = lt_algorithms().find(key);
        if (found == lt_algorithms().end()) {
            LtPreference pref;
            CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
            const uint64_t bytes = cuda::kWorkspaceBytes;
            const uint32_t align_a = uint32_t(alignment(b)), align_b = uint32_t(alignment(a)), align_d = uint32_t(alignment(out));
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)));
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
            CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
            cublasLtMatmulHeuristicResult_t result{};
            int count = 0;
            cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cuda::cublaslt(device), desc.d, la.l, lb.l, ld.l, ld.l,
                                                               pref.p, 1, &result, &count);
            std::optional<cublasLtMatmulAlgo_t> algo;
            if (st == CUBLAS_STATUS_SUCCESS && count > 0) algo = result.algo;
            else NT_CHECK(st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_SUPPORTED, "cuBLASLt error: ",
                          cublasGetStatusString(st), " in cublasLtMatmulAlgoGetHeuristic");
            found = lt_algorithms().emplace(key, algo).first;
        }
        if (!found->second) return false;
        const float alpha = 1, beta = 0;
        CUBLAS_CHECK(cublasLtMatmul(cuda::cublaslt(device), desc.d, &alpha, b, la.l, a, lb.l, &beta, out, ld.l, out,
                                    ld.l, &*found->second, cuda::workspace(device), cuda::kWorkspaceBytes,
                                    cuda::stream(device)));
        cuda_mark_written(device, out, M * N * int64_t(sizeof(T)));
        if (epilogue == GemmEpilogue::GeluAuxBias) cuda_mark_written(device, aux, M * N * int64_t(sizeof(T)));
        return true;
    }
}

namespace {

// The largest power of two, up to 256, dividing both p's address and a batch's stride in bytes.
int64_t alignment(const void* p, int64_t stride_bytes) {
    int64_t a = alignment(p);
    while (a > 1 && stride_bytes % a != 0) a /= 2;
    return a;
}

// One problem's descriptors and algorithm; destroyed with the process's cache.
struct LtProblem {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    ~LtProblem() {
        if (desc) cublasLtMatmulDescDestroy(desc);
        for (cublasLtMatrixLayout_t l : {a, b, c})
            if (l) cublasLtMatrixLayoutDestroy(l);
    }
};

cublasLtMatrixLayout_t batched_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                                      int64_t count) {
    cublasLtMatrixLayout_t l = nullptr;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, uint64_t(rows), uint64_t(cols), ld));
    const int32_t batch = static_cast<int32_t>(count);
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    return l;
}

}  // namespace

template <class X>
void gemm_strided_batched_cuda(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const X* a,
                               int64_t lda, int64_t stride_a, const X* b, int64_t ldb, int64_t stride_b, double beta,
                               const X* c, X* d, int64_t ldc, int64_t stride_c, int64_t count, int device) {
    constexpr bool f64 = std::is_same_v<X, double>;
    using S = std::conditional_t<f64, double, float>;
    const int64_t align_a = alignment(a, stride_a * int64_t(sizeof(X))),
                  align_b = alignment(b, stride_b * int64_t(sizeof(X))),
                  align_c = std::min(alignment(c, stride_c * int64_t(sizeof(X))), alignment(d, stride_c * int64_t(sizeof(X))));
    using Key = std::array<int64_t, 17>;
    static std::map<Key, std::unique_ptr<LtProblem>> problems;
    const Key key = {device, f64, trans_a, trans_b, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, count,
                     align_a, align_b, align_c};
    auto found = problems.find(key);
    if (found == problems.end()) {
        auto p = std::make_unique<LtProblem>();
        const cudaDataType_t type = cuda_type<X>();
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
                                              f64 ? CUDA_R_64F : CUDA_R_32F));
        const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
        p->a = trans_a ? batched_layout(type, k, m, lda, stride_a, count) : batched_layout(type, m, k, lda, stride_a, count);
        p->b = trans_b ? batched_layout(type, n, k, ldb, stride_b, count) : batched_layout(type, k, n, ldb, stride_b, count);
        p->c = batched_layout(type, m, n, ldc, stride_c, count);
        cublasLtMatmulPreference_t pref = nullptr;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        const uint64_t bytes = cuda::kWorkspaceBytes;
        const uint32_t aligns[3] = {uint32_t(align_a), uint32_t(align_b), uint32_t(align_c)};
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aligns[0], 4));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &aligns[1], 4));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &aligns[2], 4));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &aligns[2], 4));
        cublasLtMatmulHeuristicResult_t result{};
        int found_count = 0;
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cuda::cublaslt(device), p->desc, p->a, p->b, p->c,
                                                                 p->c, pref, 1, &result, &found_count);
        cublasLtMatmulPreferenceDestroy(pref);
        NT_CHECK(st == CUBLAS_STATUS_SUCCESS && found_count > 0, "gemm_strided_batched: cuBLASLt has no algorithm for ",
                 count, " products [", m, ", ", k, "] x [", k, ", ", n, "] (", cublasGetStatusString(st), ")");
        p->algo = result.algo;
        found = problems.emplace(key, std::move(p)).first;
    }
    const LtProblem& p = *found->second;
    const S al = static_cast<S>(alpha), be = static_cast<S>(beta);
    CUBLAS_CHECK(cublasLtMatmul(cuda::cublaslt(device), p.desc, &al, a, p.a, b, p.b, &be, c, p.c, d, p.c, &p.algo,
                                cuda::workspace(device), cuda::kWorkspaceBytes, cuda::stream(device)));
    // Each product's m x n output, where its columns are contiguous (ldc == m, as Muon's are; with
    // gaps between columns nothing is marked, since cuBLAS does not write the gaps).
    if (k > 0 && m > 0 && ldc == m)
        cuda_mark_written(device, d, m * n * int64_t(sizeof(X)), count, stride_c * int64_t(sizeof(X)));
}

#define NT_INSTANTIATE(T)                                                                                           \
    template void gemm_cuda<T>(T*, const T*, int64_t, int64_t, bool, const T*, int64_t, int64_t, bool, int);        \
    template void gemm_accumulate_cuda<T>(acc_t<T>*, const T*, int64_t, int64_t, bool, const T*, int64_t, int64_t,  \
                                          bool, int);                                                                \
    template bool gemm_epilogue_cuda<T>(T*, const T*, int64_t, int64_t, bool, const T*, int64_t, int64_t, bool,     \
                                        GemmEpilogue, T*, T*, int);                                                  \
    template void gemm_strided_batched_cuda<T>(bool, bool, int64_t, int64_t, int64_t, double, const T*, int64_t,   \
                                               int64_t, const T*, int64_t, int64_t, double, const T*, T*, int64_t,  \
                                               int64_t, int64_t, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
