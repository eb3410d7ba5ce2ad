/* llamacpp_dump.c - runs one prompt through llama.cpp (libllama, CPU) and writes the f32
 * tensors of its forward pass, as llama.cpp's eval callback sees them, for op-by-op comparison
 * with pagoda (tools/llamacpp_opcheck.c; docs/cpu-backend.md, "Fidelity to llama.cpp").
 *
 *   cc -O1 -o llamacpp_dump tools/llamacpp_dump.c -I$LLAMA/include -I$LLAMA/ggml/include \
 *      -L$LLAMA/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$LLAMA/build/bin
 *   llamacpp_dump MODEL.gguf PROMPT OUTDIR [THREADS [DECODE_LAST]]
 *
 * LLAMA is the llama.cpp tree built by tools/llamacpp_fixtures.sh's recipe (never committed).
 * The context is the one tools/llamacpp_greedy.py uses: n_ctx = n_batch = 2048, flash attention
 * off, f16 KV cache. The prompt (with BOS) is evaluated in one batch, except its last
 * DECODE_LAST tokens (default 0), which are then decoded one at a time as greedy generation
 * does; the tensors of the last call are written. Layers 0 and 1 are written whole; of the
 * others, the tensors named l_out, kqv_out, attn_out, ffn_out, kq, ffn_inp and ffn_swiglu.
 * OUTDIR/NAME.K.bin holds the K-th tensor called NAME (f32, ggml order: ne[0] fastest), listed
 * in OUTDIR/index.txt as "NAME K ne0 ne1 ne2 ne3 OP"; OUTDIR/tokens.txt the prompt ids,
 * OUTDIR/logits.bin the last logits, and the top 5 tokens are printed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#define MAX_NAMES 4096

static const char *out_dir;
static FILE *index_file;
static int active = 1;
static char names[MAX_NAMES][64];
static int counts[MAX_NAMES], n_names;

static int wanted(const char *n) {
  const char *dash = strrchr(n, '-');
  if (!dash)
    return strncmp(n, "result", 6) == 0;
  static const char *const always[] = {"l_out", "kqv_out", "attn_out", "ffn_out", "kq-", "ffn_inp", "ffn_swiglu"};
  int keep = atoi(dash + 1) <= 1;
  for (size_t i = 0; i < sizeof always / sizeof always[0]; i++)
    keep |= strncmp(n, always[i], strlen(always[i])) == 0;
  return keep && strchr(n, ' ') == NULL;
}

static bool on_tensor(struct ggml_tensor *t, bool ask, void *user) {
  (void)user;
  int take = active && t->type == GGML_TYPE_F32 && wanted(t->name);
  if (ask || !take || !ggml_is_contiguous(t))
    return ask ? take : true;
  int k = 0, i;
  for (i = 0; i < n_names; i++)
    if (strcmp(names[i], t->name) == 0) {
      k = ++counts[i];
      break;
    }
  if (i == n_names && n_names < MAX_NAMES) {
    snprintf(names[n_names], sizeof names[0], "%s", t->name);
    counts[n_names++] = 0;
  }
  size_t n = (size_t)ggml_nelements(t);
  float *buf = malloc(n * sizeof(float));
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.%d.bin", out_dir, t->name, k);
  FILE *f = fopen(path, "wb");
  if (!buf || !f) {
    fprintf(stderr, "error: cannot write %s\n", path);
    exit(1);
  }
  ggml_backend_tensor_get(t, buf, 0, n * sizeof(float));
  fwrite(buf, sizeof(float), n, f);
  fclose(f);
  free(buf);
  fprintf(index_file, "%s %d %lld %lld %lld %lld %s\n", t->name, k, (long long)t->ne[0], (long long)t->ne[1],
          (long long)t->ne[2], (long long)t->ne[3], ggml_op_desc(t));
  return true;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: llamacpp_dump MODEL.gguf PROMPT OUTDIR [THREADS [DECODE_LAST]]\n");
    return 2;
  }
  out_dir = argv[3];
  char path[1024];
  snprintf(path, sizeof path, "%s/index.txt", out_dir);
  if (!(index_file = fopen(path, "w"))) {
    fprintf(stderr, "error: cannot write %s\n", path);
    return 1;
  }
  llama_backend_init();
  struct llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (!model) {
    fprintf(stderr, "error: cannot load %s\n", argv[1]);
    return 1;
  }
  struct llama_context_params cp = llama_context_default_params();
  cp.n_ctx = cp.n_batch = 2048;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.cb_eval = on_tensor;
  cp.n_threads = cp.n_threads_batch = argc > 4 ? atoi(argv[4]) : 2;
  struct llama_context *ctx = llama_init_from_model(model, cp);
  const struct llama_vocab *vocab = llama_model_get_vocab(model);
  llama_token toks[2048];
  int n = llama_tokenize(vocab, argv[2], (int)strlen(argv[2]), toks, 2048, true, false);
  int dec = argc > 5 ? atoi(argv[5]) : 0;
  if (n <= 0 || dec < 0 || dec >= n) {
    fprintf(stderr, "error: %d prompt tokens, %d to decode\n", n, dec);
    return 1;
  }
  snprintf(path, sizeof path, "%s/tokens.txt", out_dir);
  FILE *f = fopen(path, "w");
  for (int i = 0; f && i < n; i++)
    fprintf(f, "%d\n", toks[i]);
  if (f)
    fclose(f);
  active = dec == 0;
  if (llama_decode(ctx, llama_batch_get_one(toks, n - dec)))
    return fprintf(stderr, "error: llama_decode failed\n"), 1;
  for (int i = n - dec; i < n; i++) {
    active = i == n - 1;
    if (llama_decode(ctx, llama_batch_get_one(toks + i, 1)))
      return fprintf(stderr, "error: llama_decode failed\n"), 1;
  }
  fclose(index_file);
  int nv = llama_vocab_n_tokens(vocab);
  float *lg = llama_get_logits_ith(ctx, -1);
  snprintf(path, sizeof path, "%s/logits.bin", out_dir);
  if ((f = fopen(path, "wb"))) {
    fwrite(lg, sizeof(float), (size_t)nv, f);
    fclose(f);
  }
  for (int r = 0; r < 5; r++) {
    int best = 0;
    for (int i = 1; i < nv; i++)
      if (lg[i] > lg[best])
        best = i;
    char piece[64];
    int pn = llama_token_to_piece(vocab, best, piece, 63, 0, false);
    piece[pn > 0 ? pn : 0] = 0;
    printf("top%d %d '%s' %.5f\n", r, best, piece, lg[best]);
    lg[best] = -1e30f;
  }
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
