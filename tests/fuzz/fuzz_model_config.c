/* fuzz_model_config.c - fuzz target: config.json text into the HF config parser. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "util/log.h"

int fuzz_one(const uint8_t *data, size_t size) {
  log_set_level(LOG_LEVEL_ERROR); /* mutated Mistral seeds would warn about sliding_window */
  struct model_config c;
  if (config_from_hf_json(&c, (const char *)data, size, "fuzz/config.json") == 0) {
    /* Whatever is accepted satisfies the invariants the forward pass relies on. */
    if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads || c.head_dim <= 0 || c.head_dim % 2 ||
        c.dim <= 0 || c.vocab_size <= 0 || c.n_layers <= 0 || c.ffn_dim <= 0)
      abort();
    /* Mixtral: the routing's bounds; Gemma 2: a positive query scale, softcaps not negative */
    if (c.n_experts && (c.n_experts_used < 1 || c.n_experts_used > c.n_experts))
      abort();
    if (!strcmp(c.arch, "gemma2") && (!(c.query_pre_attn_scalar > 0) || c.attn_softcap < 0 || c.final_softcap < 0))
      abort();
  }
  return 0;
}
