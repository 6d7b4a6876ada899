/* filter.c: which paths are traced. A path is made absolute (the working directory,
 * or the directory fd of an *at call, through /proc/self/fd) and normalised ("." and
 * ".." and repeated slashes folded), then matched against the excluded prefixes,
 * endings and paths and the traced prefixes; its hash is what the fd's later calls
 * carry. Called by the wrappers: nothing here allocates or locks. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "wrap.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ------------------------------------------------------------------------- */
/* the path filter */

typedef struct {
    char s[IO_PATH_MAX];
    size_t n;
} prefix_t;
static prefix_t traced_prefixes[IO_MAX_PREFIXES], excluded_prefixes[IO_MAX_PREFIXES],
    endings[IO_MAX_PREFIXES], exact[IO_MAX_PREFIXES];
static int ntraced = 0, nexcluded = 0, nendings = 0, nexact = 0;

static int set_list(prefix_t *to, int *nto, const char *const *from, int n) {
    if (n > IO_MAX_PREFIXES)
        return -1;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(from[i]);
        if (len >= IO_PATH_MAX)
            return -1;
        memcpy(to[i].s, from[i], len + 1);
        to[i].n = len;
    }
    *nto = n;
    return 0;
}

int io_set_filter(const char *const *traced, int nt, const char *const *excluded, int nx,
                  const char *const *ends, int ne, const char *const *paths, int np) {
    if (set_list(traced_prefixes, &ntraced, traced, nt) < 0 ||
        set_list(excluded_prefixes, &nexcluded, excluded, nx) < 0 ||
        set_list(endings, &nendings, ends, ne) < 0 || set_list(exact, &nexact, paths, np) < 0)
        return -1;
    return 0;
}

uint64_t io_path_hash(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h ? h : 1;
}

/* Fold "//", "/./" and "/x/../" of an absolute path in place; its new length. */
static size_t normalise(char *p, size_t n) {
    size_t o = 0, i = 0;
    while (i < n) {
        while (i < n && p[i] == '/')
            i++;
        size_t s = i;
        while (i < n && p[i] != '/')
            i++;
        size_t len = i - s;
        if (len == 0 || (len == 1 && p[s] == '.'))
            continue;
        if (len == 2 && p[s] == '.' && p[s + 1] == '.') {
            while (o > 0 && p[o - 1] != '/')
                o--;
            if (o > 0)
                o--; /* the slash before the dropped name */
            continue;
        }
        p[o++] = '/';
        memmove(p + o, p + s, len);
        o += len;
    }
    if (o == 0)
        p[o++] = '/';
    p[o] = '\0';
    return o;
}

/* The absolute, normalised path of `path` (relative to `dirfd`) in `out`; its length,
   or 0 when it cannot be had. */
static size_t absolute(int dirfd, const char *path, char *out) {
    size_t np = strnlen(path, IO_PATH_MAX);
    size_t nb = 0;
    if (path[0] != '/') {
        if (dirfd == AT_FDCWD) {
            long r = syscall(SYS_getcwd, out, IO_PATH_MAX);
            if (r <= 0 || out[0] != '/')
                return 0;
            nb = strnlen(out, IO_PATH_MAX);
        } else {
            char link[32] = "/proc/self/fd/";
            char digits[12];
            int nd = 0;
            unsigned v = (unsigned)dirfd;
            do {
                digits[nd++] = (char)('0' + v % 10);
                v /= 10;
            } while (v);
            size_t at = 14;
            while (nd)
                link[at++] = digits[--nd];
            link[at] = '\0';
            ssize_t r = readlink(link, out, IO_PATH_MAX - 1);
            if (r <= 0 || out[0] != '/')
                return 0;
            nb = (size_t)r;
        }
        if (nb + 1 + np >= IO_PATH_MAX)
            return 0;
        out[nb++] = '/';
    }
    if (nb + np >= IO_PATH_MAX)
        return 0;
    memcpy(out + nb, path, np);
    return normalise(out, nb + np);
}

static inline int has_prefix(const char *p, size_t n, const prefix_t *x) {
    return n >= x->n && memcmp(p, x->s, x->n) == 0;
}

/* The hash of `path` when it is traced (its absolute form left in `out`, its length
   in `*nout`), else 0. */
uint64_t io_match(int dirfd, const char *path, char *out, size_t *nout) {
    if (!path || !path[0])
        return 0;
    size_t n = absolute(dirfd, path, out);
    if (!n)
        return 0;
    for (int i = 0; i < nexcluded; i++)
        if (has_prefix(out, n, &excluded_prefixes[i]))
            return 0;
    for (int i = 0; i < nendings; i++)
        if (n >= endings[i].n && memcmp(out + n - endings[i].n, endings[i].s, endings[i].n) == 0)
            return 0;
    for (int i = 0; i < nexact; i++)
        if (n == exact[i].n && memcmp(out, exact[i].s, n) == 0)
            return 0;
    if (ntraced) {
        int in = 0;
        for (int i = 0; i < ntraced && !in; i++) {
            const prefix_t *x = &traced_prefixes[i];
            /* a directory prefix matches itself and what is under it */
            in = has_prefix(out, n, x) &&
                 (n == x->n || x->s[x->n - 1] == '/' || out[x->n] == '/');
        }
        if (!in)
            return 0;
    }
    *nout = n;
    return io_path_hash(out, n);
}
