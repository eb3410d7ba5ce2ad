/* test_hub.c - repo ids and resolution from a Hugging Face cache built by hand in huggingface_hub's
 * layout (HF_HUB_OFFLINE=1: no network). Downloads are tested in tests/py/test_hub.py. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hub/hub.h"
#include "pagoda.h"
#include "test_util.h"

static char root[256];

static void mkdir_p(const char *path) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      mkdir(buf, 0755);
      *p = '/';
    }
  mkdir(buf, 0755);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

/* blobs/<etag> holding TEXT, and snapshots/<sha>/<name> -> ../../blobs/<etag> */
static void put(const char *repo_dir, const char *sha, const char *name, const char *etag, const char *text) {
  char p[1024], l[1024], t[512];
  snprintf(p, sizeof p, "%s/blobs", repo_dir);
  mkdir_p(p);
  snprintf(p, sizeof p, "%s/blobs/%s", repo_dir, etag);
  write_file(p, text);
  snprintf(p, sizeof p, "%s/snapshots/%s", repo_dir, sha);
  mkdir_p(p);
  snprintf(l, sizeof l, "%s/snapshots/%s/%s", repo_dir, sha, name);
  snprintf(t, sizeof t, "../../blobs/%s", etag);
  unlink(l);
  CHECK(symlink(t, l) == 0, "symlink %s: %s", l, strerror(errno));
}

static void set_ref(const char *repo_dir, const char *rev, const char *sha) {
  char p[1024];
  snprintf(p, sizeof p, "%s/refs", repo_dir);
  mkdir_p(p);
  snprintf(p, sizeof p, "%s/refs/%s", repo_dir, rev);
  write_file(p, sha);
}

static int resolves_to(const char *model, const char *rev, const char *file, const char *want_rel) {
  char *path = NULL;
  int st = pagoda_resolve_model(model, rev, file, &path);
  char want[1024];
  snprintf(want, sizeof want, "%s/%s", root, want_rel);
  int ok = st == PAGODA_OK && path && !strcmp(path, want);
  CHECK(ok, "%s rev %s file %s: status %d, path %s (%s), want %s", model, rev ? rev : "-", file ? file : "-", st,
        path ? path : "-", pagoda_last_error(), want);
  free(path);
  return ok;
}

static int fails_with(const char *model, const char *rev, const char *file, int status, const char *words) {
  char *path = NULL;
  int st = pagoda_resolve_model(model, rev, file, &path);
  int ok = st == status && !path && strstr(pagoda_last_error(), words);
  CHECK(ok, "%s rev %s file %s: status %d (want %d), message '%s' (want '%s')", model, rev ? rev : "-",
        file ? file : "-", st, status, pagoda_last_error(), words);
  free(path);
  return ok;
}

#define SHA1 "1111111111111111111111111111111111111111"
#define SHA2 "2222222222222222222222222222222222222222"

int main(void) {
  /* repo ids */
  const char *good[] = {"microsoft/Phi-3-mini-128k-instruct", "org/name", "a_b/c.d-e", "Qwen/Qwen2.5-7B-Instruct"};
  const char *bad[] = {"name", "/abs/path", "a/b/c", "org/", "/name", "a--b/c", "a/b..c", "./x", "org/model.gguf",
                       "org/config.json", "org/x.safetensors", "org/na me", "org/na:me", ""};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++)
    CHECK(hub_is_repo_id(good[i]), "'%s' is a repo id", good[i]);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    CHECK(!hub_is_repo_id(bad[i]), "'%s' is not a repo id", bad[i]);

  snprintf(root, sizeof root, "/tmp/pagoda_test_hub_%d", (int)getpid());
  char cache[512], d[600];
  snprintf(cache, sizeof cache, "%s/hub", root);
  mkdir_p(cache);
  unsetenv("HF_HOME");
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HUGGINGFACE_HUB_CACHE");
  setenv("HF_HUB_CACHE", cache, 1);
  setenv("HF_HUB_OFFLINE", "1", 1);
  setenv("HF_ENDPOINT", "http://127.0.0.1:1", 1); /* never contacted */

  /* safetensors, sharded: refs/main -> SHA1; refs/v2 -> SHA2 with a single model.safetensors */
  snprintf(d, sizeof d, "%s/models--org--st", cache);
  set_ref(d, "main", SHA1 "\n");
  put(d, SHA1, "config.json", "c1", "{}");
  put(d, SHA1, "tokenizer.json", "t1", "{}");
  put(d, SHA1, "model.safetensors.index.json", "i1",
      "{\"weight_map\": {\"a\": \"model-1.safetensors\", \"b\": \"model-2.safetensors\", "
      "\"c\": \"model-1.safetensors\"}}");
  put(d, SHA1, "model-1.safetensors", "s1", "x");
  /* the index names model-2.safetensors, which the snapshot lacks */
  fails_with("org/st", NULL, NULL, PAGODA_ERR_NOT_FOUND, "model-2.safetensors is not in the cache");
  put(d, SHA1, "model-2.safetensors", "s2", "y");
  resolves_to("org/st", NULL, NULL, "hub/models--org--st/snapshots/" SHA1);
  resolves_to("org/st", "main", NULL, "hub/models--org--st/snapshots/" SHA1);
  resolves_to("org/st", SHA1, NULL, "hub/models--org--st/snapshots/" SHA1);
  set_ref(d, "v2", SHA2);
  put(d, SHA2, "config.json", "c1", "{}");
  put(d, SHA2, "model.safetensors", "s3", "z");
  resolves_to("org/st", "v2", NULL, "hub/models--org--st/snapshots/" SHA2);
  fails_with("org/st", "v3", NULL, PAGODA_ERR_NOT_FOUND, "org/st at revision v3 is not in the Hugging Face cache");
  fails_with("org/st", "../x", NULL, PAGODA_ERR_INVALID_ARG, "--revision");
  fails_with("org/other", NULL, NULL, PAGODA_ERR_NOT_FOUND, "HF_HUB_OFFLINE");

  /* GGUF: one file needs no --hf-file; two need it */
  snprintf(d, sizeof d, "%s/models--org--gg", cache);
  set_ref(d, "main", SHA1);
  put(d, SHA1, "m-Q8_0.gguf", "g1", "GGUF");
  put(d, SHA1, "README.md", "r1", "#");
  resolves_to("org/gg", NULL, NULL, "hub/models--org--gg/snapshots/" SHA1 "/m-Q8_0.gguf");
  put(d, SHA1, "m-Q4_K_M.gguf", "g2", "GGUF");
  fails_with("org/gg", NULL, NULL, PAGODA_ERR_INVALID_ARG, "pick one with --hf-file NAME (m-Q4_K_M.gguf, m-Q8_0.gguf)");
  resolves_to("org/gg", NULL, "m-Q4_K_M.gguf", "hub/models--org--gg/snapshots/" SHA1 "/m-Q4_K_M.gguf");
  fails_with("org/gg", NULL, "m-f16.gguf", PAGODA_ERR_NOT_FOUND, "m-f16.gguf is not a file of org/gg");
  fails_with("org/gg", NULL, "../../x.gguf", PAGODA_ERR_INVALID_ARG, "--hf-file");

  /* the cache directory as huggingface_hub finds it: ~ expanded; HF_HOME/hub; XDG_CACHE_HOME */
  setenv("HOME", root, 1);
  setenv("HF_HUB_CACHE", "~/hub", 1);
  resolves_to("org/gg", NULL, "m-Q8_0.gguf", "hub/models--org--gg/snapshots/" SHA1 "/m-Q8_0.gguf");
  unsetenv("HF_HUB_CACHE");
  setenv("HF_HOME", root, 1);
  resolves_to("org/gg", NULL, "m-Q8_0.gguf", "hub/models--org--gg/snapshots/" SHA1 "/m-Q8_0.gguf");
  unsetenv("HF_HOME");
  setenv("XDG_CACHE_HOME", root, 1); /* -> root/huggingface/hub: not there */
  fails_with("org/gg", NULL, NULL, PAGODA_ERR_NOT_FOUND, "/huggingface/hub)");
  unsetenv("XDG_CACHE_HOME");
  fails_with("org/gg", NULL, NULL, PAGODA_ERR_NOT_FOUND, "/.cache/huggingface/hub)");
  setenv("HF_HUB_CACHE", cache, 1);

  /* a local path wins, even one shaped like a repo id */
  char cwd[512];
  CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
  CHECK(chdir(root) == 0, "chdir");
  mkdir_p("org/gg");
  char *path = NULL;
  CHECK(pagoda_resolve_model("org/gg", NULL, NULL, &path) == PAGODA_OK && path && !strcmp(path, "org/gg"),
        "local org/gg: %s", path ? path : pagoda_last_error());
  free(path);
  path = NULL;
  CHECK(pagoda_resolve_model("org/gg", NULL, "f.gguf", &path) == PAGODA_OK && path && !strcmp(path, "org/gg/f.gguf"),
        "local org/gg + file: %s", path ? path : pagoda_last_error());
  free(path);
  fails_with("no/such/dir", NULL, NULL, PAGODA_ERR_NOT_FOUND, "no such file or directory");
  CHECK(chdir(cwd) == 0, "chdir back");

  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  CHECK(system(cmd) == 0, "cleanup");
  return test_finish("test_hub");
}
