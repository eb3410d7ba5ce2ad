/* test_util.c - assertion bookkeeping, fixture paths and small numeric helpers for tests. */
#include "test_util.h"

#include "pagoda.h"

#include <math.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

int test_failures = 0;

int test_finish(const char *name) {
  if (test_failures == 0) {
    printf("%s: all checks passed\n", name);
    return 0;
  }
  printf("%s: %d check(s) failed\n", name, test_failures);
  return 1;
}

int test_skip(const char *why) {
  printf("SKIPPED: %s\n", why);
  return TEST_SKIP_CODE;
}

static const char *join_env(const char *var, const char *fallback, const char *rel) {
  static char buf[4][4096];
  static int slot = 0;
  const char *base = getenv(var);
  if (!base || !*base)
    base = fallback;
  char *out = buf[slot++ & 3];
  snprintf(out, sizeof buf[0], "%s/%s", base, rel);
  return out;
}

const char *test_shared_path(const char *rel) {
  const char *p = join_env("PAGODA_TESTDATA", "../shared/testdata", rel);
  struct stat st;
  if (stat(p, &st) != 0) {
    fprintf(stderr, "shared test data not found: %s\n", p);
    return NULL;
  }
  return p;
}

int test_stories_params(struct pagoda_engine_params *p, int max_num_seqs, int max_model_len) {
  const char *model = test_shared_path("models/stories260K.gguf");
  if (!model)
    return -1;
  pagoda_engine_params_default(p);
  p->model = model;
  p->device = "cpu";
  p->threads = 1;
  p->max_num_seqs = max_num_seqs;
  p->max_model_len = max_model_len;
  p->pa_memory_mb = 16;
  p->cache_type = PAGODA_CACHE_TYPE_F32;
  return 0;
}

const char *test_fixture_path(const char *rel) {
  return join_env("PAGODA_FIXTURES", "tests/fixtures", rel);
}

char *test_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf) {
    buf[n] = 0;
    if (len)
      *len = (size_t)n;
  }
  return buf;
}

double test_rel_l2(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * (double)b[i];
  }
  if (den == 0)
    return num == 0 ? 0 : INFINITY;
  double r = sqrt(num / den);
  return isnan(r) ? INFINITY : r;
}

uint64_t test_rand(uint64_t *s) {
  uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

float test_randf(uint64_t *s) {
  return (float)((test_rand(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

void test_loopback_address(char *out, size_t cap) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len)) {
    perror("test_loopback_address");
    exit(1);
  }
  snprintf(out, cap, "127.0.0.1:%d", ntohs(a.sin_port));
  close(fd);
}
