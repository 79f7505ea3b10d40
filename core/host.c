#include <config.h>

#include "host.h"

#include <string.h>

#include "conf.h"
#include "context.h"
#include "log.h"
#include "run.h"

void
eph_host_init(eph_host_t *host, struct eph_ctx *ctx)
{
  memset(host, 0, sizeof *host);
  host->struct_size = sizeof *host;
  host->abi_major = EPH_ABI_MAJOR;
  host->abi_minor = EPH_ABI_MINOR;
  host->log = eph_log;
  host->cfg_int = eph_cfg_int;
  host->cfg_bool = eph_cfg_bool;
  host->cfg_string = eph_cfg_string;
  host->state_dir = ctx->state_dir;
  host->data_dir = ctx->paths.data_dir;
  host->libexec_dir = ctx->paths.libexec_dir;
  eph_run_host_services(host);
}
