/* rng.h - per-request random numbers: xoshiro256** seeded through splitmix64. */
#ifndef PAGODA_RNG_H
#define PAGODA_RNG_H

#include <stdint.h>

/* Each sequence owns one: its draws depend only on its seed and how many tokens it sampled,
 * never on what else ran in the same batch. */
struct rng {
  uint64_t s[4];
};

void rng_seed(struct rng *r, uint64_t seed);
uint64_t rng_next(struct rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double rng_uniform(struct rng *r);

#endif
