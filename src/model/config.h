/* config.h - struct model_config from an HF config.json or from GGUF metadata. */
#ifndef PAGODA_CONFIG_H
#define PAGODA_CONFIG_H

#include <stddef.h>

#include "model/gguf.h"
#include "model/model.h"

/* Largest sizes accepted from a file (far above any real model; they keep products in range). */
#define CONFIG_MAX_DIM (1 << 17)
#define CONFIG_MAX_LAYERS 1024
#define CONFIG_MAX_VOCAB (1 << 22)

/* Fills C from config.json text (LEN bytes, need not be NUL-terminated). NAME names the file in
 * messages. Supports LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM. weight_dtype
 * gets torch_dtype (F32 when absent); the loader replaces it with the dtype actually stored.
 * Returns 0, or -1 with err_last() naming NAME and the offending key. */
int config_from_hf_json(struct model_config *c, const char *json, size_t len, const char *name);
/* Reads PATH (a config.json) and calls config_from_hf_json. */
int config_from_hf_file(struct model_config *c, const char *path);

/* Fills C from GGUF metadata (general.architecture "llama" or "qwen2"). vocab_size comes from
 * tokenizer.ggml.tokens or, without a vocabulary, token_embd.weight's shape; tie_embeddings is 1
 * when output.weight is absent. Returns 0, or -1 with err_last() naming NAME and the key. */
int config_from_gguf(struct model_config *c, const struct gguf_file *g, const char *name);

#endif
