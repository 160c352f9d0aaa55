// AVEX-Prune at inference, from C++, all on the device: Top-K of the policy scores, the chosen
// tokens marked in a keep mask, then compaction into the packed layout that a varlen attention
// kernel takes.
//
// Two samples with ragged audio-visual token counts (320 and 200) between a 6-token and an
// 18-token text prompt. Random scores stand in for the policy's; 40% of each sample's
// audio-visual tokens are kept, and every text token.
//
//   cmake -S . -B build && cmake --build build && ./build/avex_prune_example
#include <cstdio>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "avex_prune.h"

#define CUDA_CHECK(call)                                                              \
    do {                                                                              \
        cudaError_t error_ = (call);                                                  \
        if (error_ != cudaSuccess) {                                                  \
            std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(error_)); \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

#define AVEX_CHECK(call)                                                                   \
    do {                                                                                   \
        avex_status status_ = (call);                                                      \
        if (status_ != AVEX_SUCCESS) {                                                     \
            std::fprintf(stderr, "%s: %s\n", avex_status_name(status_), avex_last_error_message()); \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

int main() {
    const int64_t batch = 2, text_before = 6, text_after = 18, av_width = 320, hidden_size = 64;
    const int64_t seq_len = text_before + av_width + text_after;
    const std::vector<int64_t> av_tokens = {320, 200};
    std::vector<int64_t> k(batch);
    for (int64_t b = 0; b < batch; ++b) k[b] = (av_tokens[b] * 2 + 4) / 5;  // 40%, rounded
    const int64_t kmax = k[0] > k[1] ? k[0] : k[1];

    // Inputs on the host: scores [batch, av_width], hidden states [batch, seq_len, hidden_size].
    std::mt19937 rng(0);
    std::normal_distribution<float> normal;
    std::vector<float> scores(batch * av_width), hidden(batch * seq_len * hidden_size);
    for (float &s : scores) s = normal(rng);
    for (float &h : hidden) h = normal(rng);

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    float *d_scores, *d_hidden, *d_out;
    int64_t *d_lengths, *d_k, *d_indices, *d_token_index, *d_positions, *d_index;
    uint8_t *d_keep;
    int32_t *d_cu_seqlens, *d_max_seqlen;
    const int64_t capacity = k[0] + k[1] + batch * (text_before + text_after);
    CUDA_CHECK(cudaMalloc(&d_scores, scores.size() * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_hidden, hidden.size() * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_lengths, batch * sizeof(int64_t)));
    CUDA_CHECK(cudaMalloc(&d_k, batch * sizeof(int64_t)));
    CUDA_CHECK(cudaMalloc(&d_indices, batch * kmax * sizeof(int64_t)));
    CUDA_CHECK(cudaMalloc(&d_token_index, batch * av_width * sizeof(int64_t)));
    CUDA_CHECK(cudaMalloc(&d_keep, batch * seq_len));
    CUDA_CHECK(cudaMalloc(&d_out, capacity * hidden_size * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_positions, capacity * sizeof(int64_t)));
    CUDA_CHECK(cudaMalloc(&d_index, capacity * sizeof(int64_t)));
    CUDA_CHECK(cudaMalloc(&d_cu_seqlens, (batch + 1) * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&d_max_seqlen, sizeof(int32_t)));
    CUDA_CHECK(cudaMemcpy(d_scores, scores.data(), scores.size() * sizeof(float),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_hidden, hidden.data(), hidden.size() * sizeof(float),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_lengths, av_tokens.data(), batch * sizeof(int64_t),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_k, k.data(), batch * sizeof(int64_t), cudaMemcpyHostToDevice));

    // 1. Top-K per row (rows ragged through `lengths`, a K per row; tau 1 ranks plain scores).
    AVEX_CHECK(avex_topk_rows(d_scores, batch, av_width, d_lengths, d_k, kmax, 1.0f, d_indices,
                              stream));

    // The keep mask over the whole sequence: 1 at the text tokens, set once; avex_mark_kept
    // adds the chosen AV tokens, whose score column m sits at sequence position 6 + m.
    std::vector<uint8_t> keep(batch * seq_len, 0);
    std::vector<int64_t> token_index(batch * av_width);
    for (int64_t b = 0; b < batch; ++b) {
        uint8_t *row = keep.data() + b * seq_len;
        for (int64_t t = 0; t < text_before; ++t) row[t] = 1;
        for (int64_t t = 0; t < text_after; ++t) row[text_before + av_width + t] = 1;
        for (int64_t m = 0; m < av_width; ++m) token_index[b * av_width + m] = text_before + m;
    }
    CUDA_CHECK(cudaMemcpyAsync(d_keep, keep.data(), keep.size(), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(d_token_index, token_index.data(),
                               token_index.size() * sizeof(int64_t), cudaMemcpyHostToDevice,
                               stream));
    AVEX_CHECK(avex_mark_kept(d_indices, batch, kmax, av_width, d_token_index, d_keep, seq_len,
                              stream));

    // 2. Compaction into the packed layout, original positions kept (as FastV does).
    AVEX_CHECK(avex_compact_varlen(d_hidden, sizeof(float), batch, seq_len, hidden_size, d_keep,
                                   1, AVEX_POSITIONS_ORIGINAL, capacity, d_out, d_positions,
                                   d_index, d_cu_seqlens, d_max_seqlen, stream));
    AVEX_CHECK(avex_check_device_errors(stream));  // a K, a position or a capacity the data broke

    std::vector<int32_t> cu_seqlens(batch + 1);
    int32_t max_seqlen = 0;
    CUDA_CHECK(cudaMemcpy(cu_seqlens.data(), d_cu_seqlens, cu_seqlens.size() * sizeof(int32_t),
                          cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&max_seqlen, d_max_seqlen, sizeof(int32_t), cudaMemcpyDeviceToHost));
    std::printf("kept %lld and %lld audio-visual tokens; cu_seqlens = [%d, %d, %d], "
                "max_seqlen = %d\n", static_cast<long long>(k[0]), static_cast<long long>(k[1]),
                cu_seqlens[0], cu_seqlens[1], cu_seqlens[2], max_seqlen);

    // The first kept row of sample 0 is its first text token, copied unchanged.
    std::vector<float> first(hidden_size);
    CUDA_CHECK(cudaMemcpy(first.data(), d_out, hidden_size * sizeof(float),
                          cudaMemcpyDeviceToHost));
    const bool same = first[0] == hidden[0] && first[hidden_size - 1] == hidden[hidden_size - 1];
    std::printf("first packed row equals hidden[0, 0]: %s\n", same ? "yes" : "no");

    for (void *p : {static_cast<void *>(d_scores), static_cast<void *>(d_hidden),
                    static_cast<void *>(d_out), static_cast<void *>(d_lengths),
                    static_cast<void *>(d_k), static_cast<void *>(d_indices),
                    static_cast<void *>(d_token_index),
                    static_cast<void *>(d_positions), static_cast<void *>(d_index),
                    static_cast<void *>(d_keep), static_cast<void *>(d_cu_seqlens),
                    static_cast<void *>(d_max_seqlen)}) {
        CUDA_CHECK(cudaFree(p));
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    return same && cu_seqlens[batch] == capacity ? 0 : 1;
}
