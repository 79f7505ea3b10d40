/* Option parsing shared by the CLI's subcommands (apart from cli.c, whose command table
 * names every command: a command using this would otherwise depend on it in a cycle). */
#include <config.h>

#include <getopt.h>

#include "cli.h"
#include "log.h"

int
eph_cli_getopt(const char *cmd, int argc, char **argv, const struct option *opts)
{
  int saved = opterr;
  opterr = 0;
  int c = getopt_long(argc, argv, ":", opts, NULL);
  opterr = saved;
  if (c == '?' || c == ':')
    eph_error("%s: %s '%s'", cmd, c == ':' ? "a value is needed after" : "unknown option",
              argv[optind - 1]);
  return c == ':' ? '?' : c;
}

int
eph_cli_operands(const char *cmd, int argc, char **argv, int max)
{
  static const struct option none[] = {{0}};
  optind = 0; /* 0: glibc re-initialises (main parsed its own options in "+" order) */
  if (eph_cli_getopt(cmd, argc, argv, none) != -1)
    return -1; /* named */
  if (argc - optind > max) {
    eph_error("%s: unexpected argument '%s'", cmd, argv[optind + max]);
    return -1;
  }
  return argc - optind;
}
