/* api.c - small public entry points that belong to no module. */
#include "pagoda.h"
#include "util/log.h"

const char *pagoda_last_error(void) { return err_last(); }
