/*
 * args.c — the shared command-line parsing of the example and benchmark programs (args.h).
 */
#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool args_is_help(const char *arg) { return !strcmp(arg, "--help") || !strcmp(arg, "-h"); }

const char *args_value(const char *prog, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "%s: %s needs a value (see --help)\n", prog, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

bool args_int(const char *prog, const char *flag, const char *text, int64_t min, int64_t max, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    // strict: strtoll skips leading blanks, so ' 5' is refused here as '5 ' is by *end
    if (errno || end == text || *end || isspace((unsigned char)text[0]) || v < min || v > max) {
        fprintf(stderr, "%s: %s needs an integer in [%lld, %lld], got '%s'\n", prog, flag, (long long)min,
                (long long)max, text);
        return false;
    }
    *out = v;
    return true;
}

bool args_double(const char *prog, const char *flag, const char *text, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    bool overflow = errno == ERANGE && fabs(v) > 1; /* an underflow to about 0 is still a number */
    if (overflow || end == text || *end || isspace((unsigned char)text[0]) || !isfinite(v) || v < min || v > max) {
        if (min == -DBL_MAX && max == DBL_MAX) fprintf(stderr, "%s: %s needs a finite number, got '%s'\n", prog, flag, text);
        else fprintf(stderr, "%s: %s needs a number in [%g, %g], got '%s'\n", prog, flag, min, max, text);
        return false;
    }
    *out = v;
    return true;
}

int args_choice(const char *prog, const char *flag, const char *text, const char *const *names, int count) {
    for (int k = 0; k < count; k++)
        if (!strcmp(text, names[k])) return k;
    fprintf(stderr, "%s: %s needs one of ", prog, flag);
    for (int k = 0; k < count; k++) fprintf(stderr, "%s%s", k ? "|" : "", names[k]);
    fprintf(stderr, ", got '%s'\n", text);
    return -1;
}

bool args_int_flag(const char *prog, int argc, char **argv, int *i, int64_t min, int64_t max, int64_t *out) {
    const char *flag = argv[*i], *v = args_value(prog, argc, argv, i);
    return v && args_int(prog, flag, v, min, max, out);
}

bool args_double_flag(const char *prog, int argc, char **argv, int *i, double min, double max, double *out) {
    const char *flag = argv[*i], *v = args_value(prog, argc, argv, i);
    return v && args_double(prog, flag, v, min, max, out);
}

bool args_ints_flag(const char *prog, int argc, char **argv, int *i, int count, const char *const *names,
                    const int64_t *min, const int64_t *max, int64_t *out) {
    const char *flag = argv[*i];
    if (*i + count >= argc) {
        fprintf(stderr, "%s: %s needs %d values,", prog, flag, count);
        for (int k = 0; k < count; k++) fprintf(stderr, " %s", names[k]);
        fprintf(stderr, " (see --help)\n");
        return false;
    }
    for (int k = 0; k < count; k++) {
        char what[64];
        snprintf(what, sizeof what, "%s %s", flag, names[k]);
        if (!args_int(prog, what, argv[++*i], min[k], max[k], &out[k])) return false;
    }
    return true;
}

int args_none(const char *prog, int argc, char **argv, const char *help) {
    if (argc < 2) return -1;
    if (!args_is_help(argv[1])) return args_unknown(prog, argv[1]);
    printf("usage: %s\n%s", prog, help);
    return 0;
}

int args_unknown(const char *prog, const char *flag) {
    fprintf(stderr, "%s: unknown flag %s (see --help)\n", prog, flag);
    return ARGS_USAGE_ERROR;
}
