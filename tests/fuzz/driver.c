/* driver.c - a small mutation fuzzer that runs fuzz_one() over seeds and their mutations.
 * Built into every fuzz target in the ASan+UBSan build; a crash or sanitizer report fails
 * the test. Usage: fuzz_NAME [-runs=N] [-seed=S] [SEED_DIR_OR_FILE...] */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../test_util.h"

int fuzz_one(const uint8_t *data, size_t size);
/* Optional: a target may add generated seeds (weak, so targets without it link). */
void fuzz_seeds(void (*add)(const uint8_t *data, size_t size)) __attribute__((weak));

#define MAX_SEEDS 256
#define MAX_LEN (1u << 20)

static uint8_t *seeds[MAX_SEEDS];
static size_t seed_len[MAX_SEEDS];
static int n_seeds;

static void add_seed(const uint8_t *data, size_t size) {
  if (n_seeds >= MAX_SEEDS || size > MAX_LEN)
    return;
  seeds[n_seeds] = malloc(size ? size : 1);
  memcpy(seeds[n_seeds], data, size);
  seed_len[n_seeds++] = size;
}

static void load_path(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0)
    return;
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (e->d_name[0] == '.')
        continue;
      char sub[4096];
      snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
      load_path(sub);
    }
    if (d)
      closedir(d);
    return;
  }
  size_t n;
  char *buf = test_read_file(path, &n);
  if (buf) {
    add_seed((uint8_t *)buf, n);
    free(buf);
  }
}

static uint64_t rng;

static size_t mutate(uint8_t *buf, size_t len, size_t cap) {
  int n_mut = 1 + (int)(test_rand(&rng) % 8);
  for (int m = 0; m < n_mut; m++) {
    uint64_t r = test_rand(&rng);
    size_t pos = len ? (size_t)(r >> 16) % len : 0;
    switch (r % 7) {
    case 0: /* flip a bit */
      if (len)
        buf[pos] ^= (uint8_t)(1u << ((r >> 8) & 7));
      break;
    case 1: /* random byte */
      if (len)
        buf[pos] = (uint8_t)(r >> 8);
      break;
    case 2: /* interesting value */
      if (len) {
        static const uint8_t vals[] = {0, 1, 0x7f, 0x80, 0xff, 0xfe, 0x20, 0x0a};
        buf[pos] = vals[(r >> 8) % sizeof vals];
      }
      break;
    case 3: /* truncate */
      len = pos;
      break;
    case 4: /* insert a byte */
      if (len < cap) {
        memmove(buf + pos + 1, buf + pos, len - pos);
        buf[pos] = (uint8_t)(r >> 8);
        len++;
      }
      break;
    case 5: /* write a random 32-bit little-endian integer */
      if (len >= 4) {
        pos = pos > len - 4 ? len - 4 : pos;
        uint32_t v = (uint32_t)(test_rand(&rng) >> ((r >> 8) % 32));
        memcpy(buf + pos, &v, 4);
      }
      break;
    default: /* duplicate a chunk */
      if (len && len < cap) {
        size_t src = (size_t)(test_rand(&rng) % len);
        size_t n = 1 + (size_t)(test_rand(&rng) % 16);
        if (src + n > len)
          n = len - src;
        if (len + n > cap)
          n = cap - len;
        uint8_t chunk[16];
        memcpy(chunk, buf + src, n);
        memmove(buf + pos + n, buf + pos, len - pos);
        memcpy(buf + pos, chunk, n);
        len += n;
      }
      break;
    }
  }
  return len;
}

int main(int argc, char **argv) {
  long runs = 10000;
  rng = 0x1234567u;
  for (int i = 1; i < argc; i++) {
    if (strncmp(argv[i], "-runs=", 6) == 0)
      runs = atol(argv[i] + 6);
    else if (strncmp(argv[i], "-seed=", 6) == 0)
      rng = strtoull(argv[i] + 6, NULL, 0);
    else
      load_path(argv[i]);
  }
  if (fuzz_seeds)
    fuzz_seeds(add_seed);
  if (n_seeds == 0) {
    static const uint8_t empty[1] = {0};
    add_seed(empty, 0);
  }
  for (int i = 0; i < n_seeds; i++)
    fuzz_one(seeds[i], seed_len[i]);
  size_t cap = MAX_LEN + 4096;
  uint8_t *buf = malloc(cap);
  for (long it = 0; it < runs; it++) {
    int s = (int)(test_rand(&rng) % (uint64_t)n_seeds);
    size_t len = seed_len[s];
    memcpy(buf, seeds[s], len);
    len = mutate(buf, len, cap);
    /* Copy to an exact-size allocation so ASan sees reads past the end. */
    uint8_t *exact = malloc(len ? len : 1);
    memcpy(exact, buf, len);
    fuzz_one(exact, len);
    free(exact);
  }
  free(buf);
  for (int i = 0; i < n_seeds; i++)
    free(seeds[i]);
  printf("fuzz: %ld runs over %d seeds, no crash\n", runs, n_seeds);
  return 0;
}
