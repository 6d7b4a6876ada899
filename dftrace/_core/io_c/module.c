/* module.c: dftrace._core._io, the Python side of the file-I/O interposer.
 *
 * install() sets the filter, maps the ring and the fd table and binds the wrappers;
 * uninstall() unbinds them. drain() is the reader: it takes the calls recorded
 * since the last drain, keeps each file's counters (always, whatever is written),
 * and hands the calls to write to the engine (io_sink.h): one each up to
 * `max_calls`, the rest folded into one aggregate per file and call. All of it runs
 * holding the GIL, in the thread that drains; nothing here runs in a wrapper. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "io.h"
#include "../engine_c/digits.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- per-file counters -- */

#define HIST 10
/* One direction's counters (reads, or writes). `placed`: the calls that moved bytes
   at a known offset after another such call since the file was last opened (the
   ones an access pattern is about), of which `seq` started past that call's offset
   and `consec` right at its end. */
typedef struct {
    int64_t ops, bytes, ns, placed, seq, consec;
    int64_t last_off, last_end; /* of that call; -1: none since the open */
    int64_t hist[HIST];
} flow_t;

typedef struct {
    uint64_t fhash; /* 0: an empty place */
    char *path;
    flow_t read, write;
    int64_t metadata_ops, sync_ops, other_ops, metadata_ns, sync_ns;
    int64_t first_ns, last_ns;
} file_t;

static file_t *files = NULL;
static size_t files_cap = 0, files_n = 0;
static file_t *last_file = NULL; /* the file of the last call: the next one's, often */
static int forget_pending = 0; /* set in a forked child: its counters start afresh */
static unsigned long long calls_seen = 0, calls_aggregated = 0;

static void forget_files(void) {
    for (size_t i = 0; i < files_cap; i++)
        free(files[i].path);
    free(files);
    files = NULL;
    last_file = NULL;
    files_cap = files_n = 0;
    calls_seen = calls_aggregated = 0;
}

static file_t *file_of(uint64_t h) {
    if (last_file && last_file->fhash == h)
        return last_file;
    if (files_n * 2 >= files_cap) {
        size_t cap = files_cap ? files_cap * 2 : 1024;
        file_t *t = calloc(cap, sizeof(file_t));
        if (!t)
            return NULL;
        for (size_t i = 0; i < files_cap; i++) {
            if (!files[i].fhash)
                continue;
            size_t j = files[i].fhash & (cap - 1);
            while (t[j].fhash)
                j = (j + 1) & (cap - 1);
            t[j] = files[i];
        }
        free(files);
        files = t;
        files_cap = cap;
    }
    size_t j = h & (files_cap - 1);
    while (files[j].fhash && files[j].fhash != h)
        j = (j + 1) & (files_cap - 1);
    if (!files[j].fhash) {
        memset(&files[j], 0, sizeof(file_t));
        files[j].fhash = h;
        files[j].read.last_off = files[j].write.last_off = -1;
        files[j].read.last_end = files[j].write.last_end = -1;
        files[j].first_ns = INT64_MAX;
        files_n++;
    }
    return last_file = &files[j];
}

/* What each call counts as (a table: one load per call); metadata unless named. */
enum { K_METADATA, K_READ, K_WRITE, K_SYNC, K_OTHER };
static const uint8_t KIND_OF[OP_COUNT] = {
    [OP_READ] = K_READ, [OP_PREAD] = K_READ, [OP_READV] = K_READ, [OP_PREADV] = K_READ,
    [OP_FREAD] = K_READ, [OP_FGETS] = K_READ,
    [OP_WRITE] = K_WRITE, [OP_PWRITE] = K_WRITE, [OP_WRITEV] = K_WRITE,
    [OP_PWRITEV] = K_WRITE, [OP_FWRITE] = K_WRITE, [OP_FPUTS] = K_WRITE,
    [OP_FSYNC] = K_SYNC, [OP_FDATASYNC] = K_SYNC,
    [OP_MMAP] = K_OTHER,
};

/* Darshan's buckets: 0-100, 100-1K, 1K-10K, 10K-100K, 100K-1M, 1M-4M, 4M-10M,
   10M-100M, 100M-1G, 1G+. */
static const int64_t bucket_tops[HIST] = {100, 1024, 10240, 102400, 1048576, 4194304,
                                          10485760, 104857600, 1073741824, INT64_MAX};
/* The bucket of 2^l, by l: a size n in [2^l, 2^(l+1)) is in it or the next (no two
   tops are within a factor of two). */
static uint8_t bucket_of_log2[64];

static void buckets_init(void) {
    for (int l = 0; l < 64; l++) {
        int b = 0;
        while (b < HIST - 1 && (l >= 62 || (int64_t)1 << l >= bucket_tops[b]))
            b++;
        bucket_of_log2[l] = (uint8_t)b;
    }
}

static inline int bucket(int64_t n) { /* n > 0 */
    int b = bucket_of_log2[63 - __builtin_clzll((unsigned long long)n)];
    return b + (n >= bucket_tops[b]); /* the last top: none is past it */
}

/* A read or a write: its ops, time, bytes and size bucket, and whether it starts
   where the last one ended (consecutive) or after where it started (sequential). */
static inline void count_flow(flow_t *d, const io_rec_t *r) {
    d->ops++;
    d->ns += r->dur;
    if (r->ret <= 0)
        return;
    d->bytes += r->ret;
    d->hist[bucket(r->ret)]++;
    if (r->offset < 0)
        return;
    if (d->last_end >= 0) {
        d->placed++;
        d->consec += r->offset == d->last_end;
        d->seq += r->offset > d->last_off;
    }
    d->last_off = r->offset;
    d->last_end = r->offset + r->ret;
}

static void count(file_t *f, const io_rec_t *r) {
    int64_t end = r->t0 + r->dur;
    if (r->t0 < f->first_ns)
        f->first_ns = r->t0;
    if (end > f->last_ns)
        f->last_ns = end;
    int kind = KIND_OF[r->op];
    if (kind == K_READ) { /* the most frequent first */
        count_flow(&f->read, r);
    } else if (kind == K_WRITE) {
        count_flow(&f->write, r);
    } else if (kind == K_METADATA) {
        f->metadata_ops++;
        f->metadata_ns += r->dur;
        if (r->op == OP_OPEN || r->op == OP_OPENAT || r->op == OP_CREAT || r->op == OP_FOPEN)
            f->read.last_off = f->read.last_end = f->write.last_off = f->write.last_end = -1;
    } else if (kind == K_SYNC) {
        f->sync_ops++;
        f->sync_ns += r->dur;
    } else {
        f->other_ops++;
    }
}

/* -- aggregates of one drain, per file and call -- */

typedef struct {
    uint64_t fhash;
    uint8_t op, used;
    io_rec_t rec;
} agg_t;

#define AGG_CAP 4096
static agg_t aggs[AGG_CAP];
static int naggs_used = 0;

/* Fold `r` into its aggregate; 0, or -1 when the table is full (then it is written
   as a call of its own). */
static int aggregate(const io_rec_t *r) {
    size_t j = (r->fhash * 31 + r->op) & (AGG_CAP - 1);
    for (int n = 0; n < AGG_CAP; n++, j = (j + 1) & (AGG_CAP - 1)) {
        agg_t *a = &aggs[j];
        if (!a->used) {
            if (naggs_used >= AGG_CAP / 2)
                return -1;
            a->used = 1;
            a->fhash = r->fhash;
            a->op = r->op;
            a->rec = *r;
            a->rec.seq = 1;
            a->rec.offset = -1;
            a->rec.ret = r->ret > 0 ? r->ret : 0;
            a->rec.count = r->count > 0 ? r->count : 0;
            a->rec.err = 0;
            naggs_used++;
            return 0;
        }
        if (a->fhash == r->fhash && a->op == r->op) {
            a->rec.seq++;
            a->rec.dur += r->dur;
            if (r->t0 < a->rec.t0)
                a->rec.t0 = r->t0;
            if (r->ret > 0)
                a->rec.ret += r->ret;
            if (r->count > 0)
                a->rec.count += r->count;
            return 0;
        }
    }
    return -1;
}

/* -- the engine a drain hands its calls to -- */

/* Slots a drain reads before it hands them back to the wrappers (moves the tail). */
#define TAIL_STEP 1024

#define BATCH 256 /* calls handed to the engine at once */

typedef struct {
    const dft_io_sink_t *sink;
    uint32_t kid_of[256]; /* the kind of each call's name; UINT32_MAX: none */
    const io_rec_t *batch[BATCH];
    size_t n;
    long long kept, dropped;
} emit_t;

/* Hand the calls gathered to the engine. */
static void flush(emit_t *e) {
    size_t kept = e->n ? e->sink->record(e->kid_of, e->batch, NULL, e->n) : 0;
    e->kept += (long long)kept;
    e->dropped += (long long)(e->n - kept);
    e->n = 0;
}

/* Gather one call (read in place: handed on before its slot is given back). */
static inline void emit(emit_t *e, const io_rec_t *r) {
    e->batch[e->n++] = r;
    if (e->n == BATCH)
        flush(e);
}

/* Hand one aggregate of `calls` calls to the engine. */
static void emit_aggregate(emit_t *e, const io_rec_t *r, uint64_t calls) {
    size_t kept = e->sink->record(e->kid_of, &r, &calls, 1);
    e->kept += (long long)kept;
    e->dropped += 1 - (long long)kept;
}

static void after_fork_child(void) {
    io_after_fork_child();
    io_got_after_fork_child();
    forget_pending = 1;
}

/* -- lines of JSON made here: FH and io_file records -- */

typedef struct {
    char *p;
    size_t n, cap;
} text_t;

static int text_put(text_t *t, const char *s, size_t n) {
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

static int text_int(text_t *t, long long v) {
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
static int text_json(text_t *t, const char *s, size_t n) {
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

static int text_hash(text_t *t, uint64_t h) { /* as a JSON string */
    char x[18];
    x[0] = x[17] = '"';
    put_hex16(x + 1, h);
    return text_put(t, x, 18);
}

/* One FH record: `head` is the line up to its args' "name" value. */
static int fh_line(text_t *t, const char *head, size_t nhead, const char *path, size_t npath,
                   uint64_t h) {
    if (text_put(t, head, nhead) < 0 || text_json(t, path, npath) < 0 ||
        text_put(t, ",\"value\":", 9) < 0 || text_hash(t, h) < 0)
        return -1;
    return text_put(t, "}}\n", 3);
}

/* -- the module's functions -- */

static int installed = 0, atfork_registered = 0;

static int str_list(PyObject *list, const char **out, int max) {
    if (!PyList_Check(list) || PyList_GET_SIZE(list) > max) {
        PyErr_Format(PyExc_ValueError, "more than %d prefixes", max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        out[i] = PyUnicode_AsUTF8(PyList_GET_ITEM(list, i));
        if (!out[i])
            return -1;
    }
    return (int)PyList_GET_SIZE(list);
}

static PyObject *install(PyObject *self, PyObject *args) {
    unsigned int nslots;
    PyObject *traced, *excluded, *ends, *paths;
    const char *engine_path;
    if (!PyArg_ParseTuple(args, "IO!O!O!O!s", &nslots, &PyList_Type, &traced, &PyList_Type,
                          &excluded, &PyList_Type, &ends, &PyList_Type, &paths, &engine_path))
        return NULL;
    const char *t[IO_MAX_PREFIXES], *x[IO_MAX_PREFIXES], *e[IO_MAX_PREFIXES],
        *p[IO_MAX_PREFIXES];
    int nt = str_list(traced, t, IO_MAX_PREFIXES), nx = str_list(excluded, x, IO_MAX_PREFIXES),
        ne = str_list(ends, e, IO_MAX_PREFIXES), np = str_list(paths, p, IO_MAX_PREFIXES);
    if (nt < 0 || nx < 0 || ne < 0 || np < 0)
        return NULL;
    if (installed) {
        PyErr_SetString(PyExc_RuntimeError, "file I/O tracing is on already");
        return NULL;
    }
    if (io_set_filter(t, nt, x, nx, e, ne, p, np) < 0) {
        PyErr_SetString(PyExc_ValueError, "a path prefix is too long");
        return NULL;
    }
    if (io_ring_init(nslots) < 0 || io_fd_table_init() < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    buckets_init();
    if (!atfork_registered && pthread_atfork(NULL, NULL, after_fork_child) == 0)
        atfork_registered = 1;
    io_skip_object(engine_path);
    __atomic_store_n(&io_active, 1, __ATOMIC_RELEASE);
    installed = 1;
    return PyLong_FromLong(io_bind());
}

static PyObject *bind_new(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(installed ? io_bind() : 0);
}

static PyObject *uninstall(PyObject *self, PyObject *unused) {
    if (installed) {
        __atomic_store_n(&io_active, 0, __ATOMIC_RELEASE);
        io_unbind();
        installed = 0;
    }
    Py_RETURN_NONE;
}

/* drain(max_calls, fh_head, sink, kids) -> (FH lines: bytes, kept, not kept) (the
   ring's drops and the calls seen: stats()): max_calls < 0: no cap; fh_head: an FH line up to its args' "name" value;
   sink: _speedups.io_sink(); kids[op]: the kind of each call's name. */
static PyObject *drain(PyObject *self, PyObject *args) {
    long long max_calls;
    const char *head;
    Py_ssize_t nhead;
    PyObject *capsule, *kids;
    if (!PyArg_ParseTuple(args, "Ly#OO!", &max_calls, &head, &nhead, &capsule, &PyTuple_Type, &kids))
        return NULL;
    static emit_t e; /* the GIL's: one drain at a time */
    e.sink = PyCapsule_GetPointer(capsule, DFT_IO_SINK_CAPSULE);
    e.n = 0;
    e.kept = e.dropped = 0;
    if (!e.sink)
        return NULL;
    for (Py_ssize_t k = 0; k < 256; k++) {
        long v = k < OP_COUNT && k < PyTuple_GET_SIZE(kids) ? PyLong_AsLong(PyTuple_GET_ITEM(kids, k)) : -1;
        if (v == -1 && PyErr_Occurred())
            return NULL;
        e.kid_of[k] = v < 0 ? UINT32_MAX : (uint32_t)v;
    }
    if (forget_pending) {
        forget_files();
        forget_pending = 0;
    }
    text_t fh = {NULL, 0, 0};
    long long taken = 0, cap = max_calls < 0 ? LLONG_MAX : max_calls;
    char path[IO_PATH_MAX + 1];
    uint64_t i = io_ring.slots ? __atomic_load_n(&io_tail, __ATOMIC_RELAXED) : 0;
    uint64_t end = io_ring.slots ? __atomic_load_n(&io_head, __ATOMIC_ACQUIRE) : 0;
    uint64_t release_at = i + TAIL_STEP;
    while (i < end) {
        /* read in place: the slots are this drain's until the tail passes them, which
           it does every TAIL_STEP slots and at the end */
        io_rec_t *r = &io_ring.slots[i & io_ring.mask];
        if (__atomic_load_n(&r->seq, __ATOMIC_ACQUIRE) != i + 1)
            break; /* still being written */
        size_t npath = r->npath, k = 1;
        r->seq = 0; /* no stale number for the next lap */
        if (npath) {
            k += (npath + sizeof(io_rec_t) - 1) / sizeof(io_rec_t);
            for (size_t j = 1; j < k; j++) {
                io_rec_t *more = &io_ring.slots[(i + j) & io_ring.mask];
                size_t at = (j - 1) * sizeof(io_rec_t);
                size_t n = npath - at < sizeof(io_rec_t) ? npath - at : sizeof(io_rec_t);
                memcpy(path + at, more, n);
                more->seq = 0;
            }
            path[npath] = '\0';
        }
        i += k;
        if (i >= release_at) { /* the calls gathered first: they are read in place */
            flush(&e);
            __atomic_store_n(&io_tail, i - k, __ATOMIC_RELEASE);
            release_at = i + TAIL_STEP;
        }
        if (r->op >= OP_COUNT || !r->fhash)
            continue;
        file_t *f = file_of(r->fhash);
        if (!f)
            continue;
        if (npath && !f->path) {
            f->path = malloc(npath + 1);
            if (f->path) {
                memcpy(f->path, path, npath + 1);
                if (fh_line(&fh, head, (size_t)nhead, path, npath, r->fhash) < 0)
                    goto nomem;
            }
        }
        count(f, r);
        calls_seen++;
        if (taken >= cap && aggregate(r) == 0) {
            calls_aggregated++;
            continue;
        }
        taken++;
        emit(&e, r);
    }
    flush(&e);
    __atomic_store_n(&io_tail, i, __ATOMIC_RELEASE);
    if (naggs_used) {
        for (size_t j = 0; j < AGG_CAP; j++) {
            if (aggs[j].used)
                emit_aggregate(&e, &aggs[j].rec, aggs[j].rec.seq);
            aggs[j].used = 0;
        }
        naggs_used = 0;
    }
    e.sink->drained(e.kept, e.dropped);
    PyObject *lines = PyBytes_FromStringAndSize(fh.p ? fh.p : "", (Py_ssize_t)fh.n);
    free(fh.p);
    if (!lines)
        return NULL;
    return Py_BuildValue("(NLL)", lines, e.kept, e.dropped);
nomem:
    flush(&e);
    __atomic_store_n(&io_tail, i, __ATOMIC_RELEASE);
    e.sink->drained(e.kept, e.dropped);
    PyErr_NoMemory();
    for (size_t j = 0; j < AGG_CAP; j++)
        aggs[j].used = 0;
    naggs_used = 0;
    free(fh.p);
    return NULL;
}

/* counter_lines(offset_ns, head) -> bytes: each file's io_file record, `head` the
   line up to its args' first field; times in us (first_us/last_us on the trace's
   clock: CLOCK_MONOTONIC + offset_ns). */
static PyObject *counter_lines(PyObject *self, PyObject *args) {
    long long off;
    const char *head;
    Py_ssize_t nhead;
    if (!PyArg_ParseTuple(args, "Ly#", &off, &head, &nhead))
        return NULL;
    text_t t = {NULL, 0, 0};
    int bad = 0;
    for (size_t i = 0; !bad && i < files_cap; i++) {
        file_t *f = &files[i];
        if (!f->fhash)
            continue;
        const struct {
            const char *key;
            long long v;
        } fields[] = {
            {"read_ops", f->read.ops}, {"read_bytes", f->read.bytes},
            {"write_ops", f->write.ops}, {"write_bytes", f->write.bytes},
            {"metadata_ops", f->metadata_ops}, {"sync_ops", f->sync_ops},
            {"other_ops", f->other_ops}, {"read_time_us", f->read.ns / 1000},
            {"write_time_us", f->write.ns / 1000}, {"metadata_time_us", f->metadata_ns / 1000},
            {"sync_time_us", f->sync_ns / 1000}, {"placed_reads", f->read.placed},
            {"seq_reads", f->read.seq}, {"consec_reads", f->read.consec},
            {"placed_writes", f->write.placed}, {"seq_writes", f->write.seq},
            {"consec_writes", f->write.consec},
            {"first_us", f->first_ns == INT64_MAX ? 0 : (f->first_ns + off) / 1000},
            {"last_us", f->last_ns ? (f->last_ns + off) / 1000 : 0},
        };
        bad |= text_put(&t, head, (size_t)nhead) < 0 || text_put(&t, "\"fhash\":", 8) < 0 ||
               text_hash(&t, f->fhash) < 0 || text_put(&t, ",\"path\":", 8) < 0 ||
               (f->path ? text_json(&t, f->path, strlen(f->path)) : text_put(&t, "null", 4)) < 0;
        for (size_t k = 0; !bad && k < sizeof(fields) / sizeof(fields[0]); k++) {
            bad |= text_put(&t, ",\"", 2) < 0 || text_put(&t, fields[k].key, strlen(fields[k].key)) < 0 ||
                   text_put(&t, "\":", 2) < 0 || text_int(&t, fields[k].v) < 0;
        }
        for (int d = 0; !bad && d < 2; d++) {
            const int64_t *h = d ? f->write.hist : f->read.hist;
            bad |= text_put(&t, d ? ",\"write_hist\":[" : ",\"read_hist\":[", d ? 15 : 14) < 0;
            for (int b = 0; !bad && b < HIST; b++)
                bad |= (b && text_put(&t, ",", 1) < 0) || text_int(&t, h[b]) < 0;
            bad |= text_put(&t, "]", 1) < 0;
        }
        bad |= text_put(&t, "}}\n", 3) < 0;
    }
    PyObject *out = bad ? PyErr_NoMemory() : PyBytes_FromStringAndSize(t.p ? t.p : "", (Py_ssize_t)t.n);
    free(t.p);
    return out;
}

static PyObject *stats(PyObject *self, PyObject *unused) {
    return Py_BuildValue("{s:K,s:K,s:K}", "calls", calls_seen, "aggregated_calls",
                         calls_aggregated, "dropped",
                         (unsigned long long)__atomic_load_n(&io_dropped, __ATOMIC_RELAXED));
}

static PyObject *op_names(PyObject *self, PyObject *unused) {
    PyObject *t = PyTuple_New(OP_COUNT);
    for (int i = 0; t && i < OP_COUNT; i++) {
        PyObject *s = PyUnicode_FromString(io_op_names[i]);
        if (!s) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

static PyMethodDef methods[] = {
    {"install", install, METH_VARARGS,
     "install(ring_slots, traced_prefixes, excluded_prefixes, excluded_endings, "
     "excluded_paths, engine_path)"
     " -> GOT entries bound"},
    {"bind_new", bind_new, METH_NOARGS, "bind the objects loaded since; the entries bound"},
    {"uninstall", uninstall, METH_NOARGS, "unbind every entry; the wrappers record no more"},
    {"drain", drain, METH_VARARGS,
     "drain(max_calls, fh_head, sink, kids) -> (FH lines, kept, not kept): "
     "the calls recorded since handed to the engine's sink, and the FH records of the "
     "files first seen"},
    {"counter_lines", counter_lines, METH_VARARGS,
     "counter_lines(offset_ns, head) -> bytes: each file's io_file record, head the line "
     "up to its args' first field"},
    {"stats", stats, METH_NOARGS, "calls seen, folded into aggregates, and dropped"},
    {"op_names", op_names, METH_NOARGS, "the calls' names, by op number"},
    {NULL, NULL, 0, NULL}};

static PyModuleDef_Slot slots[] = {
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_io",
                                       "dftrace's file-I/O interposer.", 0, methods, slots};

PyMODINIT_FUNC PyInit__io(void) { return PyModuleDef_Init(&moduledef); }
