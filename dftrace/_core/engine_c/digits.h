/* digits.h: writing numbers and bytes into a line, inline: the encoder's lines and
 * args, and the file-I/O module's FH and io_file records. Plain C beside Python.h (no
 * engine header): both extension modules include it. */
#ifndef DFTRACE_DIGITS_H
#define DFTRACE_DIGITS_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline char *put(char *o, const char *s, Py_ssize_t n) {
    memcpy(o, s, (size_t)n);
    return o + n;
}

#define LIT(s) (s), (Py_ssize_t)(sizeof(s) - 1)

static const char DIGIT_PAIRS[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* The number of decimal digits of u. */
static inline int ndigits(unsigned long long u) {
    int n = 1;
    for (;;) {
        if (u < 10) return n;
        if (u < 100) return n + 1;
        if (u < 1000) return n + 2;
        if (u < 10000) return n + 3;
        u /= 10000;
        n += 4;
    }
}

/* Decimal digits of u, two at a time, written in place from the end. */
static inline char *put_uint(char *o, unsigned long long u) {
    char *end = o + ndigits(u), *t = end;
    while (u >= 100) {
        unsigned r = (unsigned)(u % 100);
        u /= 100;
        t -= 2;
        memcpy(t, DIGIT_PAIRS + 2 * r, 2);
    }
    if (u >= 10)
        memcpy(t - 2, DIGIT_PAIRS + 2 * u, 2);
    else
        t[-1] = (char)('0' + u);
    return end;
}

static inline char *put_int(char *o, long long v) {
    if (v < 0) {
        *o++ = '-';
        return put_uint(o, (unsigned long long)(-(v + 1)) + 1);
    }
    return put_uint(o, (unsigned long long)v);
}

static const char HEX_PAIRS[513] =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
    "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f"
    "404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f"
    "606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f"
    "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f"
    "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf"
    "c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf"
    "e0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff";

/* The 16 hex digits of h (lower case), two at a time. */
static inline char *put_hex16(char *o, uint64_t h) {
    for (int s = 56; s >= 0; s -= 8, o += 2)
        memcpy(o, HEX_PAIRS + 2 * ((h >> s) & 0xFF), 2);
    return o;
}

#endif /* DFTRACE_DIGITS_H */
