/* Fuzz target: the configuration loader (core/conf.c, libconfig syntax): ephemeral.conf
 * and a conf.d file. The input is ephemeral.conf, then a line holding only "%%", then a
 * conf.d file (without the separator there is no conf.d directory: the embedded plugin
 * set). Every block found is then checked against a key table of each type and read
 * through the typed getters, as plugins do.
 *
 * Inputs holding "@include" are skipped: an include names any file of the machine (a
 * FIFO or /dev/zero would hang the fuzzer), and the configuration is the operator's, not
 * an attacker's; what is fuzzed is the loader's handling of what libconfig parsed. */
#include <config.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf.h"
#include "fuzz.h"
#include "log.h"

/* LeakSanitizer reads its suppressions from here (both builds of this target). Two leaks
 * of libconfig 1.5 (Debian 12) itself, reproduced with libconfig alone (config_read then
 * config_destroy), not ours to fix; the daemon and the CLI exit on a configuration error:
 *  - its scanner's strbuf (the text of a string token) when a syntax error follows it,
 *    e.g. `g = { a = 1; };   "l=[a", "b"]; };`;
 *  - a 1-byte string of adjacent strings followed by a syntax error, e.g.
 *    `ps = "many""many"s = "man"many""many"s = "many";y";`.
 * Matched by libconfig's own function names: a leak through conf.c still shows. */
const char *__lsan_default_suppressions(void);
const char *
__lsan_default_suppressions(void)
{
  return "leak:strbuf_append\nleak:libconfig_yylex\n";
}

static char dir[PATH_MAX / 2], main_path[PATH_MAX], confd[PATH_MAX / 2 + 16], confd_file[PATH_MAX];

static void
cleanup(void)
{
  unlink(confd_file);
  rmdir(confd);
  unlink(main_path);
  rmdir(dir);
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/eph-fuzz-conf.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    exit(1);
  }
  snprintf(main_path, sizeof main_path, "%s/ephemeral.conf", dir);
  snprintf(confd, sizeof confd, "%s/conf.d", dir);
  snprintf(confd_file, sizeof confd_file, "%s/10-fuzz.conf", confd);
  atexit(cleanup);
  eph_log_set_level(EPH_LOG_ERROR); /* unknown keys are warnings: keep the output readable */
  return 0;
}

static bool
write_file(const char *path, const uint8_t *data, size_t n)
{
  FILE *f = fopen(path, "wb");
  if (!f)
    return false;
  bool ok = fwrite(data, 1, n, f) == n;
  return fclose(f) == 0 && ok;
}

static const eph_config_key_t keys[] = {
    {"n", EPH_CFG_INT, "0", NULL, "an int"},
    {"b", EPH_CFG_BOOL, "false", NULL, "a bool"},
    {"s", EPH_CFG_STRING, "\"\"", NULL, "a string"},
    {"g", EPH_CFG_GROUP, "{}", NULL, "a group"},
    {"l", EPH_CFG_LIST, "[]", NULL, "a list of strings"},
    {0},
};

static void
read_block(const config_setting_t *s)
{
  eph_error_t err = {0};
  int warnings = 0;
  (void)eph_config_check_keys(s, keys, "fuzz", &warnings, &err);
  (void)eph_config_check_keys(s, eph_core_config_keys, "fuzz", &warnings, &err);
  int64_t i;
  int b;
  const char *str;
  static const char *const names[] = {"n", "b", "s", "g", "enabled", "file"};
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    (void)eph_cfg_int(s, names[k], 0, &i, &err);
    (void)eph_cfg_bool(s, names[k], 0, &b, &err);
    if (eph_cfg_string(s, names[k], "", &str, &err) == 0)
      (void)strlen(str);
  }
  char where[PATH_MAX + 32];
  (void)eph_cfg_where(s, where, sizeof where);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (memmem(data, size, "@include", 8))
    return 0;
  const uint8_t *sep = memmem(data, size, "\n%%\n", 4);
  size_t main_len = sep ? (size_t)(sep - data) + 1 : size;
  if (!write_file(main_path, data, main_len))
    return 0;
  if (sep) {
    mkdir(confd, 0700);
    if (!write_file(confd_file, sep + 4, size - main_len - 3))
      return 0;
  } else {
    unlink(confd_file);
    rmdir(confd);
  }
  eph_config_t c;
  eph_error_t err = {0};
  if (eph_config_load(&c, main_path, sep ? confd : NULL, &err) == 0) {
    read_block(c.core);
    for (size_t i = 0; i < c.n_blocks; i++) {
      (void)eph_config_block(&c, c.blocks[i].name);
      read_block(c.blocks[i].setting);
    }
    eph_config_free(&c);
  }
  return 0;
}
