// Token compaction: keep-sets -> packed (varlen) or padded layout, in four steps.
//
//   1. count_kept       one block per sequence: its kept tokens, into cu_seqlens[r + 1];
//   2. scan_lengths     one block: cu_seqlens as a prefix sum, max_seqlen, and the fit checks;
//   3. plan_sequence    one block per sequence: each kept token's output slot (its rank among
//                       the kept, a prefix sum), its source row and its position id;
//   4. copy_row         one warp per output row: the gather, with the widest word that the row
//                       size and the pointers' alignment allow; padding rows (index -1) get 0.
//
// Sequence r = b * num_sets + s reads keep[b, s, :] and the rows of sample b. Nothing is copied
// S times: every set of a sample gathers from the one copy of its hidden states.
#pragma once

#include "block.cuh"
#include "include/avex_prune.h"

namespace avex {

// Scratch of the three block steps: three int64_t per thread.
inline size_t compact_shared_bytes(int threads) {
    return static_cast<size_t>(threads) * 3 * sizeof(int64_t);
}

template <class Block>
AVEX_HD void block_max(const Block &blk, int64_t *buf) {
    for (int half = blk.size() / 2; half > 0; half /= 2) {
        blk.each([&](int t) {
            if (t < half && buf[t + half] > buf[t]) buf[t] = buf[t + half];
        });
    }
}

template <class Block>
AVEX_HD void count_kept(const Block &blk, const unsigned char *keep, int64_t seq_len,
                        int64_t seq, int *cu_seqlens, int64_t *scratch) {
    const int threads = blk.size();
    const unsigned char *row = keep + seq * seq_len;
    blk.each([&](int t) {
        int64_t count = 0;
        for (int64_t col = t; col < seq_len; col += threads) count += row[col] != 0;
        scratch[t] = count;
    });
    for (int half = threads / 2; half > 0; half /= 2) {
        blk.each([&](int t) { if (t < half) scratch[t] += scratch[t + half]; });
    }
    blk.each([&](int t) { if (t == 0) cu_seqlens[seq + 1] = static_cast<int>(scratch[0]); });
}

// total_limit: rows of a varlen output; row_limit: the padded width (or no limit).
template <class Block>
AVEX_HD void scan_lengths(const Block &blk, int *cu_seqlens, int64_t num_seqs,
                          int64_t total_limit, int64_t row_limit, int *max_seqlen,
                          int64_t *scratch) {
    const int threads = blk.size();
    int64_t *buf = scratch, *spare = scratch + threads, *longest_buf = scratch + 2 * threads;
    int64_t carry = 0, longest = 0;
    for (int64_t first = 0; first < num_seqs; first += threads) {
        blk.each([&](int t) {
            int64_t count = first + t < num_seqs ? cu_seqlens[first + t + 1] : 0;
            buf[t] = count;
            longest_buf[t] = count;
        });
        block_max(blk, longest_buf);
        const int64_t *inclusive = block_inclusive_scan(blk, buf, spare);
        blk.each([&](int t) {
            if (first + t < num_seqs) {
                cu_seqlens[first + t + 1] = static_cast<int>(carry + inclusive[t]);
            }
        });
        carry += inclusive[threads - 1];
        longest = longest_buf[0] > longest ? longest_buf[0] : longest;
        blk.sync();
    }
    blk.each([&](int t) {
        if (t != 0) return;
        cu_seqlens[0] = 0;
        if (max_seqlen) *max_seqlen = static_cast<int>(longest);
        if (carry > total_limit) blk.report(kTotalTokens, -1, carry, total_limit);
        if (longest > row_limit) blk.report(kLongestSet, -1, longest, row_limit);
    });
}

struct PlanLayout {
    bool original_positions;
    bool padded;
    bool pad_left;
    int64_t padded_width;  // padded layout
    int64_t capacity;      // varlen layout
};

template <class Block>
AVEX_HD void plan_sequence(const Block &blk, const unsigned char *keep, int64_t seq_len,
                           int64_t num_sets, int64_t seq, const int *cu_seqlens,
                           PlanLayout layout, int64_t *index, int64_t *position_ids,
                           int64_t *attention_mask, int64_t *scratch) {
    const int threads = blk.size();
    const unsigned char *row = keep + seq * seq_len;
    const int64_t source_base = (seq / num_sets) * seq_len;
    const int64_t n = cu_seqlens[seq + 1] - cu_seqlens[seq];
    int64_t first_slot, end_slot;
    if (layout.padded) {
        const int64_t width = layout.padded_width;
        const bool fits = n <= width;  // scan_lengths reported a set that doesn't fit
        first_slot = seq * width + (layout.pad_left ? width - n : 0);
        end_slot = (seq + 1) * width;
        blk.each([&](int t) {
            for (int64_t j = t; j < width; j += threads) {
                const int64_t slot = seq * width + j;
                // A set that doesn't fit leaves an all-padding row, so the gather reads nothing.
                const bool pad = !fits || (layout.pad_left ? j < width - n : j >= n);
                if (pad) {
                    index[slot] = -1;
                    position_ids[slot] = 0;
                }
                if (attention_mask) attention_mask[slot] = pad ? 0 : 1;
            }
        });
        if (!fits) return;
    } else {
        first_slot = cu_seqlens[seq];
        end_slot = layout.capacity;  // a total over capacity was reported; write nothing past it
    }

    int64_t *buf = scratch, *spare = scratch + threads;
    int64_t carry = 0;
    for (int64_t first = 0; first < seq_len; first += threads) {
        blk.each([&](int t) { buf[t] = first + t < seq_len && row[first + t] != 0; });
        const int64_t *inclusive = block_inclusive_scan(blk, buf, spare);
        blk.each([&](int t) {
            const int64_t col = first + t;
            if (col >= seq_len || row[col] == 0) return;
            const int64_t rank = carry + inclusive[t] - 1;
            const int64_t slot = first_slot + rank;
            if (slot >= end_slot) return;
            index[slot] = source_base + col;
            position_ids[slot] = layout.original_positions ? col : rank;
        });
        carry += inclusive[threads - 1];
        blk.sync();
    }
}

struct alignas(16) Bytes16 {
    unsigned long long lo, hi;
};

// Copies output row `slot` from its source row, lane by lane (a warp on the GPU).
template <class Word>
AVEX_HD void copy_row(const void *hidden, const int64_t *index, void *out, int64_t slot,
                      int64_t row_words, int lane, int lanes) {
    const int64_t source = index[slot];
    Word *to = static_cast<Word *>(out) + slot * row_words;
    const Word *from = static_cast<const Word *>(hidden) + (source < 0 ? 0 : source) * row_words;
    for (int64_t w = lane; w < row_words; w += lanes) to[w] = source < 0 ? Word{} : from[w];
}

}  // namespace avex
