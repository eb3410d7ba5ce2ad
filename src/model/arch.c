/* arch.c - the table of architectures and its lookups. Adding one: a row here and its file. */
#include "model/arch.h"

#include <stdio.h>
#include <string.h>

static const struct arch *const table[] = {&arch_llama, &arch_mistral, &arch_qwen2, &arch_phi3,
                                           &arch_qwen3, &arch_gemma2, &arch_mixtral};
#define N_ARCH (sizeof table / sizeof table[0])

const struct arch *arch_by_hf_class(const char *cls) {
  for (size_t i = 0; i < N_ARCH; i++)
    for (const char *const *h = table[i]->hf_classes; h && *h; h++)
      if (!strcmp(*h, cls))
        return table[i];
  return NULL;
}

const struct arch *arch_by_gguf(const char *name, size_t len) {
  for (size_t i = 0; i < N_ARCH; i++) {
    const char *g = table[i]->gguf_name;
    if (g && strlen(g) == len && !memcmp(g, name, len))
      return table[i];
  }
  return NULL;
}

const struct arch *arch_by_name(const char *name) {
  for (size_t i = 0; i < N_ARCH; i++)
    if (!strcmp(table[i]->name, name))
      return table[i];
  return NULL;
}

const char *arch_list(int gguf) {
  static char buf[2][512];
  char *b = buf[gguf != 0];
  if (b[0])
    return b;
  const char *names[64];
  int n = 0;
  for (size_t i = 0; i < N_ARCH; i++) {
    if (gguf) {
      if (table[i]->gguf_name)
        names[n++] = table[i]->gguf_name;
    } else {
      for (const char *const *h = table[i]->hf_classes; h && *h && n < 64; h++)
        names[n++] = *h;
    }
  }
  size_t len = 0;
  for (int i = 0; i < n && len < sizeof buf[0]; i++)
    len += (size_t)snprintf(b + len, sizeof buf[0] - len, "%s%s", i == 0 ? "" : i + 1 < n ? ", " : " and ",
                            names[i]);
  return b;
}
