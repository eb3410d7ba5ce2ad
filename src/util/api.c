/* api.c - small public entry points that belong to no module. */
#include <string.h>

#include "pagoda.h"
#include "util/log.h"

const char *pagoda_last_error(void) { return err_last(); }

size_t pagoda_struct_size(const char *name) {
  static const struct {
    const char *name;
    size_t size;
  } sizes[] = {
      {"engine_params", sizeof(struct pagoda_engine_params)},
      {"sampling_params", sizeof(struct pagoda_sampling_params)},
      {"usage", sizeof(struct pagoda_usage)},
      {"output", sizeof(struct pagoda_output)},
      {"engine_stats", sizeof(struct pagoda_engine_stats)},
      {"async_params", sizeof(struct pagoda_async_params)},
      {"event", sizeof(struct pagoda_event)},
      {"async_stats", sizeof(struct pagoda_async_stats)},
  };
  for (size_t i = 0; name && i < sizeof sizes / sizeof *sizes; i++)
    if (!strcmp(name, sizes[i].name))
      return sizes[i].size;
  return 0;
}
