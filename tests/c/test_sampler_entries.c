/* test_sampler_entries.c - the logits processors as per-token entries (what the engine hands a
 * device through backend_ops.process): sampler_proc_entries followed by sampler_apply_entries
 * (the CPU reference of the device op) must give bitwise the logits of
 * sampler_apply_processors, for random histories (repeated tokens), logit_bias with repeated
 * ids, repetition penalties above and below 1, presence / frequency penalties of both signs,
 * suppression and their combination; each row's entries name distinct tokens; the sampler's
 * scratch is left zeroed (a second round on the same sampler gives the same result). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "sampling/sampler.h"
#include "test_util.h"

#define VOCAB 300
#define ROWS 8

static uint64_t seed = 12345;

static int rnd(int lo, int hi) { return lo + (int)(test_rand(&seed) % (uint64_t)(hi - lo + 1)); }

static void round_of(struct sampler *s, int kind) {
  float logits[ROWS][VOCAB], want[ROWS][VOCAB], got[ROWS][VOCAB];
  int32_t prompt[ROWS][64], output[ROWS][64], bias_ids[ROWS][12], sup[ROWS][3];
  float bias_values[ROWS][12];
  int np[ROWS], no[ROWS];
  struct sampler_params sp[ROWS];
  struct backend_proc_entry ent[ROWS * (12 + 64 + 64 + 3)];
  float bias[ROWS * 12];
  int ne = 0, nb = 0;
  for (int r = 0; r < ROWS; r++) {
    for (int v = 0; v < VOCAB; v++)
      logits[r][v] = (test_randf(&seed) - 0.5f) * 20.0f;
    np[r] = rnd(1, 64);
    no[r] = rnd(0, 64);
    for (int i = 0; i < np[r]; i++)
      prompt[r][i] = rnd(0, 40);
    for (int i = 0; i < no[r]; i++)
      output[r][i] = rnd(0, 40);
    int num_bias = kind & 1 ? rnd(1, 12) : 0;
    for (int i = 0; i < num_bias; i++) {
      bias_ids[r][i] = i && rnd(0, 2) == 0 ? bias_ids[r][i - 1] : rnd(0, VOCAB - 1);
      bias_values[r][i] = (test_randf(&seed) - 0.5f) * 30.0f;
    }
    int n_sup = kind & 8 ? rnd(1, 3) : 0;
    for (int i = 0; i < n_sup; i++)
      sup[r][i] = rnd(0, 40);
    sp[r] = (struct sampler_params){.temperature = 1, .top_p = 1,
                                    .repetition_penalty = kind & 2 ? (r % 2 ? 1.3f : 0.7f) : 1.0f,
                                    .presence_penalty = kind & 4 ? 0.4f : 0,
                                    .frequency_penalty = kind & 4 ? (r % 2 ? 0.3f : -0.6f) : 0,
                                    .bias_ids = bias_ids[r], .bias_values = bias_values[r], .num_bias = num_bias,
                                    .suppress_ids = sup[r], .num_suppress = n_sup};
    memcpy(want[r], logits[r], sizeof want[r]);
    sampler_apply_processors(s, &sp[r], want[r], prompt[r], np[r], output[r], no[r]);
    int n = sampler_proc_entries(s, &sp[r], prompt[r], np[r], output[r], no[r], r, ent + ne, bias, nb);
    for (int i = 0; i < n; i++) /* distinct tokens within a row */
      for (int j = 0; j < i; j++)
        CHECK(ent[ne + i].id != ent[ne + j].id, "kind %d row %d: token %d has two entries", kind, r, ent[ne + i].id);
    ne += n;
    nb += num_bias;
  }
  memcpy(got, logits, sizeof got);
  sampler_apply_entries(&got[0][0], VOCAB, ent, ne, bias);
  int bad = 0;
  for (int r = 0; r < ROWS; r++)
    for (int v = 0; v < VOCAB; v++)
      bad += memcmp(&got[r][v], &want[r][v], sizeof(float)) != 0;
  CHECK(bad == 0, "kind %d: %d logits differ from sampler_apply_processors", kind, bad);
  if (kind == 0)
    CHECK(ne == 0, "no processors: %d entries", ne);
}

int main(void) {
  struct sampler s;
  REQUIRE(sampler_init(&s, VOCAB) == 0, "init");
  for (int round = 0; round < 3; round++) /* the scratch must come back zeroed */
    for (int kind = 0; kind < 16; kind++)
      round_of(&s, kind);
  sampler_free(&s);
  return test_finish("test_sampler_entries");
}
