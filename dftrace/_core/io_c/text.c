/* text.c: the lines of JSON the file-I/O module makes itself (FH and io_file
 * records): a growing buffer, numbers, hashes and paths as JSON strings. */
#define PY_SSIZE_T_CLEAN
#include "../engine_c/digits.h" /* first: it includes Python.h */
#include "io.h"

#include <stdlib.h>
#include <string.h>

int text_put(text_t *t, const char *s, size_t n) {
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < t->n + n)
            cap *= 2;
        char *g = realloc(t->p, cap);
        if (!g)
            return -1;
        t->p = g;
        t->cap = cap;
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    return 0;
}

int text_int(text_t *t, long long v) {
    char d[24];
    return text_put(t, d, (size_t)(put_int(d, v) - d));
}

/* The length of the valid UTF-8 sequence at s (n bytes left), 0 when it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t k = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!k || k > n)
        return 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c == 0xE0) lo = 0xA0;
    else if (c == 0xED) hi = 0x9F;
    else if (c == 0xF0) lo = 0x90;
    else if (c == 0xF4) hi = 0x8F;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < k; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return k;
}

/* `s` as a JSON string: escaped as JSON needs, and each byte that is not part of
   valid UTF-8 written as the text \xNN (as Python's "backslashreplace" writes it),
   so that a path is never altered but where it cannot be text. */
int text_json(text_t *t, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    if (text_put(t, "\"", 1) < 0)
        return -1;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        if (c >= 0x80) {
            size_t k = utf8_len(u + i, n - i);
            if (k) {
                if (text_put(t, s + i, k) < 0)
                    return -1;
                i += k;
                continue;
            }
            char e[6] = {'\\', '\\', 'x', hex[c >> 4], hex[c & 15]};
            if (text_put(t, e, 5) < 0)
                return -1;
        } else if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            if (text_put(t, e, 2) < 0)
                return -1;
        } else if (c < 0x20) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            if (text_put(t, e, 6) < 0)
                return -1;
        } else if (text_put(t, s + i, 1) < 0) {
            return -1;
        }
        i++;
    }
    return text_put(t, "\"", 1);
}

int text_hash(text_t *t, uint64_t h) { /* as a JSON string */
    char x[18];
    x[0] = x[17] = '"';
    put_hex16(x + 1, h);
    return text_put(t, x, 18);
}
