/* The decoder of ck_encode_tape's words, shared by every backend (each wraps it in its
 * ck_encode_tape to set its own last-error text). A tape is what lib/gpu/tape.ts records:
 * the arguments of a run of ck_encode_dispatch / ck_encode_dispatch_threads calls, packed
 * as 32-bit words, so a recorded step is encoded again with one call from the host.
 *
 * One command:
 *   [0] kind (0: ck_encode_dispatch, 1: ck_encode_dispatch_threads)
 *   [1] binding count        [2] params length in bytes
 *   [3] [4] the pipeline handle (low, high 32 bits)
 *   [5..7] grid              [8..10] threadgroup
 *   then binding count x 4 words (ck_binding: handle low, high, offset low, high)
 *   then the params, padded to whole words. */
#ifndef CHERENKOV_TAPE_H
#define CHERENKOV_TAPE_H

#include <stdint.h>

#include "cherenkov.h"

#define CK_TAPE_HEADER_WORDS 11u
#define CK_TAPE_MAX_BINDINGS 31u

static inline uint64_t ck_tape_u64(const uint32_t *w) { return (uint64_t)w[0] | ((uint64_t)w[1] << 32); }

/* Encodes every command of the tape into cb. A dispatch that fails returns its status (its
 * error text set by the backend); a malformed tape returns CK_ERROR with *why set. */
static inline int32_t ck_tape_encode(ck_cmdbuf *cb, const uint32_t *words, uint32_t count, const char **why) {
  ck_binding bindings[CK_TAPE_MAX_BINDINGS];
  uint32_t i = 0;
  *why = NULL;
  if (count > 0 && !words) return *why = "words is NULL", CK_ERROR;
  while (i < count) {
    if (count - i < CK_TAPE_HEADER_WORDS) return *why = "a command's header runs past the end of the tape", CK_ERROR;
    const uint32_t *c = words + i;
    const uint32_t kind = c[0], nb = c[1], params_len = c[2];
    if (kind > 1) return *why = "a command's kind is not 0 (threadgroups) or 1 (threads)", CK_ERROR;
    if (nb > CK_TAPE_MAX_BINDINGS) return *why = "a command has more than 31 bindings", CK_ERROR;
    const uint64_t len = (uint64_t)CK_TAPE_HEADER_WORDS + 4u * (uint64_t)nb + ((uint64_t)params_len + 3u) / 4u;
    if (len > count - i) return *why = "a command's bindings or params run past the end of the tape", CK_ERROR;
    for (uint32_t b = 0; b < nb; b++) {
      const uint32_t *bw = c + CK_TAPE_HEADER_WORDS + 4u * b;
      bindings[b].buffer = (ck_buffer *)(uintptr_t)ck_tape_u64(bw);
      bindings[b].offset = ck_tape_u64(bw + 2);
    }
    ck_pipeline *pipe = (ck_pipeline *)(uintptr_t)ck_tape_u64(c + 3);
    const void *params = params_len ? (const void *)(c + CK_TAPE_HEADER_WORDS + 4u * nb) : NULL;
    const int32_t s = kind == 0 ? ck_encode_dispatch(cb, pipe, c[5], c[6], c[7], c[8], c[9], c[10], bindings, nb, params, params_len)
                                : ck_encode_dispatch_threads(cb, pipe, c[5], c[6], c[7], c[8], c[9], c[10], bindings, nb, params, params_len);
    if (s != CK_OK) return s;
    i += (uint32_t)len;
  }
  return CK_OK;
}

#endif /* CHERENKOV_TAPE_H */
