#include <config.h>

#include "log.h"

#include <pthread.h>
#include <stdio.h>
#include <strings.h>

static eph_log_level_t max_level = EPH_LOG_WARN;
static const char *program = "ephemeral";
static _Thread_local const char *current_plugin;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

void
eph_log_set_level(eph_log_level_t level)
{
  max_level = level;
}

eph_log_level_t
eph_log_get_level(void)
{
  return max_level;
}

void
eph_log_set_program(const char *s)
{
  program = s;
}

int
eph_log_level_parse(const char *name)
{
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (name && strcasecmp(name, names[i]) == 0)
      return i;
  return -1;
}

const char *
eph_log_push_plugin(const char *name)
{
  const char *prev = current_plugin;
  current_plugin = name;
  return prev;
}

void
eph_log_pop_plugin(const char *previous)
{
  current_plugin = previous;
}

void
eph_logv(eph_log_level_t level, const char *fmt, va_list ap)
{
  static const char *const names[] = {"error", "warning", "info", "debug"};
  if (level > max_level)
    return;
  char line[4096];
  int n = 0;
  if (current_plugin)
    n = snprintf(line, sizeof line, "%s: %s: [%s] ", program, names[level], current_plugin);
  else
    n = snprintf(line, sizeof line, "%s: %s: ", program, names[level]);
  if (n < 0 || (size_t)n >= sizeof line)
    n = 0;
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  pthread_mutex_lock(&log_lock);
  fprintf(stderr, "%s\n", line);
  pthread_mutex_unlock(&log_lock);
}

void
eph_log(eph_log_level_t level, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  eph_logv(level, fmt, ap);
  va_end(ap);
}
