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

#include "counters.h"
#include "../engine_c/digits.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int forget_pending = 0; /* set in a forked child: its counters start afresh */
static unsigned long long calls_seen = 0, calls_aggregated = 0, counter_cuts = 0;

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

/* -- lines of JSON made here: FH records (text.c) -- */


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
    io_counters_init();
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

/* drain(max_calls, fh_head, counters_head, offset_ns, sink, kids) -> (lines: bytes,
   kept, not kept) (the ring's drops and the calls seen: stats()): max_calls < 0: no
   cap; fh_head: an FH line up to its args' "name" value; counters_head, offset_ns:
   counter_lines()'s, for the io_file records of a full table of counters (written
   with the FH records of the files first seen); sink: _speedups.io_sink();
   kids[op]: the kind of each call's name. */
static PyObject *drain(PyObject *self, PyObject *args) {
    long long max_calls, off;
    const char *head, *chead;
    Py_ssize_t nhead, nchead;
    PyObject *capsule, *kids;
    if (!PyArg_ParseTuple(args, "Ly#y#LOO!", &max_calls, &head, &nhead, &chead, &nchead, &off, &capsule,
                          &PyTuple_Type, &kids))
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
        io_counters_forget();
        calls_seen = calls_aggregated = counter_cuts = 0;
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
        file_t *f = io_counters_file(r->fhash);
        if (!f && io_counters_full()) { /* its counters written, the table counts afresh */
            if (io_counters_lines(&fh, off, chead, (size_t)nchead) < 0)
                goto nomem;
            io_counters_forget();
            counter_cuts++;
            f = io_counters_file(r->fhash);
        }
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
        io_count(f, r);
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
    int bad = io_counters_lines(&t, off, head, (size_t)nhead) < 0;
    PyObject *out = bad ? PyErr_NoMemory() : PyBytes_FromStringAndSize(t.p ? t.p : "", (Py_ssize_t)t.n);
    free(t.p);
    return out;
}

static PyObject *stats(PyObject *self, PyObject *unused) {
    return Py_BuildValue("{s:K,s:K,s:K,s:K}", "calls", calls_seen, "aggregated_calls",
                         calls_aggregated, "counter_cuts", counter_cuts, "dropped",
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
     "drain(max_calls, fh_head, counters_head, offset_ns, sink, kids) -> (lines, kept, not kept): "
     "the calls recorded since handed to the engine's sink; the FH records of the files "
     "first seen, and the io_file records of a full table of counters"},
    {"counter_lines", counter_lines, METH_VARARGS,
     "counter_lines(offset_ns, head) -> bytes: each file's io_file record, head the line "
     "up to its args' first field"},
    {"stats", stats, METH_NOARGS,
     "calls seen, folded into aggregates and dropped; times the counters' table was full"},
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
