/* A trivial PID 1 for the backend tests (tests/test-backend-jail.c), standing in for
 * ephemeral-guest so the jail can be tested alone: `jail-init --fd N [...]` reads lines
 * "<uid> <shell command>\n" on fd N, runs `/bin/sh -c command` as uid/gid <uid> with stdout and
 * stderr on the fd, then writes "\n@@EXIT <wait status>\n". It reaps every orphan (PID 1's
 * job). Static: the jail's root has no copy of the build tree. */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int
main(int argc, char **argv)
{
  if (argc < 3 || strcmp(argv[1], "--fd") != 0) /* further options (--nofile) ignored */
    return 2;
  int fd = atoi(argv[2]);
  FILE *in = fdopen(fd, "r");
  char line[8192];
  while (in && fgets(line, sizeof line, in)) {
    line[strcspn(line, "\n")] = '\0';
    char *sp = strchr(line, ' ');
    if (!sp)
      continue;
    *sp = '\0';
    int uid = atoi(line);
    /* The pids limit counts zombies: reap them first; while the limit is held, retry for a
     * bounded 10 s (a fork bomb's last processes are still dying). */
    pid_t pid = -1;
    for (int tries = 0; tries < 1000; tries++) {
      while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
      if ((pid = fork()) >= 0 || errno != EAGAIN)
        break;
      struct timespec ts = {0, 10 * 1000000};
      nanosleep(&ts, NULL);
    }
    if (pid < 0) {
      static const char refused[] = "\n@@EXIT 32000\n";
      if (write(fd, refused, sizeof refused - 1) != (ssize_t)(sizeof refused - 1))
        return 3;
      continue;
    }
    if (pid == 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      if (uid != 0 && (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0))
        _exit(126);
      if (chdir("/tmp") < 0)
        _exit(126);
      execl("/bin/sh", "sh", "-c", sp + 1, (char *)NULL);
      _exit(127);
    }
    int st = 0;
    pid_t w;
    while ((w = wait(&st)) > 0 && w != pid)
      ;
    char end[64];
    int n = snprintf(end, sizeof end, "\n@@EXIT %d\n", st);
    if (write(fd, end, (size_t)n) != n)
      return 3;
    while (waitpid(-1, NULL, WNOHANG) > 0)
      ;
  }
  return 0;
}
