// One thread block, written once and run two ways.
//
// The kernel bodies in topk.cuh and compact.cuh are templates over a Block. `each(step)` runs
// `step(thread)` on every thread of the block and then waits for all of them. A CudaBlock is a
// real CUDA block (the step runs once per thread, then __syncthreads). A HostBlock runs the
// steps thread after thread on the CPU: the host-simulation build uses it so that CI, which has
// no GPU, checks the same algorithms against the PyTorch reference.
//
// Rules that keep the two equal: a local variable outside a step holds the same value on every
// thread; a step writes only what no other thread of the same step reads; and after a value
// read from shared memory outside a step, `sync()` before anything overwrites it.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define AVEX_HD __host__ __device__
#else
#define AVEX_HD
#endif

namespace avex {

// What a kernel can find wrong in device data.
enum DeviceErrorKind : unsigned long long {
    kNoError = 0,
    kRowLength = 1,     // lengths[row] outside [0, width]
    kRowK = 2,          // k[row] outside [1, the row's selectable tokens]
    kTotalTokens = 3,   // the keep-sets hold more tokens than the varlen output's capacity
    kLongestSet = 4,    // a keep-set is longer than the padded width
    kChosenIndex = 5,   // avex_mark_kept: indices[row, r] outside [-1, width)
    kTokenIndex = 6,    // avex_mark_kept: token_index[row, m] outside [0, seq_len)
};

// The first error a kernel meets in device data; read and cleared by avex_check_device_errors.
struct DeviceError {
    unsigned long long kind;  // a DeviceErrorKind
    int64_t row;              // the row or sequence, -1 when it concerns the whole call
    int64_t value;            // the offending value
    int64_t limit;            // the bound it broke
};

#if defined(__CUDACC__) && !defined(AVEX_HOST_SIMULATION)
__device__ DeviceError g_device_error;  // one record per device

struct CudaBlock {
    AVEX_HD int size() const {
#ifdef __CUDA_ARCH__
        return static_cast<int>(blockDim.x);
#else
        return 0;
#endif
    }
    template <class Step>
    AVEX_HD void each(Step step) const {
#ifdef __CUDA_ARCH__
        step(static_cast<int>(threadIdx.x));
        __syncthreads();
#endif
    }
    AVEX_HD void sync() const {
#ifdef __CUDA_ARCH__
        __syncthreads();
#endif
    }
    AVEX_HD void report(DeviceErrorKind kind, int64_t row, int64_t value, int64_t limit) const {
#ifdef __CUDA_ARCH__
        if (atomicCAS(&g_device_error.kind, 0ull, static_cast<unsigned long long>(kind)) == 0ull) {
            g_device_error.row = row;
            g_device_error.value = value;
            g_device_error.limit = limit;
        }
#endif
    }
};
#endif

// Thread order of a HostBlock step. A step whose result depends on it has a race between the
// threads of one step (a thread reads what another writes): the tests run all three.
enum HostThreadOrder { kForward = 0, kReverse = 1, kScrambled = 2 };

struct HostBlock {
    int threads;
    DeviceError *error;
    int order = kForward;
    int size() const { return threads; }
    template <class Step>
    void each(Step step) const {
        for (int i = 0; i < threads; ++i) {
            int t = i;
            if (order == kReverse) t = threads - 1 - i;
            if (order == kScrambled) t = (i * 37 + 11) % threads;  // a bijection: threads is 2^n
            step(t);
        }
    }
    void sync() const {}
    void report(DeviceErrorKind kind, int64_t row, int64_t value, int64_t limit) const {
        if (error->kind == kNoError) *error = DeviceError{kind, row, value, limit};
    }
};

// Threads for a block that walks `n` elements: a power of two in [32, 1024].
inline int block_threads(int64_t n) {
    int threads = 32;
    while (threads < 1024 && threads < n) threads <<= 1;
    return threads;
}

AVEX_HD inline unsigned int float_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    unsigned int bits;
    std::memcpy(&bits, &x, sizeof bits);
    return bits;
#endif
}

// Inclusive prefix sum of buf[0..T) over the block (Hillis-Steele, ping-pong between `buf` and
// `spare`); returns the buffer that holds the result.
template <class Block, class T>
AVEX_HD T *block_inclusive_scan(const Block &blk, T *buf, T *spare) {
    for (int offset = 1; offset < blk.size(); offset <<= 1) {
        blk.each([&](int t) { spare[t] = buf[t] + (t >= offset ? buf[t - offset] : T(0)); });
        T *swap = buf;
        buf = spare;
        spare = swap;
    }
    return buf;
}

}  // namespace avex
