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
