/* file.c - mmap-backed read-only files and small file helpers. */
#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/log.h"

int mapped_file_open(struct mapped_file *f, const char *path) {
  memset(f, 0, sizeof *f);
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return ERR("%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return ERR("%s: not a regular file", path);
  }
  f->size = (size_t)st.st_size;
  if (f->size > 0) {
    void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      close(fd);
      return ERR("%s: mmap failed: %s", path, strerror(errno));
    }
    f->data = p;
  }
  close(fd);
  f->path = strdup(path);
  return 0;
}

void mapped_file_close(struct mapped_file *f) {
  if (f->data)
    munmap((void *)f->data, f->size);
  free(f->path);
  memset(f, 0, sizeof *f);
}

char *file_read_all(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    ERR("%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (n + 1 >= cap) {
      cap *= 2;
      char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(fp);
        ERR("%s: out of memory", path);
        return NULL;
      }
      buf = nb;
    }
    size_t r = fread(buf + n, 1, cap - n - 1, fp);
    n += r;
    if (r == 0)
      break;
  }
  int bad = ferror(fp);
  fclose(fp);
  if (bad) {
    free(buf);
    ERR("%s: read error", path);
    return NULL;
  }
  buf[n] = 0;
  if (len)
    *len = n;
  return buf;
}

int file_is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}
