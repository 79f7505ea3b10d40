/* Live command output: coalescing and bounds (see live.h). */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "live.h"
#include "support/text.h"
#include "util.h"

/* Emits the pending bytes as valid UTF-8. Unless `final`, an incomplete sequence at the
 * end stays pending for the next chunk. */
static void
flush(eph_live_t *l, bool final, eph_live_emit_fn emit, void *opaque)
{
  if (!l->pending_bytes)
    return;
  const unsigned char *p = (const unsigned char *)l->pending;
  size_t n = l->pending_bytes, keep = n, o = 0;
  /* A sequence cut by the chunk's end starts in its last three bytes. */
  for (size_t back = 1; !final && back <= 3 && back <= n; back++)
    if (eph_utf8_seq(p + n - back, back) < 0) {
      keep = n - back;
      break;
    }
  char *out = eph_utf8_repair(l->pending, keep, &o);
  if (!out) /* out of memory: the core does not limp on (eph_xmalloc's rule) */
    abort();
  if (o)
    emit(opaque, l->pending_stream, out, o, 0);
  free(out);
  memmove(l->pending, l->pending + keep, n - keep);
  l->pending_bytes = n - keep;
  l->last_emit_ms = eph_now_ms();
}

void
eph_live_begin(eph_live_t *l, uint64_t cmd_cap_bytes)
{
  l->active = true;
  l->pending_bytes = 0;
  l->pending_stream = 1;
  l->last_emit_ms = 0;
  l->cmd_cap_bytes = cmd_cap_bytes ? cmd_cap_bytes : EPH_LIVE_CMD_CAP_DEFAULT_BYTES;
  l->cmd_shown_bytes = l->cmd_dropped_bytes = 0;
}

void
eph_live_add(eph_live_t *l, int stream, const char *data, size_t bytes, eph_live_emit_fn emit,
             void *opaque)
{
  if (!l->active || (stream != 1 && stream != 2))
    return;
  while (bytes) {
    uint64_t room =
        l->cmd_shown_bytes < l->cmd_cap_bytes ? l->cmd_cap_bytes - l->cmd_shown_bytes : 0;
    uint64_t run_room = l->run_shown_bytes < EPH_LIVE_RUN_CAP_BYTES
                            ? EPH_LIVE_RUN_CAP_BYTES - l->run_shown_bytes
                            : 0;
    if (run_room < room)
      room = run_room;
    if (room == 0) { /* past a cap: counted, not shown */
      l->cmd_dropped_bytes += bytes;
      return;
    }
    if (stream != l->pending_stream) {
      flush(l, true, emit, opaque);
      l->pending_stream = stream;
    }
    size_t take = EPH_LIVE_CHUNK_BYTES - l->pending_bytes;
    if (take > bytes)
      take = bytes;
    if (take > room)
      take = (size_t)room;
    memcpy(l->pending + l->pending_bytes, data, take);
    l->pending_bytes += take;
    l->cmd_shown_bytes += take;
    l->run_shown_bytes += take;
    data += take;
    bytes -= take;
    if (l->pending_bytes == EPH_LIVE_CHUNK_BYTES) /* keeps at most a cut sequence */
      flush(l, false, emit, opaque);
  }
  if (eph_now_ms() - l->last_emit_ms >= EPH_LIVE_INTERVAL_MS)
    flush(l, false, emit, opaque);
}

void
eph_live_end(eph_live_t *l, eph_live_emit_fn emit, void *opaque)
{
  if (!l->active)
    return;
  flush(l, true, emit, opaque);
  if (l->cmd_dropped_bytes)
    emit(opaque, 0, NULL, 0, l->cmd_dropped_bytes);
  l->active = false;
}
