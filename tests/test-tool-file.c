/* tool-file through the real loader. The fake host's sandbox operations work on a real
 * temporary scratch directory with the guest's confinement mechanism (openat2
 * RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS), counting how many operations reach it:
 * plain escapes ('..', absolute) never leave the plugin; symlinks out of scratch and a
 * symlink swapped in during the call are refused by the mechanism; bytes round-trip exactly
 * (text and binary); caps hold; a short write is never reported as a success. */
#include <config.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tools-harness.h"
#include "util.h"

static char root[256], scratch[300], outside[300];
static int scratch_fd = -1;
static int ops_reached;
static int short_write; /* the fake sandbox drops the last byte */

static int
open_beneath(const char *path, int flags)
{
  struct open_how how = {.flags = (uint64_t)flags | O_CLOEXEC,
                         .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
                         .mode = (flags & O_CREAT) ? 0644 : 0};
  return (int)syscall(SYS_openat2, scratch_fd, *path ? path : ".", &how, sizeof how);
}

static int
sbx_write(const char *path, const void *data, size_t bytes, eph_error_t *err)
{
  ops_reached++;
  int fd = open_beneath(path, O_WRONLY | O_CREAT | O_TRUNC);
  if (fd < 0)
    return eph_error_set(err, errno, "path '%s': %s", path,
                         errno == EXDEV ? "leads outside scratch" : strerror(errno));
  size_t n = short_write && bytes ? bytes - 1 : bytes;
  ssize_t w = write(fd, data, n);
  close(fd);
  return w == (ssize_t)n ? 0 : eph_error_set(err, EIO, "write failed");
}

static int
sbx_read(const char *path, size_t max, void **data, size_t *bytes, int *truncated, eph_error_t *err)
{
  ops_reached++;
  int fd = open_beneath(path, O_RDONLY);
  if (fd < 0)
    return eph_error_set(err, errno, "path '%s': %s", path,
                         errno == EXDEV ? "leads outside scratch" : strerror(errno));
  char *buf = eph_xmalloc(max + 1);
  ssize_t got = read(fd, buf, max + 1);
  close(fd);
  if (got < 0) {
    free(buf);
    return eph_error_set(err, errno, "read: %s", strerror(errno));
  }
  *truncated = (size_t)got > max;
  *bytes = *truncated ? max : (size_t)got;
  *data = buf;
  return 0;
}

static int
sbx_list(const char *path, eph_dirent_t **entries, size_t *count, eph_error_t *err)
{
  ops_reached++;
  int fd = open_beneath(path, O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return eph_error_set(err, errno, "path '%s': %s", path,
                         errno == EXDEV ? "leads outside scratch" : strerror(errno));
  DIR *d = fdopendir(fd);
  eph_dirent_t *v = NULL;
  size_t n = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    struct stat st;
    if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
      continue;
    v = eph_xrealloc(v, (n + 1) * sizeof *v);
    v[n].name = eph_xstrdup(de->d_name);
    v[n].type = S_ISREG(st.st_mode)   ? 'f'
                : S_ISDIR(st.st_mode) ? 'd'
                : S_ISLNK(st.st_mode) ? 'l'
                                      : '?';
    v[n].size_bytes = (uint64_t)st.st_size;
    v[n].mtime_s = st.st_mtime;
    n++;
  }
  closedir(d);
  *entries = v;
  *count = n;
  return 0;
}

static json_object *
call(const eph_plugin_slot_t *s, const char *tool, const char *args)
{
  eph_error_t err = {0};
  json_object *r = th_call(s, tool, args, "{\"files\":true}", 0, &err);
  if (!r)
    fail_msg("%s failed: %s", tool, err.message);
  return r;
}

static int
setup(void **state)
{
  th_setup(state);
  snprintf(root, sizeof root, "/tmp/eph-tool-file-XXXXXX");
  assert_non_null(mkdtemp(root));
  snprintf(scratch, sizeof scratch, "%s/scratch", root);
  snprintf(outside, sizeof outside, "%s/outside.txt", root);
  assert_int_equal(mkdir(scratch, 0755), 0);
  FILE *f = fopen(outside, "w");
  fputs("host secret\n", f);
  fclose(f);
  scratch_fd = open(scratch, O_PATH | O_DIRECTORY | O_CLOEXEC);
  assert_true(scratch_fd >= 0);
  th_sandbox_write = sbx_write;
  th_sandbox_read = sbx_read;
  th_sandbox_list = sbx_list;
  ops_reached = short_write = 0;
  return 0;
}

static int
teardown(void **state)
{
  th_teardown(state);
  close(scratch_fd);
  cleanup_free char *cmd = eph_xasprintf("rm -rf '%s'", root);
  return system(cmd) == 0 ? 0 : -1;
}

static const eph_plugin_slot_t *
load(const char *cfg)
{
  eph_error_t err = {0};
  return th_load(&th_plugins, "tool-file",
                 cfg ? cfg : "tool-file: { max_read_bytes = 64; max_write_bytes = 300; };", 0,
                 &err);
}

static void
test_round_trip_text_and_binary(void **state)
{
  const eph_plugin_slot_t *s = load(NULL);
  json_object *r =
      call(s, "file_write", "{\"path\":\"notes/a.txt\",\"content\":\"héllo\\nworld\"}");
  /* notes/ does not exist: the fake, like the guest's contract, does not create it. */
  json_object_put(r);
  r = call(s, "file_write", "{\"path\":\"a.txt\",\"content\":\"h\\u00e9llo\\nworld\"}");
  assert_null(str_of(r, "error"));
  json_object *bw = NULL;
  assert_true(json_object_object_get_ex(r, "bytes_written", &bw));
  assert_int_equal(json_object_get_int(bw), 12);
  json_object_put(r);
  r = call(s, "file_read", "{\"path\":\"a.txt\"}");
  assert_string_equal(str_of(r, "encoding"), "utf-8");
  assert_string_equal(str_of(r, "content"), "h\xc3\xa9llo\nworld");
  json_object_put(r);

  /* All 256 byte values, through base64 both ways. */
  unsigned char bin[256];
  for (int i = 0; i < 256; i++)
    bin[i] = (unsigned char)i;
  char b64[400];
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t w = 0;
  for (size_t i = 0; i < 256; i += 3) {
    uint32_t v = (uint32_t)bin[i] << 16 | (i + 1 < 256 ? (uint32_t)bin[i + 1] << 8 : 0) |
                 (i + 2 < 256 ? bin[i + 2] : 0);
    b64[w++] = tab[v >> 18 & 63];
    b64[w++] = tab[v >> 12 & 63];
    b64[w++] = i + 1 < 256 ? tab[v >> 6 & 63] : '=';
    b64[w++] = i + 2 < 256 ? tab[v & 63] : '=';
  }
  b64[w] = 0;
  cleanup_free char *args =
      eph_xasprintf("{\"path\":\"bin.dat\",\"content\":\"%s\",\"encoding\":\"base64\"}", b64);
  r = call(s, "file_write", args);
  assert_null(str_of(r, "error"));
  json_object_put(r);
  /* On disk, byte for byte. */
  cleanup_free char *path = eph_xasprintf("%s/bin.dat", scratch);
  cleanup_free char *disk = NULL;
  size_t n = 0;
  eph_error_t err = {0};
  assert_int_equal(eph_read_file(path, 1024, &disk, &n, &err), 0);
  assert_int_equal(n, 256);
  assert_memory_equal(disk, bin, 256);
  /* And back (max_read_bytes 64: truncated; max_bytes larger than the cap is capped). */
  r = call(s, "file_read", "{\"path\":\"bin.dat\",\"max_bytes\":100000}");
  assert_string_equal(str_of(r, "encoding"), "base64");
  json_object *t = NULL;
  assert_true(json_object_object_get_ex(r, "truncated", &t) && json_object_get_boolean(t));
  char want[100];
  memcpy(want, b64, 88); /* 64 bytes = 21 groups + 1 byte */
  want[84] = 0;
  assert_int_equal(strncmp(str_of(r, "content"), want, 84), 0);
  json_object_put(r);
  r = call(s, "file_list", "{}");
  json_object *ents = NULL;
  assert_true(json_object_object_get_ex(r, "entries", &ents));
  assert_int_equal(json_object_array_length(ents), 2);
  json_object_put(r);
  /* Events name the operations. */
  assert_true(json_object_array_length(th.events) >= 4);
}

static void
test_caps_and_bad_base64(void **state)
{
  const eph_plugin_slot_t *s = load(NULL);
  char big[400];
  memset(big, 'a', 350);
  big[350] = 0;
  cleanup_free char *args = eph_xasprintf("{\"path\":\"big\",\"content\":\"%s\"}", big);
  json_object *r = call(s, "file_write", args);
  assert_non_null(strstr(str_of(r, "error"), "max_write_bytes"));
  json_object_put(r);
  r = call(s, "file_write", "{\"path\":\"x\",\"content\":\"not base64!\",\"encoding\":\"base64\"}");
  assert_non_null(strstr(str_of(r, "error"), "base64"));
  json_object_put(r);
  r = call(s, "file_write", "{\"path\":\"x\",\"content\":\"QQ=\",\"encoding\":\"base64\"}");
  assert_non_null(str_of(r, "error"));
  json_object_put(r);
  assert_int_equal(ops_reached, 0);
}

static void
test_short_write_is_not_success(void **state)
{
  const eph_plugin_slot_t *s = load(NULL);
  short_write = 1;
  json_object *r = call(s, "file_write", "{\"path\":\"s.txt\",\"content\":\"twelve bytes\"}");
  assert_non_null(str_of(r, "error"));
  assert_non_null(strstr(str_of(r, "error"), "short write"));
  json_object_put(r);
}

static void
test_plain_escapes_never_leave_the_plugin(void **state)
{
  const eph_plugin_slot_t *s = load(NULL);
  static const char *const bad[] = {
      "../outside.txt", "/etc/passwd", "a/../../outside.txt", "..", "a/..", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cleanup_free char *ra = eph_xasprintf("{\"path\":\"%s\"}", bad[i]);
    cleanup_free char *wa = eph_xasprintf("{\"path\":\"%s\",\"content\":\"x\"}", bad[i]);
    json_object *r = call(s, "file_read", ra);
    assert_non_null(str_of(r, "error"));
    json_object_put(r);
    r = call(s, "file_write", wa);
    assert_non_null(str_of(r, "error"));
    json_object_put(r);
  }
  json_object *r = call(s, "file_list", "{\"path\":\"../\"}");
  assert_non_null(str_of(r, "error"));
  json_object_put(r);
  assert_int_equal(ops_reached, 0);
  /* The host file is untouched. */
  cleanup_free char *c = NULL;
  eph_error_t err = {0};
  assert_int_equal(eph_read_file(outside, 100, &c, NULL, &err), 0);
  assert_string_equal(c, "host secret\n");
}

static void
test_symlink_out_refused(void **state)
{
  const eph_plugin_slot_t *s = load(NULL);
  cleanup_free char *l1 = eph_xasprintf("%s/abs", scratch);
  cleanup_free char *l2 = eph_xasprintf("%s/rel", scratch);
  cleanup_free char *l3 = eph_xasprintf("%s/dir", scratch);
  assert_int_equal(symlink(outside, l1), 0);
  assert_int_equal(symlink("../outside.txt", l2), 0);
  assert_int_equal(symlink("/proc/self/root/etc", l3), 0);
  static const char *const paths[] = {"abs", "rel", "dir/passwd"};
  for (size_t i = 0; i < 3; i++) {
    cleanup_free char *ra = eph_xasprintf("{\"path\":\"%s\"}", paths[i]);
    cleanup_free char *wa = eph_xasprintf("{\"path\":\"%s\",\"content\":\"pwned\"}", paths[i]);
    json_object *r = call(s, "file_read", ra);
    assert_non_null(str_of(r, "error"));
    assert_null(strstr(json_object_to_json_string(r), "host secret"));
    json_object_put(r);
    r = call(s, "file_write", wa);
    assert_non_null(str_of(r, "error"));
    json_object_put(r);
  }
  cleanup_free char *c = NULL;
  eph_error_t err = {0};
  assert_int_equal(eph_read_file(outside, 100, &c, NULL, &err), 0);
  assert_string_equal(c, "host secret\n");
}

/* A worker process swaps a directory for a symlink out of scratch in a tight loop while the
 * tool reads through it: every read either sees the in-scratch file or fails, never the
 * host file. */
static atomic_int swapping; /* the swapper thread runs while set */

static void *
swapper(void *arg)
{
  cleanup_free char *d = eph_xasprintf("%s/d", scratch);
  cleanup_free char *tmp = eph_xasprintf("%s/d.tmp", scratch);
  cleanup_free char *real = eph_xasprintf("%s/d.real", scratch);
  while (swapping) {
    unlink(tmp);
    if (symlink(root, tmp) == 0)
      rename(tmp, d); /* d -> root (outside) */
    unlink(d);
    if (symlink("d.real", tmp) == 0)
      rename(tmp, d); /* d -> d.real (inside) */
  }
  (void)real;
  return NULL;
}

static void
test_symlink_swap_during_calls(void **state)
{
  const eph_plugin_slot_t *s = load(NULL);
  cleanup_free char *real = eph_xasprintf("%s/d.real", scratch);
  assert_int_equal(mkdir(real, 0755), 0);
  cleanup_free char *inside = eph_xasprintf("%s/d.real/outside.txt", scratch);
  FILE *f = fopen(inside, "w");
  fputs("inside\n", f);
  fclose(f);
  pthread_t t;
  swapping = 1;
  assert_int_equal(pthread_create(&t, NULL, swapper, NULL), 0);
  int seen_inside = 0;
  for (int i = 0; i < 400; i++) {
    json_object *r = call(s, "file_read", "{\"path\":\"d/outside.txt\"}");
    const char *content = str_of(r, "content");
    if (content) {
      assert_string_equal(content, "inside\n");
      seen_inside++;
    }
    json_object_put(r);
    r = call(s, "file_write", "{\"path\":\"d/outside.txt\",\"content\":\"inside\\n\"}");
    json_object_put(r);
  }
  swapping = 0;
  pthread_join(t, NULL);
  cleanup_free char *c = NULL;
  eph_error_t err = {0};
  assert_int_equal(eph_read_file(outside, 100, &c, NULL, &err), 0);
  assert_string_equal(c, "host secret\n");
  (void)seen_inside;
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_round_trip_text_and_binary, setup, teardown),
      cmocka_unit_test_setup_teardown(test_caps_and_bad_base64, setup, teardown),
      cmocka_unit_test_setup_teardown(test_short_write_is_not_success, setup, teardown),
      cmocka_unit_test_setup_teardown(test_plain_escapes_never_leave_the_plugin, setup, teardown),
      cmocka_unit_test_setup_teardown(test_symlink_out_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_symlink_swap_during_calls, setup, teardown),
  };
  return cmocka_run_group_tests_name("tool-file", tests, NULL, NULL);
}
