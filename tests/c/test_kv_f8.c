/* test_kv_f8.c - what an f8e4m3 KV cache costs in accuracy, on stories260K and the fixtures:
 * 256 greedy tokens with the reference cache (the backend's activation dtype: f32 on the CPU,
 * bf16 on CUDA), then the same token sequence fed through an f8e4m3 cache (teacher forcing):
 * the share of the 256 steps whose argmax is the same (greedy agreement), the mean KL
 * divergence KL(ref || f8) of the next-token distributions, and how many tokens a free-running
 * f8 greedy generation keeps identical, all printed (figures in bench/RESULTS.md).
 * Checked: mean KL below 0.02 nats on every model (measured: at most 0.009, stories260K) and
 * at least 95% agreement on stories260K, the one trained model (measured 97.7% on the CPU).
 * The random-weight fixtures have near-flat next-token distributions (top two logits often
 * within the quantization noise), so their agreement is printed, not checked: 63-100% on the
 * CPU for KL of 1e-4 to 2e-3 nats. A per-layer scale other than 1 does not change these (e4m3's
 * relative precision is the same across its normal range; 1/16 .. 16 moved agreement by at most
 * 6 of 256 tokens, 1/256 lost more), so finer scales are not used. The default model
 * SmolLM2-135M (trained, head_dim 64, when scripts/setup.sh --model has fetched it) is measured
 * on a chat prompt too: 95.7% agreement, KL 0.0094 on the CPU; uniform scales 4 and 16 (values
 * stored x4, x16: fewer subnormals) gave 94.5% and 93.8%, so there too the loss is e4m3's 3-bit
 * mantissa, not its range. Where the backend has an f16 cache (the CPU), the same steps also run
 * through it as a yardstick: what a 16-bit cache in llama.cpp's order (q, k, v and the
 * probabilities rounded to f16) loses. stories260K and the fixtures: 99.6-100%, KL <= 6e-7; but
 * SmolLM2-135M only 96.9% (KL 0.003): that model's next-token choice is so sensitive to its
 * attention inputs that rounding K and V alone to f16 (a simulation, k and v rounded and widened
 * back in the f32 cache) gives 97.7%, so no 8-bit cache reaches 99% on it. Two finer schemes were
 * simulated the same way and dropped: a normalized Hadamard rotation of each head's k and v before
 * the e4m3 rounding (stories260K 95.3%, SmolLM2 94.1%) and subtracting each layer's per-channel mean
 * of k and v measured on the reference run (softmax and the convex sum of v are unchanged by it):
 * 97.7% and 93.8%. Other 8-bit caches, simulated the same way (bench/RESULTS.md, session 22), miss 99%
 * too: the newest 64 keys kept unrounded leave llama_hd at 93.8%, and int8 with an absmax scale per
 * (token, KV head) row reaches 96.9-100% (llama_hd 96.9%), where a bf16 cache gives 99.6-100%.
 * PAGODA_KV_F8_DEVICE=cuda runs it on the GPU (bf16 reference). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/model.h"
#include "pagoda.h"
#include "test_util.h"
#include "util/log.h"

#define GEN 256
#define BS 16
#define MAXTOK 320
#define MAX_BLOCKS (MAXTOK / BS)

/* Runs one token (position POS) of the single sequence through the cache; logits (vocab). */
static int step1(struct model *m, int32_t id, int pos, const int32_t *table, float *logits) {
  int32_t ids[1] = {id}, p[1] = {pos}, slot[1] = {table[pos / BS] * BS + pos % BS}, lidx[1] = {0};
  int32_t qs[2] = {0, 1}, lens[1] = {pos + 1};
  struct batch b = {0};
  b.num_tokens = 1;
  b.num_seqs = 1;
  b.max_blocks_per_seq = MAX_BLOCKS;
  b.max_seq_len = pos + 1;
  b.max_query_len = 1;
  b.input_ids = ids;
  b.positions = p;
  b.slot_mapping = slot;
  b.query_start = qs;
  b.seq_lens = lens;
  b.block_tables = table;
  b.num_logits = 1;
  b.logits_idx = lidx;
  return model_forward(m, &b, logits);
}

static int argmax(const float *v, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[best])
      best = i;
  return best;
}

/* log-softmax of v(n) into out */
static void log_softmax(double *out, const float *v, int n) {
  double mx = -INFINITY, s = 0;
  for (int i = 0; i < n; i++)
    mx = v[i] > mx ? v[i] : mx;
  for (int i = 0; i < n; i++)
    s += exp(v[i] - mx);
  double ls = log(s);
  for (int i = 0; i < n; i++)
    out[i] = v[i] - mx - ls;
}

/* Runs PROMPT then GEN greedy steps with cache KVT; when FORCE is given, the tokens after the
 * prompt are FORCE's instead of the argmax. TOKS gets the n_prompt + GEN tokens, LOGITS the GEN
 * distributions that chose the generated tokens (GEN x vocab). */
static int run(struct model *m, enum dtype kvt, const int32_t *prompt, int n_prompt, const int32_t *force,
               int32_t *toks, float *logits, int vocab) {
  if (model_alloc_kv(m, 1 + MAX_BLOCKS, BS, kvt))
    return -1;
  int32_t table[MAX_BLOCKS];
  for (int i = 0; i < MAX_BLOCKS; i++)
    table[i] = MAX_BLOCKS - i; /* reversed physical order */
  float *lg = malloc(sizeof(float) * vocab);
  memcpy(toks, prompt, sizeof(int32_t) * n_prompt);
  int rc = 0;
  for (int pos = 0; pos < n_prompt + GEN - 1 && rc == 0; pos++) {
    rc = step1(m, toks[pos], pos, table, lg);
    if (rc == 0 && pos >= n_prompt - 1) {
      int g = pos - (n_prompt - 1);
      memcpy(logits + (size_t)g * vocab, lg, sizeof(float) * vocab);
      toks[pos + 1] = force ? force[pos + 1] : argmax(lg, vocab);
    }
  }
  free(lg);
  return rc;
}

/* Teacher-forced comparison of cache KVT against the reference run (REF_T tokens, REF_L
 * distributions): agreement and KL as the header says; the free-running count when FREE. */
static int compare(struct model *m, enum dtype kvt, const char *name, const int32_t *prompt, int n_prompt,
                   const int32_t *ref_t, const float *ref_l, int vocab, int free_run, struct backend *be) {
  int32_t *t = malloc(sizeof(int32_t) * MAXTOK);
  float *l = malloc(sizeof(float) * GEN * vocab);
  double *lp = malloc(sizeof(double) * vocab), *lq = malloc(sizeof(double) * vocab);
  int rc = run(m, kvt, prompt, n_prompt, ref_t, t, l, vocab);
  CHECK(rc == 0, "%s: %s run: %s", name, dtype_name(kvt), err_last());
  int agree = 0;
  double kl = 0, kl_max = 0;
  for (int g = 0; rc == 0 && g < GEN; g++) {
    const float *a = ref_l + (size_t)g * vocab, *b = l + (size_t)g * vocab;
    agree += argmax(a, vocab) == argmax(b, vocab);
    log_softmax(lp, a, vocab);
    log_softmax(lq, b, vocab);
    double k = 0;
    for (int i = 0; i < vocab; i++)
      k += exp(lp[i]) * (lp[i] - lq[i]);
    kl += k;
    kl_max = k > kl_max ? k : kl_max;
  }
  kl /= GEN;
  int same = -1;
  if (rc == 0 && free_run) {
    rc = run(m, kvt, prompt, n_prompt, NULL, t, l, vocab); /* free-running */
    same = 0;
    while (rc == 0 && same < GEN && t[n_prompt + same] == ref_t[n_prompt + same])
      same++;
  }
  if (rc == 0) {
    printf("  %-12s %-7s greedy agreement %d/%d = %.2f%%, mean KL %.3g nats (max %.3g)", name, dtype_name(kvt), agree,
           GEN, 100.0 * agree / GEN, kl, kl_max);
    if (same >= 0)
      printf(", free-running greedy identical for %d/%d tokens", same, GEN);
    printf(" (reference cache %s)\n", dtype_name(be->act_dtype));
  }
  free(t), free(l), free(lp), free(lq);
  if (rc == 0 && kvt == DTYPE_F8E4M3) {
    if (!strcmp(name, "stories260K"))
      CHECK(agree >= 0.95 * GEN, "%s: f8e4m3 greedy agreement %d/%d below 95%%", name, agree, GEN);
    CHECK(kl < 0.02 && kl > 0, "%s: f8e4m3 mean KL %g outside (0, 0.02)", name, kl);
  }
  return rc;
}

static void measure(struct backend *be, const char *name, const char *path, const int32_t *prompt, int n_prompt) {
  struct model *m = model_load(path, be);
  CHECK(m != NULL, "%s: load: %s", name, err_last());
  if (!m)
    return;
  int vocab = model_get_config(m)->vocab_size;
  if (model_alloc_workspace(m, 8, 1, MAX_BLOCKS)) {
    CHECK(0, "%s: workspace: %s", name, err_last());
    model_free(m);
    return;
  }
  int32_t *ref_t = malloc(sizeof(int32_t) * MAXTOK);
  float *ref_l = malloc(sizeof(float) * GEN * vocab);
  int rc = run(m, be->act_dtype, prompt, n_prompt, NULL, ref_t, ref_l, vocab);
  CHECK(rc == 0, "%s: reference run: %s", name, err_last());
  if (rc == 0)
    rc = compare(m, DTYPE_F8E4M3, name, prompt, n_prompt, ref_t, ref_l, vocab, 1, be);
  /* The yardstick: what a 16-bit cache loses on the same steps, where the backend has one. */
  if (rc == 0 && be->act_dtype == DTYPE_F32 && backend_kv_dtype_ok(be, DTYPE_F16))
    compare(m, DTYPE_F16, name, prompt, n_prompt, ref_t, ref_l, vocab, 0, be);
  free(ref_t), free(ref_l);
  model_free(m);
}

/* The fixtures' tokens.json: a flat JSON list of ids. */
static int read_ids(const char *path, int32_t *ids, int max) {
  size_t len;
  char *s = test_read_file(path, &len);
  if (!s)
    return 0;
  int n = 0;
  for (char *p = s; *p && n < max; p++)
    if (*p >= '0' && *p <= '9')
      ids[n++] = (int32_t)strtol(p, &p, 10), p--;
  free(s);
  return n;
}

int main(void) {
  const char *dev = getenv("PAGODA_KV_F8_DEVICE");
  struct backend *be = dev && strcmp(dev, "cpu") ? backend_create(&(struct backend_params){.device = dev})
                                                 : backend_cpu_create(2);
  if (!be)
    return test_skip(err_last());
  const char *stories = test_shared_path("models/stories260K.gguf");
  if (stories) {
    int32_t bos[1] = {1};
    measure(be, "stories260K", stories, bos, 1);
  }
  /* The default model (trained, Llama architecture, head_dim 64, Q4_1 weights): a chat prompt.
   * Not in the ASan+UBSan build (a Debug build: its 30 layers x 768 steps take over 10 minutes);
   * the release run of the same test measures it. */
#ifdef __SANITIZE_ADDRESS__
  printf("  SmolLM2-135M: skipped in the sanitizer build (the release build measures it)\n");
#else
  const char *smol = pagoda_default_model();
  FILE *sf = fopen(smol, "rb");
  if (sf) {
    fclose(sf);
    static const int32_t chat[] = {1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 28, 284, 732,
                                   314, 357, 4248, 327, 47, 2, 198, 1, 520, 9531, 198};
    measure(be, "SmolLM2-135M", smol, chat, (int)(sizeof chat / sizeof *chat));
  } else
    printf("  SmolLM2-135M: %s not found (scripts/setup.sh --model fetches it), skipped\n", smol);
#endif
  static const char *fixtures[] = {"llama", "llama3", "llama_hd", "mistral", "qwen2", "llama_bf16"};
  for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
    char rel[64];
    int32_t prompt[64];
    snprintf(rel, sizeof rel, "%s/tokens.json", fixtures[i]);
    int n = read_ids(test_fixture_path(rel), prompt, 32);
    CHECK(n > 0, "%s: no prompt", rel);
    if (n > 0)
      measure(be, fixtures[i], test_fixture_path(fixtures[i]), prompt, n);
  }
  be->ops->destroy(be);
  return test_finish("test_kv_f8");
}
