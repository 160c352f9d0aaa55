// The C API of avex_prune.h: argument checks, then launches.
//
// Built two ways from this one file. The library (libavex_prune) launches the kernels below on
// the caller's stream. The host-simulation build (-DAVEX_HOST_SIMULATION, libavex_prune_hostsim)
// runs the same kernel bodies thread by thread on the CPU, on host pointers; it exists so that
// the tests check the algorithms on machines without a GPU.
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "compact.cuh"
#include "include/avex_prune.h"
#include "topk.cuh"

namespace {

thread_local char g_message[768];

avex_status fail(avex_status status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(g_message, sizeof g_message, format, args);
    va_end(args);
    return status;
}

#define AVEX_TRY(expr)                                   \
    do {                                                 \
        const avex_status status_ = (expr);              \
        if (status_ != AVEX_SUCCESS) return status_;     \
    } while (0)

avex_status check_size(const char *fn, const char *name, int64_t value) {
    if (value < 0) {
        return fail(AVEX_ERROR_INVALID_SIZE, "%s: %s must be >= 0, got %lld", fn, name,
                    static_cast<long long>(value));
    }
    return AVEX_SUCCESS;
}

// A pointer may be NULL only when its array is empty.
avex_status check_pointer(const char *fn, const char *name, const void *pointer, int64_t count) {
    if (pointer == nullptr && count > 0) {
        return fail(AVEX_ERROR_NULL_POINTER, "%s: %s is NULL, but it must hold %lld elements",
                    fn, name, static_cast<long long>(count));
    }
    return AVEX_SUCCESS;
}

// a * b for sizes already checked >= 0, with a limit on the product.
avex_status checked_product(const char *fn, const char *what, int64_t a, int64_t b,
                            int64_t limit, int64_t *product) {
    if (a != 0 && b > limit / a) {
        return fail(AVEX_ERROR_INVALID_SIZE, "%s: %s = %lld * %lld exceeds %lld", fn, what,
                    static_cast<long long>(a), static_cast<long long>(b),
                    static_cast<long long>(limit));
    }
    *product = a * b;
    return AVEX_SUCCESS;
}

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

int64_t next_power_of_2(int64_t n) {
    int64_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

const char *describe(const avex::DeviceError &e, avex_status *status) {
    const auto row = static_cast<long long>(e.row), value = static_cast<long long>(e.value),
               limit = static_cast<long long>(e.limit);
    switch (e.kind) {
    case avex::kRowLength:
        *status = AVEX_ERROR_INVALID_VALUE;
        fail(*status, "avex_topk_rows: lengths[%lld] = %lld, outside [0, width = %lld]", row,
             value, limit);
        break;
    case avex::kRowK:
        *status = AVEX_ERROR_K_OUT_OF_RANGE;
        fail(*status, "avex_topk_rows: k[%lld] = %lld, outside [1, %lld] (the row's selectable "
             "tokens: positions < length with a score > -inf; and at most kmax)", row, value,
             limit);
        break;
    case avex::kTotalTokens:
        *status = AVEX_ERROR_CAPACITY;
        fail(*status, "avex_compact_varlen: the keep-sets hold %lld tokens, more than "
             "capacity = %lld", value, limit);
        break;
    case avex::kLongestSet:
        *status = AVEX_ERROR_CAPACITY;
        fail(*status, "avex_compact_padded: the longest keep-set holds %lld tokens, more than "
             "padded_width = %lld", value, limit);
        break;
    case avex::kChosenIndex:
        *status = AVEX_ERROR_K_OUT_OF_RANGE;
        fail(*status, "avex_mark_kept: row %lld chooses column %lld, outside [-1, width = %lld)",
             row, value, limit);
        break;
    case avex::kTokenIndex:
        *status = AVEX_ERROR_INVALID_VALUE;
        fail(*status, "avex_mark_kept: row %lld maps a chosen column to position %lld, outside "
             "[0, seq_len = %lld)", row, value, limit);
        break;
    default:
        *status = AVEX_ERROR_UNSUPPORTED;
        fail(*status, "a kernel recorded an unknown error kind %llu", e.kind);
    }
    return g_message;
}

// What scan_lengths checks the kept tokens against: the varlen output's rows, or the padded
// width per sequence (the other limit unbounded).
int64_t total_limit(const avex::PlanLayout &layout) {
    return layout.padded ? kInt64Max : layout.capacity;
}
int64_t row_limit(const avex::PlanLayout &layout) {
    return layout.padded ? layout.padded_width : kInt64Max;
}

struct TopkArgs {
    const float *scores;
    int64_t batch, width;
    const int64_t *lengths, *k;
    int64_t kmax;
    float tau;
    int64_t *indices;
    int64_t sorted_width;
    int threads;
};

struct MarkArgs {
    const int64_t *indices;
    int64_t batch, kmax, width;
    const int64_t *token_index;
    uint8_t *keep;
    int64_t seq_len;
};

struct CompactArgs {
    const char *fn;
    const void *hidden;
    int64_t element_size, batch, seq_len, hidden_size;
    const uint8_t *keep;
    int64_t num_sets, num_seqs;
    avex::PlanLayout layout;
    int64_t out_rows;
    void *out_hidden;
    int64_t *position_ids, *index;
    int32_t *cu_seqlens, *max_seqlen;
    int64_t *attention_mask;
};

// ---------------------------------------------------------------------------------------------
// Launches: CUDA kernels, or the same bodies run on the host.
// ---------------------------------------------------------------------------------------------

#ifndef AVEX_HOST_SIMULATION

avex_status cuda_failed(const char *fn, const char *what, cudaError_t error) {
    return fail(AVEX_ERROR_CUDA, "%s: %s failed: %s (%s)", fn, what, cudaGetErrorName(error),
                cudaGetErrorString(error));
}

#define CUDA_TRY(fn, what, call)                                        \
    do {                                                                \
        const cudaError_t error_ = (call);                              \
        if (error_ != cudaSuccess) return cuda_failed(fn, what, error_); \
    } while (0)

// The first CUDA call of each entry point: a machine without a usable GPU gets a clear
// AVEX_ERROR_CUDA here, before any launch.
avex_status current_device(const char *fn, int *device) {
    CUDA_TRY(fn, "cudaGetDevice", cudaGetDevice(device));
    return AVEX_SUCCESS;
}

__global__ void topk_rows_kernel(TopkArgs a) {
    extern __shared__ __align__(16) unsigned char shared[];
    avex::topk_row(avex::CudaBlock{}, a.scores, a.width, a.lengths, a.k, a.kmax, a.tau,
                   a.indices, static_cast<int64_t>(blockIdx.x), a.sorted_width, shared);
}

__global__ void count_kept_kernel(CompactArgs a) {
    extern __shared__ __align__(16) unsigned char shared[];
    avex::count_kept(avex::CudaBlock{}, a.keep, a.seq_len, static_cast<int64_t>(blockIdx.x),
                     a.cu_seqlens, reinterpret_cast<int64_t *>(shared));
}

__global__ void scan_lengths_kernel(CompactArgs a, int64_t total_limit, int64_t row_limit) {
    extern __shared__ __align__(16) unsigned char shared[];
    avex::scan_lengths(avex::CudaBlock{}, a.cu_seqlens, a.num_seqs, total_limit, row_limit,
                       a.max_seqlen, reinterpret_cast<int64_t *>(shared));
}

__global__ void plan_sequence_kernel(CompactArgs a) {
    extern __shared__ __align__(16) unsigned char shared[];
    avex::plan_sequence(avex::CudaBlock{}, a.keep, a.seq_len, a.num_sets,
                        static_cast<int64_t>(blockIdx.x), a.cu_seqlens, a.layout, a.index,
                        a.position_ids, a.attention_mask, reinterpret_cast<int64_t *>(shared));
}

// Widest word (16, 8, 4, 2 or 1 bytes) that divides the row and both pointers' alignment.
int copy_word_bytes(int64_t row_bytes, const void *a, const void *b) {
    const auto align = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b);
    int word = 16;
    while (word > 1 && (row_bytes % word != 0 || align % word != 0)) word /= 2;
    return word;
}

constexpr int kMarkThreads = 256;

__global__ void mark_kept_kernel(MarkArgs a) {
    const int64_t entries = a.batch * a.kmax;
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * kMarkThreads + threadIdx.x; e < entries;
         e += static_cast<int64_t>(gridDim.x) * kMarkThreads) {
        avex::mark_kept_entry(avex::CudaBlock{}, a.indices, a.kmax, a.width, a.token_index,
                              a.keep, a.seq_len, e);
    }
}

constexpr int kGatherWarps = 8;  // rows per block in flight
constexpr int64_t kMaxGatherBlocks = 1 << 20;

template <class Word>
__global__ void gather_rows_kernel(CompactArgs a, int64_t row_words) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int64_t end = a.out_rows;
    if (!a.layout.padded) {  // varlen: only the rows the keep-sets filled
        const int64_t total = a.cu_seqlens[a.num_seqs];
        end = total < end ? total : end;
    }
    const int64_t step = static_cast<int64_t>(gridDim.x) * kGatherWarps;
    for (int64_t slot = static_cast<int64_t>(blockIdx.x) * kGatherWarps + warp; slot < end;
         slot += step) {
        avex::copy_row<Word>(a.hidden, a.index, a.out_hidden, slot, row_words, lane, 32);
    }
}

avex_status launch_topk(const char *fn, const TopkArgs &a, cudaStream_t stream) {
    const size_t shared = avex::topk_shared_bytes(a.sorted_width, a.threads);
    int device = 0, optin = 0;
    AVEX_TRY(current_device(fn, &device));
    CUDA_TRY(fn, "cudaDeviceGetAttribute",
             cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (shared > static_cast<size_t>(optin)) {
        return fail(AVEX_ERROR_UNSUPPORTED, "%s: width = %lld needs %zu bytes of shared memory "
                    "per block; device %d allows %d", fn, static_cast<long long>(a.width),
                    shared, device, optin);
    }
    if (shared > 48 * 1024) {
        CUDA_TRY(fn, "cudaFuncSetAttribute",
                 cudaFuncSetAttribute(topk_rows_kernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(shared)));
    }
    topk_rows_kernel<<<static_cast<unsigned>(a.batch), a.threads, shared, stream>>>(a);
    CUDA_TRY(fn, "launching topk_rows_kernel", cudaGetLastError());
    return AVEX_SUCCESS;
}

avex_status launch_mark(const char *fn, const MarkArgs &a, cudaStream_t stream) {
    int device = 0;
    AVEX_TRY(current_device(fn, &device));
    int64_t blocks = (a.batch * a.kmax + kMarkThreads - 1) / kMarkThreads;
    blocks = blocks < kMaxGatherBlocks ? blocks : kMaxGatherBlocks;
    mark_kept_kernel<<<static_cast<unsigned>(blocks), kMarkThreads, 0, stream>>>(a);
    CUDA_TRY(fn, "launching mark_kept_kernel", cudaGetLastError());
    return AVEX_SUCCESS;
}

template <class Word>
avex_status launch_gather(const char *fn, const CompactArgs &a, int64_t row_bytes,
                          cudaStream_t stream) {
    int64_t blocks = (a.out_rows + kGatherWarps - 1) / kGatherWarps;
    blocks = blocks < kMaxGatherBlocks ? blocks : kMaxGatherBlocks;
    gather_rows_kernel<Word><<<static_cast<unsigned>(blocks), kGatherWarps * 32, 0, stream>>>(
        a, row_bytes / static_cast<int64_t>(sizeof(Word)));
    CUDA_TRY(fn, "launching gather_rows_kernel", cudaGetLastError());
    return AVEX_SUCCESS;
}

avex_status launch_compact(const CompactArgs &a, cudaStream_t stream) {
    const char *fn = a.fn;
    int device = 0;
    AVEX_TRY(current_device(fn, &device));
    const int seq_threads = avex::block_threads(a.seq_len);
    const int scan_threads = avex::block_threads(a.num_seqs);
    const auto seqs = static_cast<unsigned>(a.num_seqs);
    if (a.num_seqs > 0) {
        count_kept_kernel<<<seqs, seq_threads, avex::compact_shared_bytes(seq_threads), stream>>>(a);
        CUDA_TRY(fn, "launching count_kept_kernel", cudaGetLastError());
    }
    scan_lengths_kernel<<<1, scan_threads, avex::compact_shared_bytes(scan_threads), stream>>>(
        a, total_limit(a.layout), row_limit(a.layout));
    CUDA_TRY(fn, "launching scan_lengths_kernel", cudaGetLastError());
    if (a.num_seqs == 0) return AVEX_SUCCESS;
    plan_sequence_kernel<<<seqs, seq_threads, avex::compact_shared_bytes(seq_threads), stream>>>(a);
    CUDA_TRY(fn, "launching plan_sequence_kernel", cudaGetLastError());

    const int64_t row_bytes = a.hidden_size * a.element_size;
    if (a.out_rows == 0 || row_bytes == 0) return AVEX_SUCCESS;
    switch (copy_word_bytes(row_bytes, a.hidden, a.out_hidden)) {
    case 16: return launch_gather<avex::Bytes16>(fn, a, row_bytes, stream);
    case 8: return launch_gather<uint64_t>(fn, a, row_bytes, stream);
    case 4: return launch_gather<uint32_t>(fn, a, row_bytes, stream);
    case 2: return launch_gather<uint16_t>(fn, a, row_bytes, stream);
    default: return launch_gather<uint8_t>(fn, a, row_bytes, stream);
    }
}

avex_status check_device_errors(cudaStream_t stream) {
    const char *fn = "avex_check_device_errors";
    CUDA_TRY(fn, "cudaStreamSynchronize", cudaStreamSynchronize(stream));
    avex::DeviceError error{};
    CUDA_TRY(fn, "reading the device error record",
             cudaMemcpyFromSymbol(&error, avex::g_device_error, sizeof error));
    if (error.kind == avex::kNoError) return AVEX_SUCCESS;
    const avex::DeviceError cleared{};
    CUDA_TRY(fn, "clearing the device error record",
             cudaMemcpyToSymbol(avex::g_device_error, &cleared, sizeof cleared));
    avex_status status;
    describe(error, &status);
    return status;
}

#else  // AVEX_HOST_SIMULATION

avex::DeviceError g_host_error{};
int g_host_thread_order = avex::kForward;

avex_status launch_topk(const char *, const TopkArgs &a, cudaStream_t) {
    std::vector<unsigned char> shared(avex::topk_shared_bytes(a.sorted_width, a.threads));
    const avex::HostBlock blk{a.threads, &g_host_error, g_host_thread_order};
    for (int64_t row = 0; row < a.batch; ++row) {
        avex::topk_row(blk, a.scores, a.width, a.lengths, a.k, a.kmax, a.tau, a.indices, row,
                       a.sorted_width, shared.data());
    }
    return AVEX_SUCCESS;
}

avex_status launch_mark(const char *, const MarkArgs &a, cudaStream_t) {
    const avex::HostBlock blk{1, &g_host_error, g_host_thread_order};
    for (int64_t e = 0; e < a.batch * a.kmax; ++e) {
        avex::mark_kept_entry(blk, a.indices, a.kmax, a.width, a.token_index, a.keep, a.seq_len,
                              e);
    }
    return AVEX_SUCCESS;
}

avex_status launch_compact(const CompactArgs &a, cudaStream_t) {
    const int seq_threads = avex::block_threads(a.seq_len);
    const int scan_threads = avex::block_threads(a.num_seqs);
    std::vector<int64_t> scratch(3 * 1024);
    const avex::HostBlock seq_block{seq_threads, &g_host_error, g_host_thread_order};
    for (int64_t seq = 0; seq < a.num_seqs; ++seq) {
        avex::count_kept(seq_block, a.keep, a.seq_len, seq, a.cu_seqlens, scratch.data());
    }
    avex::scan_lengths(avex::HostBlock{scan_threads, &g_host_error, g_host_thread_order},
                       a.cu_seqlens, a.num_seqs,
                       total_limit(a.layout), row_limit(a.layout), a.max_seqlen,
                       scratch.data());
    for (int64_t seq = 0; seq < a.num_seqs; ++seq) {
        avex::plan_sequence(seq_block, a.keep, a.seq_len, a.num_sets, seq, a.cu_seqlens, a.layout,
                            a.index, a.position_ids, a.attention_mask, scratch.data());
    }
    const int64_t row_bytes = a.hidden_size * a.element_size;
    if (a.num_seqs == 0 || row_bytes == 0) return AVEX_SUCCESS;
    int64_t end = a.out_rows;
    if (!a.layout.padded) end = a.cu_seqlens[a.num_seqs] < end ? a.cu_seqlens[a.num_seqs] : end;
    for (int64_t slot = 0; slot < end; ++slot) {
        avex::copy_row<uint8_t>(a.hidden, a.index, a.out_hidden, slot, row_bytes, 0, 1);
    }
    return AVEX_SUCCESS;
}

avex_status check_device_errors(cudaStream_t) {
    const avex::DeviceError error = g_host_error;
    if (error.kind == avex::kNoError) return AVEX_SUCCESS;
    g_host_error = avex::DeviceError{};
    avex_status status;
    describe(error, &status);
    return status;
}

#endif  // AVEX_HOST_SIMULATION

// Checks shared by both compaction layouts; fills `a` (but for the layout).
avex_status check_compact(CompactArgs &a) {
    const char *fn = a.fn;
    AVEX_TRY(check_size(fn, "element_size", a.element_size));
    AVEX_TRY(check_size(fn, "batch", a.batch));
    AVEX_TRY(check_size(fn, "seq_len", a.seq_len));
    AVEX_TRY(check_size(fn, "hidden_size", a.hidden_size));
    AVEX_TRY(check_size(fn, "num_sets", a.num_sets));
    if (a.element_size == 0) {
        return fail(AVEX_ERROR_INVALID_SIZE, "%s: element_size must be >= 1, got 0", fn);
    }
    int64_t rows = 0, keep_count = 0, row_bytes = 0, hidden_bytes = 0;
    AVEX_TRY(checked_product(fn, "batch * num_sets", a.batch, a.num_sets, kInt32Max - 1,
                             &a.num_seqs));
    AVEX_TRY(checked_product(fn, "batch * seq_len", a.batch, a.seq_len, kInt64Max, &rows));
    AVEX_TRY(checked_product(fn, "batch * num_sets * seq_len", a.num_seqs, a.seq_len,
                             kInt64Max, &keep_count));
    AVEX_TRY(checked_product(fn, "hidden_size * element_size", a.hidden_size, a.element_size,
                             kInt64Max, &row_bytes));
    AVEX_TRY(checked_product(fn, "hidden bytes", rows, row_bytes, kInt64Max, &hidden_bytes));
    AVEX_TRY(check_pointer(fn, "hidden", a.hidden, hidden_bytes));
    AVEX_TRY(check_pointer(fn, "keep", a.keep, keep_count));
    AVEX_TRY(check_pointer(fn, "cu_seqlens", a.cu_seqlens, a.num_seqs + 1));
    const int64_t out_values = row_bytes > 0 ? a.out_rows : 0;
    AVEX_TRY(check_pointer(fn, "out_hidden", a.out_hidden, out_values));
    AVEX_TRY(check_pointer(fn, "position_ids", a.position_ids, a.out_rows));
    AVEX_TRY(check_pointer(fn, "index", a.index, a.out_rows));
    return AVEX_SUCCESS;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The C API
// ---------------------------------------------------------------------------------------------

extern "C" {

const char *avex_status_name(avex_status status) {
    switch (status) {
    case AVEX_SUCCESS: return "AVEX_SUCCESS";
    case AVEX_ERROR_NULL_POINTER: return "AVEX_ERROR_NULL_POINTER";
    case AVEX_ERROR_INVALID_SIZE: return "AVEX_ERROR_INVALID_SIZE";
    case AVEX_ERROR_INVALID_VALUE: return "AVEX_ERROR_INVALID_VALUE";
    case AVEX_ERROR_K_OUT_OF_RANGE: return "AVEX_ERROR_K_OUT_OF_RANGE";
    case AVEX_ERROR_CAPACITY: return "AVEX_ERROR_CAPACITY";
    case AVEX_ERROR_UNSUPPORTED: return "AVEX_ERROR_UNSUPPORTED";
    case AVEX_ERROR_CUDA: return "AVEX_ERROR_CUDA";
    }
    return "AVEX_UNKNOWN_STATUS";
}

const char *avex_last_error_message(void) { return g_message; }

avex_status avex_check_device_errors(cudaStream_t stream) {
    g_message[0] = '\0';
    return check_device_errors(stream);
}

avex_status avex_topk_rows(const float *scores, int64_t batch, int64_t width,
                           const int64_t *lengths, const int64_t *k, int64_t kmax, float tau,
                           int64_t *indices, cudaStream_t stream) {
    const char *fn = "avex_topk_rows";
    g_message[0] = '\0';
    AVEX_TRY(check_size(fn, "batch", batch));
    AVEX_TRY(check_size(fn, "width", width));
    AVEX_TRY(check_size(fn, "kmax", kmax));
    if (!(tau > 0.0f) || !std::isfinite(tau)) {
        return fail(AVEX_ERROR_INVALID_VALUE, "%s: tau must be finite and > 0, got %g", fn,
                    static_cast<double>(tau));
    }
    if (batch == 0) return AVEX_SUCCESS;
    if (width == 0) {
        return fail(AVEX_ERROR_INVALID_SIZE, "%s: width must be >= 1 when batch > 0, got 0", fn);
    }
    if (kmax < 1 || kmax > width) {
        return fail(AVEX_ERROR_K_OUT_OF_RANGE, "%s: kmax must lie in [1, width = %lld], got %lld",
                    fn, static_cast<long long>(width), static_cast<long long>(kmax));
    }
    if (width > AVEX_TOPK_MAX_WIDTH) {
        return fail(AVEX_ERROR_UNSUPPORTED, "%s: width = %lld is above AVEX_TOPK_MAX_WIDTH = %d",
                    fn, static_cast<long long>(width), AVEX_TOPK_MAX_WIDTH);
    }
    if (batch > kInt32Max) {
        return fail(AVEX_ERROR_UNSUPPORTED, "%s: batch = %lld is above %lld rows", fn,
                    static_cast<long long>(batch), static_cast<long long>(kInt32Max));
    }
    AVEX_TRY(check_pointer(fn, "scores", scores, batch * width));
    AVEX_TRY(check_pointer(fn, "k", k, batch));
    AVEX_TRY(check_pointer(fn, "indices", indices, batch * kmax));
    const int64_t sorted_width = next_power_of_2(width);
    const TopkArgs args{scores, batch, width, lengths, k, kmax, tau, indices, sorted_width,
                        avex::block_threads(sorted_width)};
    return launch_topk(fn, args, stream);
}

avex_status avex_mark_kept(const int64_t *indices, int64_t batch, int64_t kmax, int64_t width,
                           const int64_t *token_index, uint8_t *keep, int64_t seq_len,
                           cudaStream_t stream) {
    const char *fn = "avex_mark_kept";
    g_message[0] = '\0';
    AVEX_TRY(check_size(fn, "batch", batch));
    AVEX_TRY(check_size(fn, "kmax", kmax));
    AVEX_TRY(check_size(fn, "width", width));
    AVEX_TRY(check_size(fn, "seq_len", seq_len));
    int64_t entries = 0, map_entries = 0, keep_entries = 0;
    AVEX_TRY(checked_product(fn, "batch * kmax", batch, kmax, kInt64Max, &entries));
    AVEX_TRY(checked_product(fn, "batch * width", batch, width, kInt64Max, &map_entries));
    AVEX_TRY(checked_product(fn, "batch * seq_len", batch, seq_len, kInt64Max, &keep_entries));
    if (kmax > width) {
        return fail(AVEX_ERROR_K_OUT_OF_RANGE, "%s: kmax = %lld exceeds width = %lld", fn,
                    static_cast<long long>(kmax), static_cast<long long>(width));
    }
    if (!token_index && width > seq_len) {
        return fail(AVEX_ERROR_INVALID_SIZE, "%s: without token_index, score column m is position "
                    "m, so width = %lld must be <= seq_len = %lld", fn,
                    static_cast<long long>(width), static_cast<long long>(seq_len));
    }
    AVEX_TRY(check_pointer(fn, "indices", indices, entries));
    AVEX_TRY(check_pointer(fn, "keep", keep, entries > 0 ? keep_entries : 0));
    if (entries == 0) return AVEX_SUCCESS;
    return launch_mark(fn, MarkArgs{indices, batch, kmax, width, token_index, keep, seq_len},
                       stream);
}

avex_status avex_compact_varlen(const void *hidden, int64_t element_size, int64_t batch,
                                int64_t seq_len, int64_t hidden_size, const uint8_t *keep,
                                int64_t num_sets, avex_positions positions, int64_t capacity,
                                void *out_hidden, int64_t *position_ids, int64_t *index,
                                int32_t *cu_seqlens, int32_t *max_seqlen, cudaStream_t stream) {
    const char *fn = "avex_compact_varlen";
    g_message[0] = '\0';
    if (positions != AVEX_POSITIONS_ORIGINAL && positions != AVEX_POSITIONS_CONTIGUOUS) {
        return fail(AVEX_ERROR_INVALID_VALUE, "%s: positions must be AVEX_POSITIONS_ORIGINAL (0) "
                    "or AVEX_POSITIONS_CONTIGUOUS (1), got %d", fn, static_cast<int>(positions));
    }
    AVEX_TRY(check_size(fn, "capacity", capacity));
    if (capacity > kInt32Max) {
        return fail(AVEX_ERROR_INVALID_SIZE, "%s: capacity = %lld is above %lld, the largest "
                    "total that int32 cu_seqlens can hold", fn,
                    static_cast<long long>(capacity), static_cast<long long>(kInt32Max));
    }
    CompactArgs a{fn, hidden, element_size, batch, seq_len, hidden_size, keep, num_sets, 0,
                  avex::PlanLayout{positions == AVEX_POSITIONS_ORIGINAL, false, false, 0,
                                   capacity},
                  capacity, out_hidden, position_ids, index, cu_seqlens, max_seqlen, nullptr};
    AVEX_TRY(check_compact(a));
    return launch_compact(a, stream);
}

avex_status avex_compact_padded(const void *hidden, int64_t element_size, int64_t batch,
                                int64_t seq_len, int64_t hidden_size, const uint8_t *keep,
                                int64_t num_sets, avex_positions positions,
                                avex_padding_side side, int64_t padded_width, void *out_hidden,
                                int64_t *position_ids, int64_t *index, int32_t *cu_seqlens,
                                int64_t *attention_mask, cudaStream_t stream) {
    const char *fn = "avex_compact_padded";
    g_message[0] = '\0';
    if (positions != AVEX_POSITIONS_ORIGINAL && positions != AVEX_POSITIONS_CONTIGUOUS) {
        return fail(AVEX_ERROR_INVALID_VALUE, "%s: positions must be AVEX_POSITIONS_ORIGINAL (0) "
                    "or AVEX_POSITIONS_CONTIGUOUS (1), got %d", fn, static_cast<int>(positions));
    }
    if (side != AVEX_PAD_RIGHT && side != AVEX_PAD_LEFT) {
        return fail(AVEX_ERROR_INVALID_VALUE, "%s: side must be AVEX_PAD_RIGHT (0) or "
                    "AVEX_PAD_LEFT (1), got %d", fn, static_cast<int>(side));
    }
    AVEX_TRY(check_size(fn, "padded_width", padded_width));
    CompactArgs a{fn, hidden, element_size, batch, seq_len, hidden_size, keep, num_sets, 0,
                  avex::PlanLayout{positions == AVEX_POSITIONS_ORIGINAL, true,
                                   side == AVEX_PAD_LEFT, padded_width, 0},
                  0, out_hidden, position_ids, index, cu_seqlens, nullptr, attention_mask};
    AVEX_TRY(check_size(fn, "batch", batch));
    AVEX_TRY(check_size(fn, "num_sets", num_sets));
    if (batch > 0 && num_sets > kInt32Max / batch) {
        return fail(AVEX_ERROR_INVALID_SIZE, "%s: batch * num_sets = %lld * %lld exceeds %lld",
                    fn, static_cast<long long>(batch), static_cast<long long>(num_sets),
                    static_cast<long long>(kInt32Max));
    }
    AVEX_TRY(checked_product(fn, "batch * num_sets * padded_width", batch * num_sets,
                             padded_width, kInt32Max, &a.out_rows));
    AVEX_TRY(check_compact(a));
    return launch_compact(a, stream);
}

#ifdef AVEX_HOST_SIMULATION
// Host simulation only (not in avex_prune.h): the order in which a step runs the threads,
// 0 forward, 1 reverse, 2 scrambled; returns -1 for another value.
AVEX_API int avex_hostsim_set_thread_order(int order) {
    if (order < avex::kForward || order > avex::kScrambled) return -1;
    g_host_thread_order = order;
    return 0;
}
#endif

}  // extern "C"
