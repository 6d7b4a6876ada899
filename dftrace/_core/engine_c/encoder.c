/* encoder.c: JSON in C. The args fragment of a small flat dict of plain keys and
 * JSON scalars (encoded once, when the args are given), and the one line encoder of
 * records, used by the in-process writer (writer.c) and the drainer (shm_consumer.c). */
#include "encoder.h"
#include "digits.h"
#include "io_sink.h"
#include "module.h"

/* ------------------------------------------------------------------------- */
/* args: the fragment of a small flat dict of plain keys and JSON scalars      */

static Py_ssize_t max_arg_len = 1024;
int dft_off_for_good = 0;

static PyObject *set_options(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    int off;
    if (!PyArg_ParseTuple(args, "np", &n, &off))
        return NULL;
    max_arg_len = n;
    dft_off_for_good = off;
    Py_RETURN_NONE;
}

/* The ASCII characters JSON escapes in a string: controls, '"' and '\\'. */
static const unsigned char ESCAPED[128] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    ['"'] = 1, ['\\'] = 1};

/* An ASCII str that JSON writes as it is (no escapes), at most max_arg_len long. */
static const char *plain_str(PyObject *o, Py_ssize_t *n) {
    if (!PyUnicode_CheckExact(o) || !PyUnicode_IS_ASCII(o))
        return NULL;
    Py_ssize_t len = PyUnicode_GET_LENGTH(o);
    if (len > max_arg_len)
        return NULL;
    const unsigned char *c = PyUnicode_1BYTE_DATA(o);
    for (Py_ssize_t k = 0; k < len; k++)
        if (ESCAPED[c[k]])
            return NULL;
    *n = len;
    return (const char *)c;
}

static int is_reserved(const char *k, Py_ssize_t n) {
    return (n == 5 && (!memcmp(k, "hhash", 5) || !memcmp(k, "level", 5))) ||
           (n == 5 && !memcmp(k, "p_idx", 5));
}

/* Values JSON writes as they are: None, bools, 64-bit ints, finite floats, plain
   strings, and lists/tuples/dicts of those (at most 32 items, three levels deep:
   what sanitize_args keeps as it is). -1: not plain (Python sanitizes it). */
#define PLAIN_MAX_ITEMS 32
#define PLAIN_MAX_DEPTH 3

typedef struct {
    char *o, *end;
    int nested; /* a container was written */
} pbuf;

static int pb_room(pbuf *b, Py_ssize_t n) { return b->end - b->o >= n; }

/* A float's repr (CPython's, which allocates its string): the last few are kept, so
   that args that repeat (a ratio, a learning rate) cost no allocation. */
#define FLOATS_KEPT 4
typedef struct {
    uint64_t bits;
    uint8_t n;
    char s[31];
} kept_float_t;

static int put_float(pbuf *b, double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
#if !defined(Py_GIL_DISABLED)
    static kept_float_t kept[FLOATS_KEPT];
    static int next;
    for (int i = 0; i < FLOATS_KEPT; i++)
        if (kept[i].n && kept[i].bits == bits) {
            b->o = put(b->o, kept[i].s, kept[i].n); /* put_plain made room for 32 */
            return 0;
        }
#endif
    char *r = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!r) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t n = (Py_ssize_t)strlen(r);
    if (!pb_room(b, n)) {
        PyMem_Free(r);
        return -1;
    }
    b->o = put(b->o, r, n);
#if !defined(Py_GIL_DISABLED)
    if (n <= (Py_ssize_t)sizeof(kept[0].s)) {
        kept_float_t *k = &kept[next];
        next = (next + 1) % FLOATS_KEPT;
        k->bits = bits;
        k->n = (uint8_t)n;
        memcpy(k->s, r, (size_t)n);
    }
#endif
    PyMem_Free(r);
    return 0;
}

static int put_plain(pbuf *b, PyObject *v, int depth) {
    if (!pb_room(b, 32))
        return -1;
    if (v == Py_None) {
        b->o = put(b->o, LIT("null"));
    } else if (v == Py_True) {
        b->o = put(b->o, LIT("true"));
    } else if (v == Py_False) {
        b->o = put(b->o, LIT("false"));
    } else if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x;
        if (small_int(v, &x)) {
            b->o = put_int(b->o, x);
            return 0;
        }
        x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            /* beyond int64: not plain; the Python side writes its digits as a string */
            PyErr_Clear();
            return -1;
        } else {
            b->o = put_int(b->o, x);
        }
    } else if (PyFloat_CheckExact(v)) {
        double x = PyFloat_AS_DOUBLE(v);
        if (x - x != 0)
            return -1; /* NaN or infinity: sanitize writes them as strings */
        if (put_float(b, x) < 0)
            return -1;
    } else if (PyUnicode_CheckExact(v)) {
        Py_ssize_t n;
        const char *vs = plain_str(v, &n);
        if (!vs || !pb_room(b, n + 2))
            return -1;
        *b->o++ = '"';
        b->o = put(b->o, vs, n);
        *b->o++ = '"';
    } else if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        if (depth >= PLAIN_MAX_DEPTH || n > PLAIN_MAX_ITEMS)
            return -1;
        b->nested = 1;
        *b->o++ = '[';
        for (Py_ssize_t k = 0; k < n; k++) {
            if (k)
                *b->o++ = ',';
            if (put_plain(b, PySequence_Fast_GET_ITEM(v, k), depth + 1) < 0 || !pb_room(b, 2))
                return -1;
        }
        *b->o++ = ']';
    } else if (PyDict_CheckExact(v)) {
        if (depth >= PLAIN_MAX_DEPTH || PyDict_GET_SIZE(v) > PLAIN_MAX_ITEMS)
            return -1;
        b->nested = 1;
        *b->o++ = '{';
        Py_ssize_t pos = 0;
        PyObject *k, *x;
        int first = 1;
        while (PyDict_Next(v, &pos, &k, &x)) {
            Py_ssize_t nk;
            const char *ks = plain_str(k, &nk);
            if (!ks || !pb_room(b, nk + 8))
                return -1;
            if (!first)
                *b->o++ = ',';
            first = 0;
            *b->o++ = '"';
            b->o = put(b->o, ks, nk);
            *b->o++ = '"';
            *b->o++ = ':';
            if (put_plain(b, x, depth + 1) < 0 || !pb_room(b, 2))
                return -1;
        }
        *b->o++ = '}';
    } else {
        return -1;
    }
    return 0;
}

/* Extras are made per use of node(args=...), per Span.stop(args=) and per update():
   a few are kept for the next ones (extra_free, as uses and Spans are), and so are
   the fragments (bytes) of those no one else held, each rewritten in place by the
   next fragment of its length (args that change every step mostly keep theirs). */
static freelist_t extra_free;
#if !defined(Py_GIL_DISABLED)
#define SPARE_FRAGS 8
static PyObject *spare_frags[SPARE_FRAGS];
static int nspare_frags;
#endif

static void extra_dealloc(PyObject *o) {
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    PyObject *f = SLOT_REF(o, dft_slot_frag);
    SLOT_REF(o, dft_slot_frag) = NULL;
#if !defined(Py_GIL_DISABLED)
    if (f && PyBytes_CheckExact(f) && Py_REFCNT(f) == 1 && PyBytes_GET_SIZE(f) > 1) {
        /* full: the last one kept makes room (those of lengths no longer made go) */
        if (nspare_frags == SPARE_FRAGS)
            Py_DECREF(spare_frags[--nspare_frags]);
        spare_frags[nspare_frags++] = f;
        f = NULL;
    }
#endif
    Py_XDECREF(f);
    Py_CLEAR(SLOT_REF(o, dft_slot_mask));
    Py_CLEAR(SLOT_REF(o, dft_slot_args));
    freelist_free(&extra_free, o);
    Py_DECREF(tp);
}

/* Serve the registered Extra class from the freelist (its three slots found). */
void dft_extra_serve(void) {
    PyTypeObject *tp = (PyTypeObject *)dft_calls.extra_type;
    if (tp == extra_free.type)
        return;
    int slots = tp && dft_slot_frag.type == tp && dft_slot_mask.type == tp && dft_slot_args.type == tp &&
                dft_slot_frag.off >= 0 && dft_slot_mask.off >= 0 && dft_slot_args.off >= 0;
    freelist_serve(&extra_free, slots ? tp : NULL, (Py_ssize_t)(sizeof(PyObject) + 3 * sizeof(PyObject *)),
                   extra_dealloc);
}

/* Bytes holding s[:n]: a spare fragment of that length rewritten (nobody holds it),
   else new. */
static PyObject *frag_bytes(const char *s, Py_ssize_t n) {
#if !defined(Py_GIL_DISABLED)
    for (int i = nspare_frags - 1; i >= 0; i--) {
        PyObject *b = spare_frags[i];
        if (PyBytes_GET_SIZE(b) == n) {
            spare_frags[i] = spare_frags[--nspare_frags];
            memcpy(PyBytes_AS_STRING(b), s, (size_t)n);
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
            ((PyBytesObject *)b)->ob_shash = -1; /* its hash is not known any more */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
            return b;
        }
    }
#endif
    return PyBytes_FromStringAndSize(s, n);
}

/* (frag, mask) for a plain dict; NULL without an error when it is not plain.
   *nested tells whether it held containers (their copy is then not a snapshot). */
static PyObject *plain_fragment_of(PyObject *d, unsigned long long *mask_out, int *nested) {
    if (!PyDict_CheckExact(d) || PyDict_GET_SIZE(d) > PLAIN_MAX_ITEMS)
        return NULL;
    char buf[16384];
    pbuf b = {buf, buf + sizeof(buf), 0};
    unsigned long long mask = 0;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v)) {
        Py_ssize_t nk;
        const char *ks = plain_str(k, &nk);
        if (!ks || is_reserved(ks, nk) || !pb_room(&b, nk + 8))
            return NULL;
        Py_hash_t h = ((PyASCIIObject *)k)->hash; /* a str's, kept once computed */
        if (h == -1)
            h = PyObject_Hash(k);
        if (h == -1) {
            PyErr_Clear();
            return NULL;
        }
        mask |= 1ULL << ((unsigned long long)h & 63);
        *b.o++ = ',';
        *b.o++ = '"';
        b.o = put(b.o, ks, nk);
        *b.o++ = '"';
        *b.o++ = ':';
        if (put_plain(&b, v, 0) < 0)
            return NULL;
    }
    *mask_out = mask;
    *nested = b.nested;
    return frag_bytes(buf, b.o - buf);
}

/* The mask as an int (new reference). Masks repeat (one per set of keys: every
   update(epoch=, step=) has the same), so the last few are kept and shared. */
#define MASKS_KEPT 4
static PyObject *mask_int(unsigned long long mask) {
#ifndef Py_GIL_DISABLED
    static PyObject *kept[MASKS_KEPT];
    static unsigned long long values[MASKS_KEPT];
    static int next;
    for (int i = 0; i < MASKS_KEPT; i++)
        if (kept[i] && values[i] == mask)
            return Py_NewRef(kept[i]);
    PyObject *m = PyLong_FromUnsignedLongLong(mask);
    if (m) {
        Py_XSETREF(kept[next], Py_NewRef(m));
        values[next] = mask;
        next = (next + 1) % MASKS_KEPT;
    }
    return m;
#else
    return PyLong_FromUnsignedLongLong(mask);
#endif
}

/* An Extra for a plain dict (its fragment and mask, and d itself as its snapshot
   when `fresh`: a dict no one else holds, made for this Extra); NULL without an
   error when the dict is not plain. Without a snapshot its args are decoded from
   the fragment when asked for (Extra.args), the values they were when encoded. */
PyObject *dft_plain_extra(PyObject *d, int fresh) {
    unsigned long long mask = 0;
    int nested = 0;
    PyObject *frag = plain_fragment_of(d, &mask, &nested);
    if (!frag)
        return NULL;
    PyTypeObject *t = (PyTypeObject *)dft_calls.extra_type;
    PyObject *x = t ? freelist_alloc(&extra_free, t) : NULL;
    /* with containers, a dict would share them: no snapshot */
    PyObject *copy = x ? Py_NewRef(fresh && !nested ? d : Py_None) : NULL;
    PyObject *m = copy ? mask_int(mask) : NULL;
    if (!m || slot_set(x, &dft_slot_args, copy) < 0 || slot_set(x, &dft_slot_frag, frag) < 0 ||
        slot_set(x, &dft_slot_mask, m) < 0) {
        Py_XDECREF(x);
        x = NULL;
    }
    Py_XDECREF(m);
    Py_XDECREF(copy);
    Py_DECREF(frag);
    return x;
}

/* plain_fragment(d) -> (frag, mask) or None */
static PyObject *plain_fragment_py(PyObject *self, PyObject *d) {
    unsigned long long mask = 0;
    int nested = 0;
    PyObject *frag = plain_fragment_of(d, &mask, &nested);
    if (!frag) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(NKO)", frag, mask, nested ? Py_True : Py_False);
}


/* Decimal digits of u < 2^32 in 32-bit arithmetic (ids, tids, levels, counts). */
static inline char *put_u32(char *o, uint32_t u) {
    int n = u < 100000 ? (u < 100 ? (u < 10 ? 1 : 2) : u < 1000 ? 3 : u < 10000 ? 4 : 5)
                       : u < 10000000 ? (u < 1000000 ? 6 : 7)
                       : u < 100000000 ? 8 : u < 1000000000 ? 9 : 10;
    char *end = o + n, *t = end;
    while (u >= 100) {
        uint32_t q = u / 100;
        t -= 2;
        memcpy(t, DIGIT_PAIRS + 2 * (u - q * 100), 2);
        u = q;
    }
    if (u >= 10)
        memcpy(t - 2, DIGIT_PAIRS + 2 * u, 2);
    else
        t[-1] = (char)('0' + u);
    return end;
}

static inline char *put_num(char *o, unsigned long long u) {
    return u <= 0xFFFFFFFFULL ? put_u32(o, (uint32_t)u) : put_uint(o, u);
}

/* Exactly eight digits of v < 10^8, leading zeros included. */
static inline char *put8(char *o, uint32_t v) {
    uint32_t a = v / 10000, b = v - a * 10000;
    uint32_t a1 = a / 100, b1 = b / 100;
    memcpy(o, DIGIT_PAIRS + 2 * a1, 2);
    memcpy(o + 2, DIGIT_PAIRS + 2 * (a - a1 * 100), 2);
    memcpy(o + 4, DIGIT_PAIRS + 2 * b1, 2);
    memcpy(o + 6, DIGIT_PAIRS + 2 * (b - b1 * 100), 2);
    return o + 8;
}

/* A file-I/O call's args (F_IO): the file's hash, the bytes done, the offset, errno
   where it failed, and the calls an aggregate covers. A record whose raw values are
   short (read from another process's ring) gets the hash alone. */
static inline char *put_io_args(char *o, const rec_t *r, const char *arena) {
    o = put(o, LIT(",\"fhash\":\""));
    o = put_hex16(o, r->parent);
    *o++ = '"';
    dft_io_args_t a;
    if (r->alen < sizeof(a))
        return o;
    memcpy(&a, arena + r->aoff, sizeof(a));
    o = put(o, LIT(",\"ret\":"));
    o = a.ret >= 0 ? put_num(o, (unsigned long long)a.ret) : put_int(o, a.ret);
    if (a.offset >= 0) {
        o = put(o, LIT(",\"offset\":"));
        o = put_num(o, (unsigned long long)a.offset);
    }
    uint32_t err = r->level_flags & 0xFF; /* errno, 0-255 */
    if (a.ret < 0 && err) {
        o = put(o, LIT(",\"errno\":"));
        o = put_u32(o, err);
    }
    if (a.calls) {
        o = put(o, LIT(",\"calls\":"));
        o = put_num(o, a.calls);
        o = put(o, LIT(",\"aggregated\":true"));
    }
    return o;
}

/* The longest file-I/O line: `{"id":`, `,"ts":`, `,"dur":`, `,"count":`, `}}\n` and
   five numbers of 20 digits (id, tid, ts, dur, count) beside its args' text. */
typedef char io_line_fits[131 + IO_ARGS_TEXT_MAX <= REC_FIXED + sizeof(dft_io_args_t) ? 1 : -1];

#define TS_LOW 100000000LL /* a timestamp's last eight digits change; the rest rarely */

/* The JSON lines of records [from, to) of a chunk whose args are in `arena`; the
   one encoder of both the in-process writer and the drainer. The piece from the
   pid to the timestamp's leading digits is the same line after line (one thread,
   the same 100 s): it is kept, and rebuilt only when the tid or those digits change. */
char *dft_encode_recs(char *o, const rec_t *recs, uint32_t from, uint32_t to,
                         const char *arena, const kind_t *ks, Py_ssize_t nk, const char *pidp,
                         Py_ssize_t npid, const char *hhp, Py_ssize_t nhh, long long off,
                         long long min_id) {
    /* `,"pid":P,"tid":T,"ts":` + the leading digits of ts, for (pre_tid, pre_hi) */
    char pre[128];
    Py_ssize_t npre = 0;
    unsigned long long pre_tid = 0;
    long long pre_hi = -1;
    int cached = npid <= (Py_ssize_t)sizeof(pre) - 48;
    for (uint32_t k = from; k < to; k++) {
        const rec_t *r = &recs[k];
        if ((r->level_flags >> LEVEL_BITS) & F_RAW) {
            o = put(o, arena + r->aoff, r->alen);
            continue;
        }
        if ((long long)r->id <= min_id)
            continue;
        long long ts = (r->t0 + off) / 1000;
        long long dur = (r->t1 + off) / 1000 - ts;
        o = put(o, LIT("{\"id\":"));
        o = put_num(o, r->id);
        if (r->kind < nk)
            o = put(o, ks[r->kind].piece, ks[r->kind].n);
        else
            o = put(o, LIT(",\"name\":\"?\",\"cat\":\"dftrace\""));
        if (cached && ts >= TS_LOW) {
            long long hi = ts / TS_LOW;
            if (hi != pre_hi || r->tid != pre_tid) {
                char *p = put(pre, pidp, npid);
                p = put_num(p, r->tid);
                p = put(p, LIT(",\"ts\":"));
                p = put_uint(p, (unsigned long long)hi);
                npre = p - pre;
                pre_hi = hi;
                pre_tid = r->tid;
            }
            o = put(o, pre, npre);
            o = put8(o, (uint32_t)(ts - hi * TS_LOW));
        } else {
            o = put(o, pidp, npid);
            o = put_num(o, r->tid);
            o = put(o, LIT(",\"ts\":"));
            o = put_int(o, ts);
        }
        o = put(o, LIT(",\"dur\":"));
        if (dur >= 0)
            o = put_num(o, (unsigned long long)dur);
        else
            o = put_int(o, dur);
        if ((r->level_flags >> LEVEL_BITS) & F_IO) {
            o = put(o, hhp, nhh - (Py_ssize_t)(sizeof(",\"level\":") - 1));
            o = put_io_args(o, r, arena);
        } else {
            o = put(o, hhp, nhh);
            o = put_u32(o, r->level_flags & LEVEL_MASK);
            o = put(o, LIT(",\"p_idx\":"));
            o = put_num(o, r->parent);
            if (r->alen)
                o = put(o, arena + r->aoff, r->alen);
        }
        if (r->count >= 0) {
            o = put(o, LIT(",\"count\":"));
            o = put_num(o, (unsigned long long)r->count);
        }
        if ((r->level_flags >> LEVEL_BITS) & F_INCOMPLETE)
            o = put(o, LIT(",\"incomplete\":true"));
        o = put(o, LIT("}}\n"));
    }
    return o;
}


/* The JSON lines of the records of the chunks from `c` on, written at `o`; returns
   the end. Runs without the GIL: it reads only the chunks (detached, the caller's
   own) and the kind table (never freed). */
char *dft_encode_chunks(chunk_t *c, char *o, const kind_t *ks, Py_ssize_t nk,
                           const char *pidp, Py_ssize_t npid, const char *hhp,
                           Py_ssize_t nhh, long long off, long long min_id) {
    for (; c; c = c->next)
        o = dft_encode_recs(o, c->recs, 0, c->n, c->arena, ks, nk, pidp, npid, hhp, nhh, off, min_id);
    return o;
}

/* The module's functions of this file (module.c adds them). */
PyMethodDef dft_encoder_methods[] = {
    {"set_options", set_options, METH_VARARGS, "set_options(max_arg_length, off_for_good)"},
    {"plain_fragment", plain_fragment_py, METH_O,
     "plain_fragment(d) -> (frag, mask, nested) for a dict of plain keys and JSON values, else None"},
    {NULL, NULL, 0, NULL}};
