/* LD_PRELOADed into redis-server by instructions.py: /dev/urandom, which
 * Redis reads once at start for the seed of its hash functions, reads as
 * the same 64 bytes in every run. With a random seed, every server looks
 * command names (and keys) up through dictionary chains of other lengths:
 * up to 2% of a row's instructions moved from one run to the next. The
 * module's tokens come from getrandom(2) and stay random. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static char seed[64] = "redis-idem bench-instructions: the same hash seed in every run.";

static FILE *open_seed(void) { return fmemopen(seed, sizeof seed, "r"); }

FILE *fopen(const char *path, const char *mode) {
    static FILE *(*real)(const char *, const char *);
    if (path && strcmp(path, "/dev/urandom") == 0) return open_seed();
    if (!real) real = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen");
    return real(path, mode);
}

FILE *fopen64(const char *path, const char *mode) {
    static FILE *(*real)(const char *, const char *);
    if (path && strcmp(path, "/dev/urandom") == 0) return open_seed();
    if (!real) real = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen64");
    return real(path, mode);
}
