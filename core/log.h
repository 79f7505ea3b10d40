/* Logging to stderr with levels. Each line: "ephemeral: LEVEL: [plugin] message".
 * The calling plugin's name comes from a thread-local the core sets around every plugin
 * call (eph_log_push_plugin/pop), so a plugin's log lines always name it. */
#ifndef EPH_LOG_H
#define EPH_LOG_H

#include <ephemeral/plugin.h>

/* Messages above this level are dropped. Default EPH_LOG_WARN; -v raises it. */
void eph_log_set_level(eph_log_level_t level);
eph_log_level_t eph_log_get_level(void);
/* Parses "error" | "warn" | "info" | "debug"; returns -1 on anything else. */
int eph_log_level_parse(const char *name);
/* Sets the program name prefix (default "ephemeral"). s is borrowed for the process life. */
void eph_log_set_program(const char *s);

void eph_log(eph_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void eph_logv(eph_log_level_t level, const char *fmt, va_list ap);

/* Names the plugin being called on this thread; returns the previous name so calls nest.
 * name is borrowed (plugin descriptors are static). */
const char *eph_log_push_plugin(const char *name);
void eph_log_pop_plugin(const char *previous);

#define eph_error(...) eph_log(EPH_LOG_ERROR, __VA_ARGS__)
#define eph_warn(...) eph_log(EPH_LOG_WARN, __VA_ARGS__)
#define eph_info(...) eph_log(EPH_LOG_INFO, __VA_ARGS__)
#define eph_debug(...) eph_log(EPH_LOG_DEBUG, __VA_ARGS__)

#endif
