/*
 * args.h — the command-line parsing every example and benchmark program shares, so that each one treats
 * its flags the same way: --help prints the usage and exits 0; an unknown flag, a missing value or a value
 * that is not a number in range is an error naming the flag (exit 2). Numbers go through strtoll / strtod
 * and must use the whole string ("12x", "", "1e400" and "nan" are refused).
 *
 *   for (int i = 1; i < argc; i++) {
 *       const char *f = argv[i];
 *       if (args_is_help(f)) return usage(stdout), 0;
 *       else if (!strcmp(f, "--runs")) { if (!args_int_flag(PROG, argc, argv, &i, 1, 100, &runs)) return 2; }
 *       else return args_unknown(PROG, f);
 *   }
 */
#ifndef QKV_EXAMPLES_ARGS_H
#define QKV_EXAMPLES_ARGS_H

#include <stdbool.h>
#include <stdint.h>

enum { ARGS_USAGE_ERROR = 2 }; /* the exit status of a bad command line */

/* "--help" or "-h". */
bool args_is_help(const char *arg);

/* The value after the flag argv[*i]: advances *i and returns it, or prints "prog: FLAG needs a value" and
 * returns NULL when the flag is the last argument. */
const char *args_value(const char *prog, int argc, char **argv, int *i);

/* text as an integer in [min, max] (whole string, base 10); on failure prints
 * "prog: FLAG needs an integer in [min, max], got 'text'" and returns false (out untouched). */
bool args_int(const char *prog, const char *flag, const char *text, int64_t min, int64_t max, int64_t *out);

/* text as a finite number in [min, max]; on failure prints "prog: FLAG needs a number in [min, max], got
 * 'text'" ("a finite number" for the whole range -DBL_MAX..DBL_MAX) and returns false. */
bool args_double(const char *prog, const char *flag, const char *text, double min, double max, double *out);

/* text as one of names[0..count-1]; returns its index, or prints "prog: FLAG needs one of a|b|c, got 'text'"
 * and returns -1. */
int args_choice(const char *prog, const char *flag, const char *text, const char *const *names, int count);

/* args_value then args_int / args_double: the usual "--flag N" in one call. */
bool args_int_flag(const char *prog, int argc, char **argv, int *i, int64_t min, int64_t max, int64_t *out);
bool args_double_flag(const char *prog, int argc, char **argv, int *i, double min, double max, double *out);

/* A flag of several integers, "--shape M K P": the count values after argv[*i] as integers, value k in
 * [min[k], max[k]] and named names[k] in a message ("--shape K needs an integer in ..."); advances *i. */
bool args_ints_flag(const char *prog, int argc, char **argv, int *i, int count, const char *const *names,
                    const int64_t *min, const int64_t *max, int64_t *out);

/* The whole command line of a program that takes no flags: returns -1 to run when there are no arguments;
 * for --help prints "usage: prog\n" and help to stdout and returns 0; anything else is refused (returns
 * ARGS_USAGE_ERROR). main: int status = args_none(...); if (status >= 0) return status; */
int args_none(const char *prog, int argc, char **argv, const char *help);

/* Prints "prog: unknown flag FLAG (see --help)" and returns ARGS_USAGE_ERROR. */
int args_unknown(const char *prog, const char *flag);

#endif
