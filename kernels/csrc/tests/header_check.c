/* The public header compiles as C, and a C program links against libavex_prune and gets
 * error codes back from it. Argument checks run on the host, so this runs without a GPU. */
#include <stdio.h>
#include <string.h>

#include "avex_prune.h"

static int expect(avex_status got, avex_status want, const char *what) {
    if (got != want) {
        printf("FAIL %s: got %s, want %s (%s)\n", what, avex_status_name(got),
               avex_status_name(want), avex_last_error_message());
        return 1;
    }
    if (want != AVEX_SUCCESS && strlen(avex_last_error_message()) == 0) {
        printf("FAIL %s: no error message\n", what);
        return 1;
    }
    printf("ok   %s: %s: %s\n", what, avex_status_name(got), avex_last_error_message());
    return 0;
}

int main(void) {
    int64_t k[2] = {1, 1};
    int failures = 0;
    failures += expect(avex_topk_rows(NULL, 2, 8, NULL, k, 1, 1.0f, NULL, NULL),
                       AVEX_ERROR_NULL_POINTER, "topk with NULL scores");
    failures += expect(avex_topk_rows(NULL, -1, 8, NULL, k, 1, 1.0f, NULL, NULL),
                       AVEX_ERROR_INVALID_SIZE, "topk with batch -1");
    failures += expect(avex_compact_varlen(NULL, 2, 1, -4, 16, NULL, 1, AVEX_POSITIONS_ORIGINAL,
                                           8, NULL, NULL, NULL, NULL, NULL, NULL),
                       AVEX_ERROR_INVALID_SIZE, "compact with seq_len -4");
    failures += expect(avex_topk_rows(NULL, 0, 8, NULL, NULL, 1, 1.0f, NULL, NULL),
                       AVEX_SUCCESS, "topk of an empty batch");
    if (strcmp(avex_status_name(AVEX_ERROR_CUDA), "AVEX_ERROR_CUDA") != 0) {
        printf("FAIL avex_status_name\n");
        ++failures;
    }
    return failures == 0 ? 0 : 1;
}
