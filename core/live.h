/* Live command output: a command's stdout/stderr chunks, as they arrive from the guest,
 * coalesced into the run's `output` timeline events.
 *
 * A chunk is held until EPH_LIVE_CHUNK_BYTES are pending, the stream changes, or
 * EPH_LIVE_INTERVAL_MS have passed since the last event (checked when the next chunk
 * arrives: there is no timer, so a burst followed by silence waits for the next chunk or
 * the command's end). What is pending when the command ends is emitted before its
 * tool_result. Emitted text is valid UTF-8: a sequence cut by a chunk boundary waits for
 * its end, invalid bytes become U+FFFD.
 *
 * Bounds (the head of the output streams live; the tool_result keeps head and tail):
 * per command the first `cmd_cap_bytes` (the command's output cap), per run the first
 * EPH_LIVE_RUN_CAP_BYTES; past either, bytes are only counted, and the command's end emits
 * one marker event with `dropped_bytes`. Not thread-safe: one command at a time per run
 * (the core runs a turn's tool calls in order). */
#ifndef EPH_LIVE_H
#define EPH_LIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EPH_LIVE_CHUNK_BYTES 4096
#define EPH_LIVE_INTERVAL_MS 100
#define EPH_LIVE_RUN_CAP_BYTES (1024 * 1024)
#define EPH_LIVE_CMD_CAP_DEFAULT_BYTES (64 * 1024)

/* Receives one coalesced event. stream: 1 stdout, 2 stderr, 0 for the end-of-command
 * marker. text: valid UTF-8 of `bytes` bytes (not NUL-terminated; NULL for the marker).
 * dropped_bytes: for the marker, the bytes of the command not shown live. */
typedef void (*eph_live_emit_fn)(void *opaque, int stream, const char *text, size_t bytes,
                                 uint64_t dropped_bytes);

typedef struct eph_live {
  bool active;        /* between eph_live_begin() and eph_live_end() */
  int pending_stream; /* stream of the pending bytes (1 or 2) */
  size_t pending_bytes;
  char pending[EPH_LIVE_CHUNK_BYTES];
  int64_t last_emit_ms; /* CLOCK_MONOTONIC of the last event, 0 before the first */
  uint64_t cmd_cap_bytes, cmd_shown_bytes, cmd_dropped_bytes;
  uint64_t run_shown_bytes; /* across the run's commands */
} eph_live_t;

/* Starts a command. cmd_cap_bytes: live bytes shown at most for it (0 = the default). */
void eph_live_begin(eph_live_t *l, uint64_t cmd_cap_bytes);
/* Adds a chunk of stream (1 or 2); may emit. */
void eph_live_add(eph_live_t *l, int stream, const char *data, size_t bytes, eph_live_emit_fn emit,
                  void *opaque);
/* Ends the command: emits what is pending, then the marker when bytes were dropped. */
void eph_live_end(eph_live_t *l, eph_live_emit_fn emit, void *opaque);

#endif
