/* File operations of the guest protocol: write_file, read_file, list_dir.
 *
 * The guest is root and the scratch directory belongs to the worker, who may have planted
 * symlinks, FIFOs or directories anywhere in it. So every operation:
 *  - takes the worker's filesystem identity (setfsuid/setfsgid: permission checks and new
 *    files' owner are the worker's, and the kernel drops the file capabilities meanwhile);
 *  - walks the path one component at a time with openat2(RESOLVE_BENEATH |
 *    RESOLVE_NO_MAGICLINKS) from the directory reached so far, so neither "..", an absolute
 *    symlink nor a /proc magic link leads outside scratch;
 *  - opens the final file with O_NONBLOCK and refuses anything but a regular file (a FIFO
 *    would otherwise block the guest forever).
 */
#include <config.h>

#include "guest.h"
#include "protocol.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define RESOLVE_FLAGS (RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
#define MAX_LIST_ENTRIES 2000 /* keeps an "entries" reply well under the frame limit */

static int
open_beneath(int dirfd, const char *name, int flags, mode_t mode)
{
  struct open_how how = {.flags = (uint64_t)flags | O_CLOEXEC, .resolve = RESOLVE_FLAGS};
  if (flags & O_CREAT)
    how.mode = mode;
  long fd;
  do
    fd = syscall(SYS_openat2, dirfd, name, &how, sizeof how);
  while (fd < 0 && errno == EAGAIN); /* openat2 may ask to retry on a rename race */
  return (int)fd;
}

static void
as_worker(const guest_fs_t *fs)
{
  setfsgid(fs->gid);
  setfsuid(fs->uid);
}

static void
as_guest(void)
{
  setfsuid(geteuid());
  setfsgid(getegid());
}

/* Splits path (relative to scratch, or absolute beneath it) and opens the directory that
 * holds its last component, creating missing directories when mkdirs. *base receives the
 * last component ("" when path names scratch itself). Returns an fd or -errno. */
static int
open_parent(const guest_fs_t *fs, const char *path, bool mkdirs, char *base, size_t base_size,
            char *why, size_t why_size)
{
  size_t slen = strlen(fs->scratch);
  if (path[0] == '/') {
    if (strncmp(path, fs->scratch, slen) != 0 || (path[slen] != '/' && path[slen] != '\0')) {
      snprintf(why, why_size, "path '%s': must be relative to scratch or beneath %s", path,
               fs->scratch);
      return -EACCES;
    }
    path += slen;
  }
  char copy[4096];
  if (strlen(path) >= sizeof copy) {
    snprintf(why, why_size, "path: longer than %zu bytes", sizeof copy - 1);
    return -ENAMETOOLONG;
  }
  strcpy(copy, path);
  /* Collect the components, refusing ".." outright. */
  char *parts[512];
  size_t n = 0;
  char *save = NULL;
  for (char *c = strtok_r(copy, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    if (strcmp(c, ".") == 0)
      continue;
    if (strcmp(c, "..") == 0) {
      snprintf(why, why_size, "path '%s': '..' is not allowed", path);
      return -EACCES;
    }
    if (n == sizeof parts / sizeof parts[0]) {
      snprintf(why, why_size, "path '%s': too deep", path);
      return -ENAMETOOLONG;
    }
    parts[n++] = c;
  }
  int cur = open_beneath(fs->scratch_fd, ".", O_PATH | O_DIRECTORY, 0);
  if (cur < 0) {
    snprintf(why, why_size, "scratch: %s", strerror(errno));
    return -errno;
  }
  for (size_t i = 0; i + 1 < n; i++) {
    int next = open_beneath(cur, parts[i], O_PATH | O_DIRECTORY, 0);
    if (next < 0 && errno == ENOENT && mkdirs) {
      if (mkdirat(cur, parts[i], 0755) < 0 && errno != EEXIST) {
        int e = errno;
        snprintf(why, why_size, "path '%s': creating '%s': %s", path, parts[i], strerror(e));
        close(cur);
        return -e;
      }
      next = open_beneath(cur, parts[i], O_PATH | O_DIRECTORY, 0);
    }
    if (next < 0) {
      int e = errno;
      snprintf(why, why_size, "path '%s': at '%s': %s", path, parts[i],
               e == EXDEV ? "leads outside scratch" : strerror(e));
      close(cur);
      return -(e == EXDEV ? EACCES : e);
    }
    close(cur);
    cur = next;
  }
  snprintf(base, base_size, "%s", n ? parts[n - 1] : "");
  return cur;
}

/* Opens the final component for a regular-file operation. */
static int
open_file(int dirfd, const char *path, const char *base, int flags, mode_t mode, char *why,
          size_t why_size)
{
  if (!*base) {
    snprintf(why, why_size, "path '%s': names a directory", path);
    return -EISDIR;
  }
  int fd = open_beneath(dirfd, base, flags | O_NONBLOCK | O_NOCTTY, mode);
  if (fd < 0) {
    int e = errno;
    snprintf(why, why_size, "path '%s': %s", path,
             e == EXDEV ? "leads outside scratch" : strerror(e));
    return -(e == EXDEV ? EACCES : e);
  }
  struct stat st = {0};
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    snprintf(why, why_size, "path '%s': not a regular file", path);
    close(fd);
    return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
  }
  (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

static json_object *
fail(int *err_no, int e, char *why, size_t why_size, const char *msg)
{
  *err_no = e;
  snprintf(why, why_size, "%s", msg);
  return NULL;
}

static json_object *
reply(const char *type, json_object *req)
{
  json_object *o = json_object_new_object();
  json_object *id;
  json_object_object_add(o, "type", json_object_new_string(type));
  if (json_object_object_get_ex(req, "id", &id))
    json_object_object_add(o, "id", json_object_get(id));
  return o;
}

json_object *
guest_fs_write(const guest_fs_t *fs, json_object *req, int *err_no, char *why, size_t why_size)
{
  const char *path = eph_json_get_string(req, "path");
  if (!path)
    return fail(err_no, EINVAL, why, why_size, "write_file: 'path' must be a string");
  void *data = NULL;
  size_t bytes = 0;
  int r = eph_proto_get_b64(req, "data", EPH_PROTO_MAX_DATA_BYTES, &data, &bytes);
  if (r < 0)
    return fail(err_no, -r, why, why_size,
                r == -EFBIG ? "write_file: 'data': over the per-frame limit"
                            : "write_file: 'data': not base64");
  int64_t mode = 0644;
  if (eph_proto_int(req, "mode", &mode) && (mode < 0 || mode > 0777)) {
    free(data);
    return fail(err_no, EINVAL, why, why_size, "write_file: 'mode' outside 0..0777");
  }
  json_object *appendv;
  bool append =
      json_object_object_get_ex(req, "append", &appendv) && json_object_get_boolean(appendv);
  json_object *mkdirsv;
  bool mkdirs =
      json_object_object_get_ex(req, "mkdirs", &mkdirsv) && json_object_get_boolean(mkdirsv);

  json_object *out = NULL;
  char base[256];
  as_worker(fs);
  int dir = open_parent(fs, path, mkdirs, base, sizeof base, why, why_size);
  if (dir < 0) {
    *err_no = -dir;
    goto done;
  }
  int fd = open_file(dir, path, base, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC),
                     (mode_t)mode, why, why_size);
  close(dir);
  if (fd < 0) {
    *err_no = -fd;
    goto done;
  }
  size_t off = 0;
  while (off < bytes) {
    ssize_t w = write(fd, (char *)data + off, bytes - off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      *err_no = w < 0 ? errno : EIO;
      snprintf(why, why_size, "path '%s': write: %s", path, strerror(*err_no));
      close(fd);
      goto done;
    }
    off += (size_t)w;
  }
  /* The size the host is told is what the file system holds, not what we meant to write. */
  struct stat st;
  if (fstat(fd, &st) < 0) {
    *err_no = errno;
    snprintf(why, why_size, "path '%s': fstat: %s", path, strerror(errno));
    close(fd);
    goto done;
  }
  close(fd);
  out = reply("ok", req);
  json_object_object_add(out, "bytes", json_object_new_int64(st.st_size));
  json_object_object_add(out, "written", json_object_new_int64((int64_t)off));
done:
  as_guest();
  free(data);
  return out;
}

json_object *
guest_fs_read(const guest_fs_t *fs, json_object *req, int *err_no, char *why, size_t why_size)
{
  const char *path = eph_json_get_string(req, "path");
  if (!path)
    return fail(err_no, EINVAL, why, why_size, "read_file: 'path' must be a string");
  int64_t offset = 0, max = EPH_PROTO_MAX_DATA_BYTES;
  if ((eph_proto_int(req, "offset", &offset) && offset < 0) ||
      (eph_proto_int(req, "max", &max) && (max < 0 || max > EPH_PROTO_MAX_DATA_BYTES)))
    return fail(err_no, EINVAL, why, why_size,
                "read_file: 'offset' must be >= 0 and 'max' within 0..524288");

  json_object *out = NULL;
  char base[256];
  char *buf = NULL;
  as_worker(fs);
  int dir = open_parent(fs, path, false, base, sizeof base, why, why_size);
  if (dir < 0) {
    *err_no = -dir;
    goto done;
  }
  int fd = open_file(dir, path, base, O_RDONLY, 0, why, why_size);
  close(dir);
  if (fd < 0) {
    *err_no = -fd;
    goto done;
  }
  struct stat st;
  buf = malloc((size_t)max + 1);
  if (!buf || fstat(fd, &st) < 0) {
    *err_no = buf ? errno : ENOMEM;
    snprintf(why, why_size, "path '%s': %s", path, strerror(*err_no));
    close(fd);
    goto done;
  }
  size_t got = 0;
  while (got < (size_t)max) {
    ssize_t r = pread(fd, buf + got, (size_t)max - got, (off_t)offset + (off_t)got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      *err_no = errno;
      snprintf(why, why_size, "path '%s': read: %s", path, strerror(errno));
      close(fd);
      goto done;
    }
    if (r == 0)
      break;
    got += (size_t)r;
  }
  close(fd);
  out = reply("data", req);
  if (eph_proto_add_b64(out, "data", buf, got) < 0) {
    json_object_put(out);
    out = NULL;
    *err_no = ENOMEM;
    snprintf(why, why_size, "out of memory");
    goto done;
  }
  json_object_object_add(out, "size", json_object_new_int64(st.st_size));
  json_object_object_add(out, "eof", json_object_new_boolean(offset + (int64_t)got >= st.st_size));
done:
  as_guest();
  free(buf);
  return out;
}

json_object *
guest_fs_list(const guest_fs_t *fs, json_object *req, int *err_no, char *why, size_t why_size)
{
  const char *path = eph_json_get_string(req, "path");
  if (!path)
    path = "";
  json_object *out = NULL;
  char base[256];
  as_worker(fs);
  int dir = open_parent(fs, path, false, base, sizeof base, why, why_size);
  if (dir < 0) {
    *err_no = -dir;
    goto done;
  }
  int fd = open_beneath(dir, *base ? base : ".", O_RDONLY | O_DIRECTORY, 0);
  close(dir);
  if (fd < 0) {
    *err_no = errno == EXDEV ? EACCES : errno;
    snprintf(why, why_size, "path '%s': %s", path,
             errno == EXDEV ? "leads outside scratch" : strerror(errno));
    goto done;
  }
  DIR *d = fdopendir(fd);
  if (!d) {
    *err_no = errno;
    snprintf(why, why_size, "path '%s': %s", path, strerror(errno));
    close(fd);
    goto done;
  }
  json_object *arr = json_object_new_array();
  bool truncated = false;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    if (json_object_array_length(arr) >= MAX_LIST_ENTRIES) {
      truncated = true;
      break;
    }
    struct stat st;
    if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
      continue; /* removed meanwhile */
    const char *type = S_ISREG(st.st_mode)   ? "f"
                       : S_ISDIR(st.st_mode) ? "d"
                       : S_ISLNK(st.st_mode) ? "l"
                                             : "?";
    json_object *e = json_object_new_object();
    json_object_object_add(e, "name", json_object_new_string(de->d_name));
    json_object_object_add(e, "type", json_object_new_string(type));
    json_object_object_add(e, "size", json_object_new_int64(st.st_size));
    json_object_object_add(e, "mtime", json_object_new_int64(st.st_mtim.tv_sec));
    json_object_array_add(arr, e);
  }
  closedir(d);
  out = reply("entries", req);
  json_object_object_add(out, "entries", arr);
  json_object_object_add(out, "truncated", json_object_new_boolean(truncated));
done:
  as_guest();
  return out;
}
