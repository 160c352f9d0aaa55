/* AVEX-Prune inference kernels: a plain C API for C and C++ serving stacks.
 *
 * Two steps of the inference path, both asynchronous on the caller's stream:
 *   1. avex_topk_rows: per-row Top-K of the policy scores (ragged rows, a K per row), and
 *      avex_mark_kept to turn the chosen columns into a keep mask over the sequence;
 *   2. avex_compact_varlen / avex_compact_padded: gather the kept tokens of each keep-set into
 *      flash-attention's packed layout (cu_seqlens, position ids) or a padded batch.
 *
 * Every pointer is a device pointer unless its comment says otherwise. A pointer may be NULL
 * only when the array it points to has no elements, or when its comment says "may be NULL".
 * Every function returns an avex_status; avex_status_name() names it and
 * avex_last_error_message() says which argument was wrong and what value it had.
 *
 * Errors that can only be seen in device data (a row's K above its tokens, a keep-set longer
 * than the output allows) are recorded on the device by the kernel that meets them, and
 * returned by the next avex_check_device_errors(), which synchronizes the stream. The outputs
 * of a call that recorded such an error are unspecified. Calls from one host thread see their
 * own last message; device errors are one record per device.
 *
 * Semantics match avex.kernels (gumbel_topk with sample=False, and compact): the tests compare
 * this library with the same PyTorch reference.
 */
#ifndef AVEX_PRUNE_H
#define AVEX_PRUNE_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define AVEX_API __declspec(dllexport)
#else
#define AVEX_API __attribute__((visibility("default")))
#endif

#define AVEX_TOPK_MAX_WIDTH 16384 /* one row is sorted in shared memory */

typedef enum avex_status {
    AVEX_SUCCESS = 0,
    AVEX_ERROR_NULL_POINTER = 1,   /* a required pointer is NULL */
    AVEX_ERROR_INVALID_SIZE = 2,   /* a negative size, or sizes whose product overflows */
    AVEX_ERROR_INVALID_VALUE = 3,  /* an enum, tau or a row length out of its range */
    AVEX_ERROR_K_OUT_OF_RANGE = 4, /* K < 1, or K above the tokens a row can give */
    AVEX_ERROR_CAPACITY = 5,       /* the kept tokens don't fit the output */
    AVEX_ERROR_UNSUPPORTED = 6,    /* valid, but beyond what this build handles */
    AVEX_ERROR_CUDA = 7            /* the CUDA runtime failed (no device, launch error, ...) */
} avex_status;

typedef enum avex_positions {
    AVEX_POSITIONS_ORIGINAL = 0,  /* each kept token keeps its index in the input sequence */
    AVEX_POSITIONS_CONTIGUOUS = 1 /* 0 .. n-1 within each output sequence */
} avex_positions;

typedef enum avex_padding_side {
    AVEX_PAD_RIGHT = 0,
    AVEX_PAD_LEFT = 1
} avex_padding_side;

/* "AVEX_SUCCESS", "AVEX_ERROR_NULL_POINTER", ...; a static string. */
AVEX_API const char *avex_status_name(avex_status status);

/* What went wrong in this thread's last call ("" after a success); valid until the next call. */
AVEX_API const char *avex_last_error_message(void);

/* Synchronizes `stream`, then returns (and clears) the first error a kernel of this library
 * recorded on the current device since the last check; AVEX_SUCCESS if none. */
AVEX_API avex_status avex_check_device_errors(cudaStream_t stream);

/* Deterministic Top-K per row, in descending score order.
 *
 *   scores   float32 [batch, width], row-major. -inf marks a token that can't be chosen.
 *   lengths  int64 [batch], may be NULL (every row has `width` tokens); row b ranks positions
 *            [0, lengths[b]) only. Checked on the device: 0 <= lengths[b] <= width.
 *   k        int64 [batch]: tokens to keep per row. Checked on the device:
 *            1 <= k[b] <= the row's selectable tokens (positions < length, score > -inf).
 *   kmax     columns of `indices`, >= every k[b]; 1 <= kmax <= width.
 *   tau      > 0. Rows rank by (s - max) / tau in float32, as gumbel_topk(sample=False) does:
 *            pass 1 for plain scores. Ties go to the lower index.
 *   indices  int64 [batch, kmax] (out): chosen positions, best first, then -1 past k[b].
 *
 * width may be at most AVEX_TOPK_MAX_WIDTH. */
AVEX_API avex_status avex_topk_rows(const float *scores, int64_t batch, int64_t width,
                                    const int64_t *lengths, const int64_t *k, int64_t kmax,
                                    float tau, int64_t *indices, cudaStream_t stream);

/* Marks the chosen tokens in a keep mask: keep[b, token_index[b, indices[b, r]]] = 1 for every
 * r with indices[b, r] >= 0. Other entries are left as they are, so set the mask first (1 for
 * the text tokens to keep, 0 elsewhere).
 *
 *   indices      int64 [batch, kmax], as avex_topk_rows writes it.
 *   width        score columns per row (avex_topk_rows' width); kmax <= width.
 *   token_index  int64 [batch, width], may be NULL: the sequence position of score column m
 *                (NULL: column m is position m). Checked on the device: in [0, seq_len).
 *   keep         uint8 [batch, seq_len] (in/out), e.g. avex_compact_varlen's keep with S = 1. */
AVEX_API avex_status avex_mark_kept(const int64_t *indices, int64_t batch, int64_t kmax,
                                    int64_t width, const int64_t *token_index, uint8_t *keep,
                                    int64_t seq_len, cudaStream_t stream);

/* Compaction into the packed (varlen) layout. Sequence r = b * num_sets + s holds the tokens of
 * keep-set s of sample b, in their original order.
 *
 *   hidden        [batch, seq_len, hidden_size] elements of `element_size` bytes (any dtype).
 *   keep          uint8 [batch, num_sets, seq_len]; nonzero keeps the token.
 *   capacity      rows available in out_hidden / position_ids / index; the kept total must fit
 *                 (checked on the device). Rows past cu_seqlens[R] are left as they were.
 *   out_hidden    [capacity, hidden_size] (out): the kept rows.
 *   position_ids  int64 [capacity] (out): original index along seq_len, or 0..n-1.
 *   index         int64 [capacity] (out): the row of hidden viewed as [batch*seq_len, hidden_size]
 *                 each output row came from.
 *   cu_seqlens    int32 [R + 1] (out): cumulative lengths with a leading 0.
 *   max_seqlen    int32 [1] (out), may be NULL: the longest sequence. */
AVEX_API avex_status avex_compact_varlen(const void *hidden, int64_t element_size, int64_t batch,
                                         int64_t seq_len, int64_t hidden_size,
                                         const uint8_t *keep, int64_t num_sets,
                                         avex_positions positions, int64_t capacity,
                                         void *out_hidden, int64_t *position_ids, int64_t *index,
                                         int32_t *cu_seqlens, int32_t *max_seqlen,
                                         cudaStream_t stream);

/* Compaction into a padded batch [R, padded_width, hidden_size]: padding rows are zero, with
 * index -1 and position 0; every sequence must fit padded_width (checked on the device).
 *
 *   attention_mask  int64 [R, padded_width] (out), may be NULL: 1 at tokens, 0 at padding.
 * Other arguments as in avex_compact_varlen, with R * padded_width rows of output. */
AVEX_API avex_status avex_compact_padded(const void *hidden, int64_t element_size, int64_t batch,
                                         int64_t seq_len, int64_t hidden_size,
                                         const uint8_t *keep, int64_t num_sets,
                                         avex_positions positions, avex_padding_side side,
                                         int64_t padded_width, void *out_hidden,
                                         int64_t *position_ids, int64_t *index,
                                         int32_t *cu_seqlens, int64_t *attention_mask,
                                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* AVEX_PRUNE_H */
