/* hub.c - Hugging Face repo ids: the huggingface_hub cache layout and downloads with libcurl.
 * Layout, URLs and environment: hub.h. */
#include "hub/hub.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "pagoda.h"
#include "util/file.h"
#include "util/log.h"

#define HUB_ATTEMPTS 3                    /* tries per file within one run (each resumes) */
#define HUB_API_MAX (64u << 20)           /* largest API answer accepted */

/* ------------------------------------------------------------------------------------------- */
/* small helpers */

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0)
    s = NULL;
  va_end(ap);
  if (!s)
    ERR("out of memory");
  return s;
}

static int has_suffix(const char *s, const char *suf) {
  size_t n = strlen(s), m = strlen(suf);
  return n >= m && !strcmp(s + n - m, suf);
}

static int env_true(const char *name) {
  const char *v = getenv(name);
  return v && (!strcmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "yes") || !strcasecmp(v, "true"));
}

static const char *env_nonempty(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

static int is_commit_sha(const char *s) {
  if (strlen(s) != 40)
    return 0;
  for (const char *p = s; *p; p++)
    if (!isxdigit((unsigned char)*p) || isupper((unsigned char)*p))
      return 0;
  return 1;
}

/* mkdir -p of the directory part of PATH (everything before the last '/'). */
static int mkdirs_for(const char *path) {
  char *d = strdup(path);
  if (!d)
    return ERR("out of memory");
  char *slash = strrchr(d, '/');
  if (!slash) {
    free(d);
    return 0;
  }
  *slash = 0;
  for (char *p = d + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = 0;
    if (mkdir(d, 0755) && errno != EEXIST) {
      int rc = ERR("cannot create %s: %s (set HF_HUB_CACHE to a writable directory)", d, strerror(errno));
      free(d);
      return rc;
    }
    *p = '/';
  }
  int rc = 0;
  if (mkdir(d, 0755) && errno != EEXIST)
    rc = ERR("cannot create %s: %s (set HF_HUB_CACHE to a writable directory)", d, strerror(errno));
  free(d);
  return rc;
}

int hub_is_repo_id(const char *s) {
  const char *slash = strchr(s, '/');
  if (!slash || slash == s || !slash[1] || strchr(slash + 1, '/') || strlen(s) > 96)
    return 0;
  for (const char *p = s; *p; p++)
    if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.' && *p != '/')
      return 0;
  if (strstr(s, "--") || strstr(s, "..") || s[0] == '.' || s[0] == '-' || slash[1] == '.' || slash[1] == '-')
    return 0;
  static const char *const file_suffixes[] = {".gguf", ".json", ".safetensors", ".bin", ".git"};
  for (size_t i = 0; i < sizeof file_suffixes / sizeof *file_suffixes; i++)
    if (has_suffix(s, file_suffixes[i]))
      return 0;
  return 1;
}

/* ------------------------------------------------------------------------------------------- */
/* the context of one resolution */

struct sibling {
  char *name;
  long long size; /* -1: unknown */
  char *etag;     /* the LFS sha256, else the git blob id */
  int lfs;
};

struct hub {
  const char *repo, *rev, *file;
  char *cache;     /* the hub cache directory */
  char *repo_dir;  /* <cache>/models--org--name */
  char *lock_dir;  /* <cache>/.locks/models--org--name */
  char *endpoint;  /* no trailing '/' */
  char *token;     /* NULL: anonymous */
  int offline;
  /* online: the API's answer */
  char *sha;
  struct sibling *sib;
  int num_sib;
  /* offline: the names in the cached snapshot (top level) */
  char **names;
  int num_names;
  CURL *curl;
};

/* $NAME + SUFFIX with a leading "~/" expanded (as Python's expanduser), or NULL when unset. */
static char *env_path(const char *name, const char *suffix) {
  const char *v = env_nonempty(name), *home = env_nonempty("HOME");
  if (!v)
    return NULL;
  if (v[0] == '~' && (v[1] == '/' || !v[1]) && home)
    return xasprintf("%s%s%s", home, v + 1, suffix);
  return xasprintf("%s%s", v, suffix);
}

/* $HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface; + SUFFIX. */
static char *hf_home(const char *suffix) {
  char *p = env_path("HF_HOME", suffix);
  if (!p && env_nonempty("XDG_CACHE_HOME")) {
    char *s = xasprintf("/huggingface%s", suffix);
    p = s ? env_path("XDG_CACHE_HOME", s) : NULL;
    free(s);
  }
  if (!p && env_nonempty("HOME"))
    p = xasprintf("%s/.cache/huggingface%s", getenv("HOME"), suffix);
  return p;
}

static char *cache_dir(void) {
  char *p = env_path("HF_HUB_CACHE", "");
  if (!p)
    p = env_path("HUGGINGFACE_HUB_CACHE", "");
  if (!p)
    p = hf_home("/hub");
  if (!p)
    ERR("no Hugging Face cache directory: set HF_HUB_CACHE or HOME");
  return p;
}

/* $HF_TOKEN, else the token file huggingface_hub's login writes ($HF_TOKEN_PATH, else
 * $HF_HOME/token, else ~/.cache/huggingface/token). NULL when there is none. */
static char *read_token(void) {
  const char *v = env_nonempty("HF_TOKEN");
  if (!v)
    v = env_nonempty("HUGGING_FACE_HUB_TOKEN");
  char *t = NULL;
  if (v) {
    t = strdup(v);
  } else {
    char *path = env_path("HF_TOKEN_PATH", "");
    if (!path)
      path = hf_home("/token");
    if (path && file_exists(path))
      t = file_read_all(path, NULL);
    free(path);
    err_clear();
  }
  if (!t)
    return NULL;
  char *s = t;
  while (isspace((unsigned char)*s))
    s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1]))
    n--;
  memmove(t, s, n);
  t[n] = 0;
  if (!*t) {
    free(t);
    return NULL;
  }
  return t;
}

static void hub_free(struct hub *h) {
  free(h->cache);
  free(h->repo_dir);
  free(h->lock_dir);
  free(h->endpoint);
  if (h->token) {
    sodium_memzero(h->token, strlen(h->token));
    free(h->token);
  }
  free(h->sha);
  for (int i = 0; i < h->num_sib; i++) {
    free(h->sib[i].name);
    free(h->sib[i].etag);
  }
  free(h->sib);
  for (int i = 0; i < h->num_names; i++)
    free(h->names[i]);
  free(h->names);
  if (h->curl)
    curl_easy_cleanup(h->curl);
}

/* ------------------------------------------------------------------------------------------- */
/* digests */

/* The etag of a file as the hub names it, computed as the bytes arrive: the sha256 of the bytes
 * (LFS) or the git blob id (sha1 of "blob <size>\0" + bytes). OpenSSL's libcrypto: SHA-1, and
 * SHA-256 with the CPU's SHA instructions (5x libsodium's portable SHA-256 here). */
struct digest {
  int lfs;
  long long size, len; /* the expected size (in the git blob header); bytes hashed so far */
  EVP_MD_CTX *ctx;
};

static int digest_init(struct digest *d) {
  d->len = 0;
  if (!d->ctx && !(d->ctx = EVP_MD_CTX_new()))
    return ERR("out of memory");
  if (!EVP_DigestInit_ex(d->ctx, d->lfs ? EVP_sha256() : EVP_sha1(), NULL))
    return ERR("libcrypto: cannot start a %s digest", d->lfs ? "SHA-256" : "SHA-1");
  if (!d->lfs) {
    char head[64];
    int n = snprintf(head, sizeof head, "blob %lld", d->size);
    EVP_DigestUpdate(d->ctx, head, (size_t)n + 1); /* with the NUL */
  }
  return 0;
}

static void digest_update(struct digest *d, const void *p, size_t n) {
  EVP_DigestUpdate(d->ctx, p, n);
  d->len += (long long)n;
}

static void digest_hex(struct digest *d, char hex[65]) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(d->ctx, out, &n);
  sodium_bin2hex(hex, 65, out, n);
}

/* Restarts D over the first N bytes of PATH (a partial download being resumed). */
static int digest_file(struct digest *d, const char *path, long long n) {
  if (digest_init(d))
    return -1;
  if (n == 0)
    return 0;
  int fd = open(path, O_RDONLY);
  int err = errno;
  unsigned char *buf = malloc(1 << 16);
  ssize_t r = 0;
  while (fd >= 0 && buf && d->len < n) {
    long long want = n - d->len < (1 << 16) ? n - d->len : (1 << 16);
    if ((r = read(fd, buf, (size_t)want)) <= 0) {
      err = errno;
      break;
    }
    digest_update(d, buf, (size_t)r);
  }
  if (fd >= 0)
    close(fd);
  free(buf);
  if (d->len != n)
    return ERR("cannot read %s: %s", path,
               !buf ? "out of memory" : r < 0 || fd < 0 ? strerror(err) : "shorter than expected");
  return 0;
}

/* ------------------------------------------------------------------------------------------- */
/* HTTP */

struct http {
  struct hub *h;
  long code;
  char err_code[64], err_msg[512]; /* X-Error-Code / X-Error-Message of the last response */
  /* body to memory */
  char *mem;
  size_t mem_len, mem_cap;
  /* or body to a file, appended from offset OFF */
  int fd;
  long long off, written;
  int started;
  struct digest *dg; /* updated with every byte written (covers [0, off) on entry) */
  /* progress */
  const char *label;
  long long total;
  double last_print;
  int tty;
};

static void copy_header_value(char *dst, size_t cap, const char *v, size_t n) {
  while (n && (*v == ' ' || *v == '\t'))
    v++, n--;
  while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
    n--;
  if (n >= cap)
    n = cap - 1;
  memcpy(dst, v, n);
  dst[n] = 0;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *u) {
  struct http *x = u;
  size_t n = sz * nm;
  if (n >= 5 && !strncmp(p, "HTTP/", 5)) { /* a new response (after a redirect) */
    x->err_code[0] = x->err_msg[0] = 0;
  } else if (n > 13 && !strncasecmp(p, "x-error-code:", 13)) {
    copy_header_value(x->err_code, sizeof x->err_code, p + 13, n - 13);
  } else if (n > 16 && !strncasecmp(p, "x-error-message:", 16)) {
    copy_header_value(x->err_msg, sizeof x->err_msg, p + 16, n - 16);
  }
  return n;
}

static size_t on_body(char *p, size_t sz, size_t nm, void *u) {
  struct http *x = u;
  size_t n = sz * nm;
  long code = 0;
  curl_easy_getinfo(x->h->curl, CURLINFO_RESPONSE_CODE, &code);
  if (x->fd >= 0) {
    if (code != 200 && code != 206)
      return n; /* an error page: the status says what went wrong */
    if (!x->started) {
      x->started = 1;
      if (code == 200 && x->off > 0) { /* the server ignored the Range: start over */
        if (ftruncate(x->fd, 0))
          return 0;
        x->off = 0;
        if (x->dg && digest_init(x->dg))
          return 0;
      }
    }
    for (size_t done = 0; done < n;) {
      ssize_t w = write(x->fd, p + done, n - done);
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0)
        return 0;
      if (x->dg)
        digest_update(x->dg, p + done, (size_t)w);
      done += (size_t)w;
    }
    x->written += (long long)n;
    return n;
  }
  if (x->mem_len + n + 1 > x->mem_cap) {
    size_t cap = x->mem_cap ? x->mem_cap : 4096;
    while (cap < x->mem_len + n + 1)
      cap *= 2;
    if (cap > HUB_API_MAX)
      return 0;
    char *m = realloc(x->mem, cap);
    if (!m)
      return 0;
    x->mem = m;
    x->mem_cap = cap;
  }
  memcpy(x->mem + x->mem_len, p, n);
  x->mem_len += n;
  x->mem[x->mem_len] = 0;
  return n;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void print_progress(struct http *x, int final) {
  long long have = x->off + x->written;
  double mib = have / 1048576.0, tot = x->total / 1048576.0;
  int pct = x->total > 0 ? (int)(100.0 * have / x->total) : 0;
  if (x->tty)
    fprintf(stderr, "\r  %s: %.1f / %.1f MiB (%d%%)%s", x->label, mib, tot, pct, final ? "\n" : "");
  else
    fprintf(stderr, "  %s: %.1f / %.1f MiB (%d%%)\n", x->label, mib, tot, pct);
  fflush(stderr);
}

/* A terminal gets one line redrawn 4 times a second; a log, a line every 10 s of a long download
 * and one at the end. */
static int on_progress(void *u, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
  (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
  struct http *x = u;
  if (!x->label)
    return 0;
  double t = now_s();
  if (x->last_print == 0)
    x->last_print = t;
  if (t - x->last_print >= (x->tty ? 0.25 : 10.0)) {
    x->last_print = t;
    print_progress(x, 0);
  }
  return 0;
}

/* GET URL (redirects followed). Body to X's memory buffer, or appended to X->fd from X->off with
 * a Range request when X->off > 0. Returns the curl code; X->code gets the HTTP status. */
static CURLcode http_get(struct hub *h, struct http *x, const char *url) {
  CURL *c = h->curl;
  curl_easy_reset(c);
  x->h = h;
  x->code = 0;
  x->err_code[0] = x->err_msg[0] = 0;
  struct curl_slist *hdr = NULL;
  char *auth = NULL;
  if (h->token) {
    auth = xasprintf("Authorization: Bearer %s", h->token);
    if (!auth)
      return CURLE_OUT_OF_MEMORY;
    hdr = curl_slist_append(hdr, auth);
  }
  char range[64];
  if (x->fd >= 0 && x->off > 0) {
    snprintf(range, sizeof range, "%lld-", x->off);
    curl_easy_setopt(c, CURLOPT_RANGE, range);
  }
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "pagoda/" PAGODA_VERSION " (libcurl)");
  /* the Authorization header is not sent on to another host after a redirect (libcurl's rule
   * for custom auth headers since 7.58): the hub redirects large files to its CDN */
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 20L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L); /* stalled for 60 s: give up (resumable) */
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, x->fd >= 0 ? "identity" : "");
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L << 10); /* fewer, larger writes and digest updates */
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, x);
  CURLcode rc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &x->code);
  curl_slist_free_all(hdr);
  if (auth) {
    sodium_memzero(auth, strlen(auth));
    free(auth);
  }
  return rc;
}

/* A transport failure that a cached snapshot (or a later run) can get around. */
static int is_network_error(CURLcode rc) {
  switch (rc) {
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_RESOLVE_PROXY:
  case CURLE_COULDNT_CONNECT:
  case CURLE_OPERATION_TIMEDOUT:
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_SEND_ERROR:
  case CURLE_RECV_ERROR:
  case CURLE_GOT_NOTHING:
  case CURLE_PARTIAL_FILE:
  case CURLE_HTTP2:
  case CURLE_HTTP2_STREAM:
    return 1;
  default:
    return 0;
  }
}

/* The error for a failed request: WHAT names the thing asked for. Returns a pagoda_status. */
static int http_error(struct hub *h, struct http *x, CURLcode rc, const char *what, const char *url) {
  if (rc != CURLE_OK) {
    ERR("cannot reach %s for %s: %s (check the network and HF_ENDPOINT; HF_HUB_OFFLINE=1 uses only the "
        "cache)", h->endpoint, what, curl_easy_strerror(rc));
    return PAGODA_ERR_IO;
  }
  const char *ec = x->err_code, *em = x->err_msg[0] ? x->err_msg : "no message";
  if (!strcmp(ec, "RepoNotFound") || (x->code == 404 && !ec[0])) {
    ERR("repository %s not found on %s (HTTP %ld: %s), and no local file or directory has that name; if the "
        "repository is private or gated, %s", h->repo, h->endpoint, x->code, em,
        h->token ? "check that HF_TOKEN can read it" : "set HF_TOKEN to a token that can read it");
    return PAGODA_ERR_NOT_FOUND;
  }
  if (!strcmp(ec, "RevisionNotFound")) {
    ERR("revision '%s' not found in %s (HTTP %ld: %s); check --revision", h->rev, h->repo, x->code, em);
    return PAGODA_ERR_NOT_FOUND;
  }
  if (!strcmp(ec, "EntryNotFound")) {
    ERR("%s not found (HTTP %ld: %s)", what, x->code, em);
    return PAGODA_ERR_NOT_FOUND;
  }
  if (!strcmp(ec, "GatedRepo")) {
    ERR("%s is gated (HTTP %ld: %s): accept its conditions on its page at %s/%s and set HF_TOKEN", h->repo, x->code,
        em, h->endpoint, h->repo);
    return PAGODA_ERR_IO;
  }
  if (x->code == 401 || x->code == 403) {
    ERR("access to %s denied (HTTP %ld: %s): %s", what, x->code, em,
        h->token ? "HF_TOKEN was rejected or cannot read this repository"
                 : "set HF_TOKEN to a Hugging Face access token that can read it");
    return PAGODA_ERR_IO;
  }
  ERR("HTTP %ld from %s (%s)", x->code, url, em);
  return PAGODA_ERR_IO;
}

/* ------------------------------------------------------------------------------------------- */
/* the API: commit sha and files of a revision */

static char *url_escape(struct hub *h, const char *s) {
  char *e = curl_easy_escape(h->curl, s, 0);
  char *r = e ? strdup(e) : NULL;
  curl_free(e);
  if (!r)
    ERR("out of memory");
  return r;
}

/* The model API answer for h->rev. Returns 0, a status, or -2 for a network failure (err set). */
static int fetch_info(struct hub *h) {
  char *rev = url_escape(h, h->rev);
  if (!rev)
    return PAGODA_ERR_OUT_OF_MEMORY;
  char *url = xasprintf("%s/api/models/%s/revision/%s?blobs=true", h->endpoint, h->repo, rev);
  free(rev);
  if (!url)
    return PAGODA_ERR_OUT_OF_MEMORY;
  struct http x = {.fd = -1};
  CURLcode rc = http_get(h, &x, url);
  int st = 0;
  char what[256];
  snprintf(what, sizeof what, "repository %s", h->repo);
  if (rc != CURLE_OK || x.code != 200) {
    st = http_error(h, &x, rc, what, url);
    if ((rc != CURLE_OK && is_network_error(rc)) || x.code >= 500) /* the cache may stand in */
      st = -2;
    goto out;
  }
  cJSON *j = cJSON_ParseWithLength(x.mem ? x.mem : "", x.mem_len);
  const cJSON *sha = cJSON_GetObjectItemCaseSensitive(j, "sha");
  const cJSON *sibs = cJSON_GetObjectItemCaseSensitive(j, "siblings");
  if (!cJSON_IsString(sha) || !is_commit_sha(sha->valuestring) || !cJSON_IsArray(sibs)) {
    cJSON_Delete(j);
    st = PAGODA_ERR_FORMAT;
    ERR("%s: the answer is not a model description with a commit sha and siblings", url);
    goto out;
  }
  h->sha = strdup(sha->valuestring);
  int n = cJSON_GetArraySize(sibs);
  h->sib = calloc((size_t)n + 1, sizeof *h->sib);
  if (!h->sha || !h->sib) {
    cJSON_Delete(j);
    st = PAGODA_ERR_OUT_OF_MEMORY;
    ERR("out of memory");
    goto out;
  }
  const cJSON *s;
  cJSON_ArrayForEach(s, sibs) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "rfilename");
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(s, "size");
    const cJSON *blob = cJSON_GetObjectItemCaseSensitive(s, "blobId");
    const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(s, "lfs");
    const cJSON *lsha = cJSON_GetObjectItemCaseSensitive(lfs, "sha256");
    if (!cJSON_IsString(name) || !*name->valuestring || strstr(name->valuestring, "..") ||
        name->valuestring[0] == '/')
      continue;
    struct sibling *d = &h->sib[h->num_sib];
    d->name = strdup(name->valuestring);
    d->size = cJSON_IsNumber(size) ? (long long)size->valuedouble : -1;
    d->lfs = cJSON_IsString(lsha);
    if (d->lfs) {
      const cJSON *lsize = cJSON_GetObjectItemCaseSensitive(lfs, "size");
      if (cJSON_IsNumber(lsize))
        d->size = (long long)lsize->valuedouble;
    }
    d->etag = d->lfs ? strdup(lsha->valuestring) : cJSON_IsString(blob) ? strdup(blob->valuestring) : NULL;
    h->num_sib++;
    if (!d->name) {
      cJSON_Delete(j);
      st = PAGODA_ERR_OUT_OF_MEMORY;
      ERR("out of memory");
      goto out;
    }
  }
  cJSON_Delete(j);
out:
  free(x.mem);
  free(url);
  return st;
}

static struct sibling *find_sibling(struct hub *h, const char *name) {
  for (int i = 0; i < h->num_sib; i++)
    if (!strcmp(h->sib[i].name, name))
      return &h->sib[i];
  return NULL;
}

/* ------------------------------------------------------------------------------------------- */
/* blobs and snapshot links */

/* Downloads sibling S into BLOB (via BLOB.incomplete, resumed when present). */
static int download_blob(struct hub *h, const struct sibling *s, const char *blob) {
  int st = 0;
  char *part = xasprintf("%s.incomplete", blob);
  char *lock = xasprintf("%s/%s.lock", h->lock_dir, s->etag);
  char *file = url_escape(h, s->name);
  char *url = NULL;
  int lfd = -1, fd = -1;
  struct digest dg = {0};
  if (!part || !lock || !file) {
    st = PAGODA_ERR_OUT_OF_MEMORY;
    goto out;
  }
  /* a '/' inside a file name stays a path separator in the URL */
  for (char *p = file; (p = strstr(p, "%2F"));)
    memmove(p + 1, p + 3, strlen(p + 3) + 1), *p = '/';
  if (!(url = xasprintf("%s/%s/resolve/%s/%s", h->endpoint, h->repo, h->sha, file))) {
    st = PAGODA_ERR_OUT_OF_MEMORY;
    goto out;
  }
  if (mkdirs_for(lock) || mkdirs_for(part)) {
    st = PAGODA_ERR_IO;
    goto out;
  }
  if ((lfd = open(lock, O_RDWR | O_CREAT, 0644)) < 0 || flock(lfd, LOCK_EX)) {
    st = PAGODA_ERR_IO;
    ERR("cannot lock %s: %s", lock, strerror(errno));
    goto out;
  }
  if (file_exists(blob)) /* another process finished it while we waited */
    goto out;
  if ((fd = open(part, O_WRONLY | O_CREAT | O_APPEND, 0644)) < 0) {
    st = PAGODA_ERR_IO;
    ERR("cannot write %s: %s (set HF_HUB_CACHE to a writable directory)", part, strerror(errno));
    goto out;
  }
  char label[300];
  snprintf(label, sizeof label, "%s/%s", h->repo, s->name);
  int tty = isatty(2);
  dg.lfs = s->lfs;
  dg.size = s->size;
  dg.len = -1;
  for (int attempt = 1;; attempt++) {
    struct stat sb;
    if (fstat(fd, &sb)) {
      st = PAGODA_ERR_IO;
      ERR("%s: %s", part, strerror(errno));
      goto out;
    }
    if (dg.len != (long long)sb.st_size && digest_file(&dg, part, sb.st_size)) { /* the part so far */
      st = PAGODA_ERR_IO;
      goto out;
    }
    struct http x = {.fd = fd, .off = sb.st_size, .label = label, .total = s->size, .tty = tty, .dg = &dg};
    if (s->size >= 0 && x.off >= s->size) /* complete already: check it below */
      break;
    if (x.off > 0)
      log_info("resuming %s at %.1f of %.1f MiB", label, x.off / 1048576.0, s->size / 1048576.0);
    else
      log_info("downloading %s (%.1f MiB)", label, s->size / 1048576.0);
    CURLcode rc = http_get(h, &x, url);
    if (rc == CURLE_OK && x.code == 416 && x.off > 0) { /* the Range starts at the end: nothing left */
      break;
    }
    if (rc == CURLE_OK && (x.code == 200 || x.code == 206)) {
      print_progress(&x, 1);
      break;
    }
    if (x.written)
      print_progress(&x, 1);
    if (rc != CURLE_OK && is_network_error(rc) && attempt < HUB_ATTEMPTS) {
      log_warn("%s: %s; retrying", label, curl_easy_strerror(rc));
      sleep(1);
      continue;
    }
    char what[400];
    snprintf(what, sizeof what, "file %s in %s at revision %s", s->name, h->repo, h->rev);
    st = http_error(h, &x, rc, what, url);
    if (rc != CURLE_OK)
      ERR("download of %s interrupted at %lld of %lld bytes: %s; run the command again to resume (the part is "
          "kept in %s)", label, x.off + x.written, s->size, curl_easy_strerror(rc), part);
    goto out;
  }
  struct stat sb;
  if (fstat(fd, &sb) || (s->size >= 0 && sb.st_size != s->size)) {
    st = PAGODA_ERR_IO;
    if (s->size >= 0 && sb.st_size > s->size) /* not a prefix of this file: start over next time */
      unlink(part);
    ERR("%s: downloaded %lld bytes, the hub says %lld; run the command again to resume", label,
        (long long)sb.st_size, s->size);
    goto out;
  }
  char hex[65];
  if (dg.len != (long long)sb.st_size && digest_file(&dg, part, sb.st_size)) {
    st = PAGODA_ERR_IO;
    goto out;
  }
  digest_hex(&dg, hex);
  if (strcmp(hex, s->etag)) {
    unlink(part);
    st = PAGODA_ERR_IO;
    ERR("%s: %s %s does not match the hub's %s; the download was removed, run the command again", label,
        s->lfs ? "sha256" : "git blob id", hex, s->etag);
    goto out;
  }
  if (rename(part, blob)) {
    st = PAGODA_ERR_IO;
    ERR("cannot rename %s to %s: %s", part, blob, strerror(errno));
  }
out:
  EVP_MD_CTX_free(dg.ctx);
  if (fd >= 0)
    close(fd);
  if (lfd >= 0)
    close(lfd); /* releases the flock */
  free(part);
  free(lock);
  free(file);
  free(url);
  return st;
}

/* Makes snapshots/<sha>/<name> point at blobs/<etag> (relative, as huggingface_hub does). */
static int link_pointer(const char *pointer, const char *etag, const char *name) {
  int depth = 2; /* snapshots/<sha>/ */
  for (const char *p = name; *p; p++)
    depth += *p == '/';
  char rel[1024];
  size_t o = 0;
  for (int i = 0; i < depth && o + 3 < sizeof rel; i++)
    o += (size_t)snprintf(rel + o, sizeof rel - o, "../");
  snprintf(rel + o, sizeof rel - o, "blobs/%s", etag);
  if (mkdirs_for(pointer))
    return -1;
  /* a link under a private name, renamed over the pointer: atomic when processes race */
  char *tmp = xasprintf("%s.%d.tmp", pointer, (int)getpid());
  if (!tmp)
    return -1;
  unlink(tmp);
  int rc = 0;
  if (symlink(rel, tmp) || rename(tmp, pointer)) {
    rc = ERR("cannot create the link %s: %s", pointer, strerror(errno));
    unlink(tmp);
  }
  free(tmp);
  return rc;
}

/* Has NAME in the snapshot: online, fetched when missing; offline, present or an error. */
static int obtain(struct hub *h, const char *snap, const char *name) {
  char *pointer = xasprintf("%s/%s", snap, name);
  if (!pointer)
    return PAGODA_ERR_OUT_OF_MEMORY;
  int st = 0;
  if (h->offline) {
    if (!file_exists(pointer)) {
      ERR("%s is not in the cached snapshot %s", name, snap);
      st = PAGODA_ERR_NOT_FOUND;
    }
    free(pointer);
    return st;
  }
  struct sibling *s = find_sibling(h, name);
  if (!s) {
    ERR("%s is not a file of %s at revision %s", name, h->repo, h->rev);
    free(pointer);
    return PAGODA_ERR_NOT_FOUND;
  }
  if (!s->etag || !*s->etag || strchr(s->etag, '/')) {
    ERR("%s/api/models/%s: no blob id for %s (the hub's answer lacks blobs=true data)", h->endpoint, h->repo, name);
    free(pointer);
    return PAGODA_ERR_FORMAT;
  }
  char *blob = xasprintf("%s/blobs/%s", h->repo_dir, s->etag);
  if (!blob) {
    free(pointer);
    return PAGODA_ERR_OUT_OF_MEMORY;
  }
  struct stat sb;
  if (!(stat(pointer, &sb) == 0 && (s->size < 0 || sb.st_size == s->size))) {
    if (!file_exists(blob))
      st = download_blob(h, s, blob);
    if (!st && link_pointer(pointer, s->etag, name))
      st = PAGODA_ERR_IO;
  }
  free(blob);
  free(pointer);
  return st;
}

/* ------------------------------------------------------------------------------------------- */
/* which files */

static int have_name(struct hub *h, const char *name) {
  if (!h->offline)
    return find_sibling(h, name) != NULL;
  for (int i = 0; i < h->num_names; i++)
    if (!strcmp(h->names[i], name))
      return 1;
  return 0;
}

static int num_listed(struct hub *h) { return h->offline ? h->num_names : h->num_sib; }
static const char *listed(struct hub *h, int i) { return h->offline ? h->names[i] : h->sib[i].name; }

/* The top-level names ending in SUFFIX, comma separated (for messages), and their count. */
static int list_suffix(struct hub *h, const char *suffix, char *buf, size_t cap, const char **first) {
  int n = 0;
  size_t o = 0;
  buf[0] = 0;
  for (int i = 0; i < num_listed(h); i++) {
    const char *nm = listed(h, i);
    if (strchr(nm, '/') || !has_suffix(nm, suffix))
      continue;
    if (!n && first)
      *first = nm;
    if (o + strlen(nm) + 3 < cap)
      o += (size_t)snprintf(buf + o, cap - o, "%s%s", n ? ", " : "", nm);
    n++;
  }
  return n;
}

/* The shards named by the index's weight_map, each obtained. */
static int obtain_shards(struct hub *h, const char *snap, const char *index) {
  char *path = xasprintf("%s/%s", snap, index);
  if (!path)
    return PAGODA_ERR_OUT_OF_MEMORY;
  size_t len;
  char *text = file_read_all(path, &len);
  if (!text) {
    free(path);
    return PAGODA_ERR_IO;
  }
  cJSON *j = cJSON_ParseWithLength(text, len);
  free(text);
  const cJSON *map = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
  int st = 0;
  if (!cJSON_IsObject(map)) {
    ERR("%s: no weight_map object", path);
    st = PAGODA_ERR_FORMAT;
  }
  const cJSON *e;
  cJSON_ArrayForEach(e, map) {
    if (st)
      break;
    if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || strstr(e->valuestring, "..")) {
      ERR("%s: weight_map entry '%s' is not a file name", path, e->string ? e->string : "");
      st = PAGODA_ERR_FORMAT;
      break;
    }
    int seen = 0; /* the map repeats each shard once per tensor */
    for (const cJSON *p = map->child; p != e && !seen; p = p->next)
      seen = cJSON_IsString(p) && !strcmp(p->valuestring, e->valuestring);
    if (!seen)
      st = obtain(h, snap, e->valuestring);
  }
  cJSON_Delete(j);
  free(path);
  return st;
}

/* Picks and obtains the files; *OUT: the snapshot directory or the selected file. */
static int select_and_obtain(struct hub *h, const char *snap, char **out) {
  char buf[1024];
  const char *first = NULL;
  const char *pick = h->file;
  if (pick) {
    if (!have_name(h, pick)) {
      int n = list_suffix(h, ".gguf", buf, sizeof buf, NULL);
      ERR("%s is not a file of %s at revision %s%s%s%s", pick, h->repo, h->rev, h->offline ? " (in the cache)" : "",
          n ? "; its GGUF files: " : "", buf);
      return PAGODA_ERR_NOT_FOUND;
    }
  } else {
    int num_st = list_suffix(h, ".safetensors", buf, sizeof buf, NULL);
    const char *index = "model.safetensors.index.json";
    if (num_st || have_name(h, index)) {
      if (!have_name(h, "config.json")) {
        ERR("%s has safetensors weights but no config.json", h->repo);
        return PAGODA_ERR_FORMAT;
      }
      static const char *const aux[] = {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                                        "chat_template.json"};
      int st;
      for (size_t i = 0; i < sizeof aux / sizeof *aux; i++)
        if (have_name(h, aux[i]) && (st = obtain(h, snap, aux[i])))
          return st;
      if (have_name(h, "model.safetensors")) {
        if ((st = obtain(h, snap, "model.safetensors")))
          return st;
      } else if (have_name(h, index)) {
        if ((st = obtain(h, snap, index)) || (st = obtain_shards(h, snap, index)))
          return st;
      } else {
        for (int i = 0; i < num_listed(h); i++) {
          const char *nm = listed(h, i);
          if (!strchr(nm, '/') && has_suffix(nm, ".safetensors") && (st = obtain(h, snap, nm)))
            return st;
        }
      }
      *out = strdup(snap);
      return *out ? 0 : (ERR("out of memory"), PAGODA_ERR_OUT_OF_MEMORY);
    }
    int n = list_suffix(h, ".gguf", buf, sizeof buf, &first);
    if (n == 0) {
      ERR("%s at revision %s has no safetensors or GGUF weights%s", h->repo, h->rev,
          h->offline ? " in the cache" : "");
      return PAGODA_ERR_NOT_FOUND;
    }
    if (n > 1) {
      ERR("%s has %d GGUF files: pick one with --hf-file NAME (%s)", h->repo, n, buf);
      return PAGODA_ERR_INVALID_ARG;
    }
    pick = first;
  }
  int st = obtain(h, snap, pick);
  if (st)
    return st;
  *out = xasprintf("%s/%s", snap, pick);
  return *out ? 0 : PAGODA_ERR_OUT_OF_MEMORY;
}

/* ------------------------------------------------------------------------------------------- */

/* The commit sha the cache has for h->rev (refs/<rev>, or rev itself when it is a sha). */
static char *cached_sha(struct hub *h) {
  if (is_commit_sha(h->rev))
    return strdup(h->rev);
  char *ref = xasprintf("%s/refs/%s", h->repo_dir, h->rev);
  if (!ref)
    return NULL;
  char *sha = file_exists(ref) ? file_read_all(ref, NULL) : NULL;
  free(ref);
  err_clear();
  if (sha) {
    size_t n = strlen(sha);
    while (n && isspace((unsigned char)sha[n - 1]))
      sha[--n] = 0;
    if (!is_commit_sha(sha)) {
      free(sha);
      sha = NULL;
    }
  }
  return sha;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Resolution from the cache alone (offline, or the network down). */
static int resolve_cached(struct hub *h, char **out) {
  char *sha = cached_sha(h);
  char *snap = sha ? xasprintf("%s/snapshots/%s", h->repo_dir, sha) : NULL;
  free(sha);
  if (!snap || !file_is_dir(snap)) {
    ERR("%s at revision %s is not in the Hugging Face cache (%s)", h->repo, h->rev, h->cache);
    free(snap);
    return PAGODA_ERR_NOT_FOUND;
  }
  DIR *d = opendir(snap);
  struct dirent *de;
  int cap = 0;
  while (d && (de = readdir(d))) {
    if (de->d_name[0] == '.')
      continue;
    if (h->num_names == cap) {
      cap = cap ? cap * 2 : 16;
      char **n = realloc(h->names, (size_t)cap * sizeof *n);
      if (!n)
        break;
      h->names = n;
    }
    if (!(h->names[h->num_names] = strdup(de->d_name)))
      break;
    h->num_names++;
  }
  if (d)
    closedir(d);
  if (h->num_names > 1) /* readdir order is arbitrary: sorted, for stable choices and messages */
    qsort(h->names, (size_t)h->num_names, sizeof *h->names, cmp_names);
  h->offline = 1;
  if (h->file && !have_name(h, h->file) && file_exists(snap)) { /* a FILE in a subdirectory */
    char *p = xasprintf("%s/%s", snap, h->file);
    if (p && file_exists(p)) {
      *out = p;
      free(snap);
      return 0;
    }
    free(p);
  }
  int st = select_and_obtain(h, snap, out);
  free(snap);
  return st;
}

static int write_ref(struct hub *h) {
  if (!strcmp(h->rev, h->sha))
    return 0;
  char *ref = xasprintf("%s/refs/%s", h->repo_dir, h->rev);
  char *tmp = ref ? xasprintf("%s.%d.tmp", ref, (int)getpid()) : NULL;
  int rc = -1;
  if (tmp && !mkdirs_for(ref)) {
    FILE *f = fopen(tmp, "wb");
    if (f && fputs(h->sha, f) >= 0 && fclose(f) == 0) {
      f = NULL;
      rc = rename(tmp, ref) ? ERR("cannot write %s: %s", ref, strerror(errno)) : 0;
    } else {
      ERR("cannot write %s: %s", tmp, strerror(errno));
      if (f)
        fclose(f);
    }
    if (rc)
      unlink(tmp);
  }
  free(ref);
  free(tmp);
  return rc;
}

static CURLcode curl_init_rc;
static void curl_init_once(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* libcurl's global init once per process (pthread_once: callers may be on any thread). */
static int curl_ready(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, curl_init_once);
  if (curl_init_rc != CURLE_OK)
    return ERR("libcurl failed to initialize: %s", curl_easy_strerror(curl_init_rc));
  return sodium_init() < 0 ? ERR("libsodium failed to initialize") : 0;
}

int hub_resolve(const char *model, const char *revision, const char *file, char **out) {
  *out = NULL;
  if (!model || !*model)
    return ERR("no model given (-m MODEL)"), PAGODA_ERR_INVALID_ARG;
  if (file && (!*file || file[0] == '/' || strstr(file, "..")))
    return ERR("--hf-file '%s' must name a file inside the repository", file), PAGODA_ERR_INVALID_ARG;
  struct stat sb;
  if (stat(model, &sb) == 0) { /* a local path always wins */
    if (revision)
      log_warn("--revision %s ignored: %s is a local path, not a Hugging Face repo id", revision, model);
    if (file && !S_ISDIR(sb.st_mode))
      log_warn("--hf-file %s ignored: %s is a local file, not a Hugging Face repo id", file, model);
    if (file && S_ISDIR(sb.st_mode))
      *out = xasprintf("%s/%s", model, file);
    else
      *out = strdup(model);
    return *out ? 0 : (ERR("out of memory"), PAGODA_ERR_OUT_OF_MEMORY);
  }
  if (!hub_is_repo_id(model))
    return ERR("%s: no such file or directory (nor a Hugging Face repo id org/name)", model),
           PAGODA_ERR_NOT_FOUND;
  if (revision && (!*revision || revision[0] == '/' || strstr(revision, "..")))
    return ERR("--revision '%s' is not a branch, tag or commit", revision), PAGODA_ERR_INVALID_ARG;
  struct hub h = {.repo = model, .rev = revision ? revision : "main", .file = file};
  int st = PAGODA_ERR_OUT_OF_MEMORY;
  if (curl_ready()) {
    st = PAGODA_ERR_IO;
    goto out;
  }
  const char *slash = strchr(model, '/'); /* org/name -> models--org--name */
  char *folder = xasprintf("models--%.*s--%s", (int)(slash - model), model, slash + 1);
  if (!folder)
    goto out;
  const char *ep = env_nonempty("HF_ENDPOINT");
  h.cache = cache_dir();
  h.repo_dir = h.cache ? xasprintf("%s/%s", h.cache, folder) : NULL;
  h.lock_dir = h.cache ? xasprintf("%s/.locks/%s", h.cache, folder) : NULL;
  h.endpoint = xasprintf("%s", ep ? ep : "https://huggingface.co");
  free(folder);
  if (!h.cache || !h.repo_dir || !h.lock_dir || !h.endpoint)
    goto out;
  for (size_t n = strlen(h.endpoint); n && h.endpoint[n - 1] == '/';)
    h.endpoint[--n] = 0;
  if (env_true("HF_HUB_OFFLINE")) {
    st = resolve_cached(&h, out);
    if (st == PAGODA_ERR_NOT_FOUND && !strstr(err_last(), "HF_HUB_OFFLINE")) {
      char *msg = strdup(err_last()); /* err_set overwrites what err_last points at */
      ERR("%s (HF_HUB_OFFLINE is set: nothing is downloaded; unset it to download)", msg ? msg : "not in the cache");
      free(msg);
    }
    goto out;
  }
  h.token = read_token();
  if (!(h.curl = curl_easy_init())) {
    ERR("libcurl failed to initialize");
    st = PAGODA_ERR_IO;
    goto out;
  }
  if (is_commit_sha(h.rev)) { /* a commit never changes: a complete cached snapshot needs no network */
    struct hub c = {.repo = h.repo, .rev = h.rev, .file = h.file, .cache = h.cache, .repo_dir = h.repo_dir};
    char *path = NULL;
    int cst = resolve_cached(&c, &path);
    for (int i = 0; i < c.num_names; i++)
      free(c.names[i]);
    free(c.names);
    if (!cst) {
      *out = path;
      st = 0;
      goto out;
    }
    err_clear();
  }
  st = fetch_info(&h);
  if (st == -2) { /* network down: the cached snapshot, when there is one */
    char *msg = strdup(err_last());
    st = resolve_cached(&h, out);
    if (!st)
      log_warn("%s; using the cached snapshot", msg ? msg : "the hub is unreachable");
    else if (msg) {
      char *cached = strdup(err_last());
      ERR("%s; %s", msg, cached ? cached : "nor is it cached");
      free(cached);
    }
    free(msg);
    goto out;
  }
  if (st)
    goto out;
  char *snap = xasprintf("%s/snapshots/%s", h.repo_dir, h.sha);
  if (!snap) {
    st = PAGODA_ERR_OUT_OF_MEMORY;
    goto out;
  }
  if (mkdirs_for(snap) || (mkdir(snap, 0755) && errno != EEXIST)) {
    if (!strstr(err_last(), "cannot create"))
      ERR("cannot create %s: %s (set HF_HUB_CACHE to a writable directory)", snap, strerror(errno));
    st = PAGODA_ERR_IO;
  } else if (!(st = write_ref(&h) ? PAGODA_ERR_IO : 0)) {
    st = select_and_obtain(&h, snap, out);
  }
  free(snap);
out:
  if (st) {
    free(*out);
    *out = NULL;
  }
  hub_free(&h);
  return st;
}

int pagoda_resolve_model(const char *model, const char *revision, const char *file, char **path) {
  if (!path)
    return ERR("pagoda_resolve_model: PATH is NULL"), PAGODA_ERR_INVALID_ARG;
  return hub_resolve(model, revision, file, path);
}
