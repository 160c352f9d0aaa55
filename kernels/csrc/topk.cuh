// Per-row Top-K: one block sorts one row of packed keys in shared memory.
//
// The ranking is gumbel_topk(sample=False)'s: key = (s - max over valid) / tau in float32,
// -0.0 read as +0.0, ties to the lower index, valid tokens (position < length, s > -inf) above
// every invalid one. One 64-bit integer carries all of it, so one descending sort does the
// ranking: the key's order-preserving bits above, the reversed index below, and 0 for invalid
// tokens (every valid token packs to more than 0x007FFFFF << 32).
#pragma once

#include <cmath>

#include "block.cuh"
#include "include/avex_prune.h"

namespace avex {

constexpr float kNegInf = -INFINITY;

AVEX_HD inline unsigned long long pack_rank_key(float key, bool valid, int64_t index) {
    if (!valid) return 0ull;
    if (key == 0.0f) key = 0.0f;
    unsigned int bits = float_bits(key);
    unsigned int ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return (static_cast<unsigned long long>(ordered) << 32) |
           (0xFFFFFFFFull - static_cast<unsigned long long>(index));
}

AVEX_HD inline int64_t unpack_index(unsigned long long packed) {
    return static_cast<int64_t>(0xFFFFFFFFull - (packed & 0xFFFFFFFFull));
}

// Shared memory of one row: `sorted_width` packed keys, then a float and an int per thread.
inline size_t topk_shared_bytes(int64_t sorted_width, int threads) {
    return static_cast<size_t>(sorted_width) * sizeof(unsigned long long) +
           static_cast<size_t>(threads) * (sizeof(float) + sizeof(int));
}

// sorted_width: a power of two >= width.
template <class Block>
AVEX_HD void topk_row(const Block &blk, const float *scores, int64_t width,
                      const int64_t *lengths, const int64_t *k, int64_t kmax, float tau,
                      int64_t *indices, int64_t row, int64_t sorted_width,
                      unsigned char *shared) {
    const int threads = blk.size();
    auto *keys = reinterpret_cast<unsigned long long *>(shared);
    auto *row_max = reinterpret_cast<float *>(keys + sorted_width);
    auto *n_valid = reinterpret_cast<int *>(row_max + threads);
    const float *s = scores + row * width;
    int64_t *out = indices + row * kmax;
    const int64_t length = lengths ? lengths[row] : width;
    const int64_t k_row = k[row];

    // Largest valid score and the count of valid tokens.
    blk.each([&](int t) {
        float best = kNegInf;
        int count = 0;
        for (int64_t i = t; i < width; i += threads) {
            float v = s[i];
            if (i < length && v > kNegInf) {
                best = v > best ? v : best;
                ++count;
            }
        }
        row_max[t] = best;
        n_valid[t] = count;
    });
    for (int half = threads / 2; half > 0; half /= 2) {
        blk.each([&](int t) {
            if (t < half) {
                row_max[t] = row_max[t + half] > row_max[t] ? row_max[t + half] : row_max[t];
                n_valid[t] += n_valid[t + half];
            }
        });
    }
    const float shift = row_max[0] > kNegInf ? row_max[0] : 0.0f;
    const int64_t selectable = n_valid[0];

    bool ok = true;
    if (length < 0 || length > width) {
        ok = false;
        blk.each([&](int t) {
            if (t == 0) blk.report(kRowLength, row, length, width);
        });
    } else if (k_row < 1 || k_row > selectable || k_row > kmax) {
        ok = false;
        int64_t limit = selectable < kmax ? selectable : kmax;
        blk.each([&](int t) {
            if (t == 0) blk.report(kRowK, row, k_row, limit);
        });
    }
    if (!ok) {
        blk.each([&](int t) { for (int64_t r = t; r < kmax; r += threads) out[r] = -1; });
        return;
    }

    blk.each([&](int t) {
        for (int64_t i = t; i < sorted_width; i += threads) {
            float v = i < width ? s[i] : kNegInf;
            bool valid = i < length && v > kNegInf;
            keys[i] = pack_rank_key(valid ? (v - shift) / tau : 0.0f, valid, i);
        }
    });

    // Bitonic sort, descending. Each step compares disjoint pairs (i, i ^ stride).
    for (int64_t size = 2; size <= sorted_width; size <<= 1) {
        for (int64_t stride = size / 2; stride > 0; stride >>= 1) {
            blk.each([&](int t) {
                for (int64_t i = t; i < sorted_width; i += threads) {
                    int64_t j = i ^ stride;
                    if (j <= i) continue;
                    unsigned long long a = keys[i], b = keys[j];
                    bool descending = (i & size) == 0;
                    if (descending ? a < b : a > b) {
                        keys[i] = b;
                        keys[j] = a;
                    }
                }
            });
        }
    }

    blk.each([&](int t) {
        for (int64_t r = t; r < kmax; r += threads) {
            out[r] = r < k_row ? unpack_index(keys[r]) : -1;
        }
    });
}

// One entry of avex_mark_kept: keep[row, token_index[row, indices[row, r]]] = 1 (flat entry
// e = row * kmax + r). -1 (past the row's K) marks nothing.
template <class Block>
AVEX_HD void mark_kept_entry(const Block &blk, const int64_t *indices, int64_t kmax, int64_t width,
                             const int64_t *token_index, unsigned char *keep, int64_t seq_len,
                             int64_t entry) {
    const int64_t row = entry / kmax, column = indices[entry];
    if (column == -1) return;
    if (column < -1 || column >= width) {
        blk.report(kChosenIndex, row, column, width);
        return;
    }
    const int64_t position = token_index ? token_index[row * width + column] : column;
    if (position < 0 || position >= seq_len) {
        blk.report(kTokenIndex, row, position, seq_len);
        return;
    }
    keep[row * seq_len + position] = 1;
}

}  // namespace avex
