/* records.c: kinds (kid -> the `,"name":..,"cat":..` piece of its lines), the native
 * buffer of records in chunks, and record(), the recording primitive Python calls
 * (the span styles in C record through span_close, span_lifecycle.h, which calls
 * emit_span, records.h). */
#include "records.h"
#include "encoder.h"
#include "kept_spans.h"
#include "spans.h"

/* Grown by copying into a larger array; an old array is never freed, because the
   writer may be reading it without the GIL. */
kind_t *dft_kinds = NULL;
Py_ssize_t dft_nkinds = 0, dft_max_kind_len = 0;
static Py_ssize_t capkinds = 0;

static PyObject *add_kind(PyObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "add_kind() takes bytes");
        return NULL;
    }
    if (dft_nkinds == capkinds) {
        Py_ssize_t cap = capkinds ? capkinds * 2 : 1024;
        kind_t *grown = PyMem_RawMalloc(sizeof(kind_t) * (size_t)cap);
        if (!grown)
            return PyErr_NoMemory();
        if (dft_nkinds)
            memcpy(grown, dft_kinds, sizeof(kind_t) * (size_t)dft_nkinds);
        dft_kinds = grown; /* the old array stays allocated (see above) */
        capkinds = cap;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    char *p = PyMem_RawMalloc((size_t)(n ? n : 1));
    if (!p)
        return PyErr_NoMemory();
    memcpy(p, PyBytes_AS_STRING(arg), (size_t)n);
    dft_kinds[dft_nkinds].piece = p;
    dft_kinds[dft_nkinds].n = n;
    if (n > dft_max_kind_len)
        dft_max_kind_len = n;
    dft_shm_add_kind(p, n);
    return PyLong_FromSsize_t(dft_nkinds++);
}

/* The chunk list. Producers append to the tail chunk holding the GIL; the list's
   links (head, tail, the spare list, full_recs) change under qlock, so that the
   writer's loop (write_loop) can take full chunks without the GIL. The records
   buffered are appended - taken: `appended` is the producers' (GIL), `taken` the
   takers' (under qlock, read atomically). */
chunk_t *dft_head = NULL, *dft_tail = NULL;
unsigned long long dft_appended = 0, dft_taken = 0;
Py_ssize_t dft_full_recs = 0; /* records in the chunks before the tail */

#ifdef HAVE_WRITE_LOOP
pthread_mutex_t dft_qlock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t dft_qcond = PTHREAD_COND_INITIALIZER;
int dft_loop_waiting = 0; /* write_loop() waits on qcond */
int dft_kicked = 0;       /* write_loop() must return to Python */

/* A fork() made from C (an extension, a library's worker pool) runs no Python
   at-fork hook, and the writer's thread may hold qlock at that moment (it takes it
   without the GIL): the child would wait for it forever at its first full chunk.
   So every fork waits for qlock (never held for long, and never by a thread
   waiting for the GIL) and the child gets a lock and a condition of its own, with
   the lists whole. */
static void qlock_before_fork(void) { QLOCK(); }
static void qlock_after_fork_parent(void) { QUNLOCK(); }
static void qlock_after_fork_child(void) {
    pthread_mutex_init(&dft_qlock, NULL);
    pthread_cond_init(&dft_qcond, NULL);
    dft_loop_waiting = 0;
    dft_kicked = 0;
}
#endif

void dft_qlock_fork_safe(void) {
#ifdef HAVE_WRITE_LOOP
    static int registered = 0;
    if (!registered && pthread_atfork(qlock_before_fork, qlock_after_fork_parent,
                                      qlock_after_fork_child) == 0)
        registered = 1;
#endif
}
Py_ssize_t dft_batch_size = 16384; /* wake the writer at this many */
Py_ssize_t dft_buf_limit = 1048576;
static int drop_full = 0;
long long dft_ndropped = 0;
/* Counted drops; with a shared-memory ring also in its header, so the drainer can
   write them when this process dies without finalizing. */
int dft_woken = 0;
unsigned long long dft_next_id_val = 1;
#if !defined(Py_GIL_DISABLED)
PyObject *dft_spare_ids[SPARE_IDS];
int dft_nspare_ids = 0;
#endif
unsigned long long dft_sticky_gen = 1;

void dft_free_chunks(chunk_t *c) {
    while (c) {
        chunk_t *nx = c->next;
        PyMem_RawFree(c->arena);
        PyMem_RawFree(c);
        c = nx;
    }
}

/* Drained chunks are kept for reuse (up to SPARE_MAX, 16 MiB): a new chunk's pages
   are then already mapped, and recording takes no page faults. Under qlock. */
#define SPARE_MAX 64
static chunk_t *spare = NULL;
static int nspare = 0;

int dft_spare_room(void) { return SPARE_MAX - nspare; }

void dft_recycle_chunks(chunk_t *c) {
    chunk_t *unused = NULL;
    QLOCK();
    while (c) {
        chunk_t *nx = c->next;
        if (nspare < SPARE_MAX) {
            c->next = spare;
            spare = c;
            nspare++;
        } else {
            c->next = unused;
            unused = c;
        }
        c = nx;
    }
    QUNLOCK();
    dft_free_chunks(unused);
}

/* A chunk from the spare list or a new one; called under qlock. */
chunk_t *dft_new_chunk(void) {
    chunk_t *c = spare;
    if (c) {
        spare = c->next;
        nspare--;
    } else {
        c = PyMem_RawMalloc(sizeof(chunk_t));
        if (!c)
            return NULL;
        c->acap = 0;
        c->arena = NULL;
    }
    c->next = NULL;
    c->n = 0;
    c->alen = 0;
    return c;
}


/* Called when the buffer is at its limit: in block mode wait for the writer (a
   KeyboardInterrupt/SystemExit raised while waiting propagates: -1), else count.
   Dropping with a ring, the slot being filled is sealed: the drainer frees only
   sealed slots, so one below the limit's size would stay held, and every record
   after it be dropped, for the rest of the run. Sealed, it is written and freed at
   the drainer's next write (woken now), and recording goes on. */
int dft_make_room(void) {
    if (drop_full) {
        if (!dft_shm || dft_shm_local || !dft_shm_cur || !dft_shm_cur_n)
            return 0;
        dft_shm_seal();
        dft_shm_sealed = 0;
        dft_woken = 0;
        return wake_writer(); /* -1: a signal's exception, the program's */
    }
    if (dft_calls.wait_room) {
        PyObject *r = PyObject_CallNoArgs(dft_calls.wait_room);
        if (!r) {
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                return -1;
            PyErr_Clear();
        }
        Py_XDECREF(r);
    }
    return 0;
}

/* record(kid, t0, t1, id, parent, level, tid, sticky=None, extra=None, count=-1, flags=0) */
static PyObject *record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 7 || nargs > 11) {
        PyErr_SetString(PyExc_TypeError, "record() takes 7 to 11 arguments");
        return NULL;
    }
    long kid = PyLong_AsLong(args[0]);
    long long t0 = PyLong_AsLongLong(args[1]), t1 = PyLong_AsLongLong(args[2]);
    Py_ssize_t lvl = PyLong_AsSsize_t(args[5]);
    long long count = nargs > 9 ? PyLong_AsLongLong(args[9]) : -1;
    long flags = nargs > 10 ? PyLong_AsLong(args[10]) : 0;
    if (PyErr_Occurred()) {
        PyErr_Clear();
        COUNT_DROP(1);
        Py_RETURN_NONE;
    }
    unsigned long long idv;
    if (get_ull(args[3], &idv) == 0) { /* a span opened in C, ended from Python */
        if (shm_open_end_any(idv))
            Py_RETURN_NONE; /* written at a finalize, incomplete */
    } else {
        PyErr_Clear();
    }
    if (emit_span((uint32_t)kid, t0, t1, args[3], args[4], lvl, args[6],
                  nargs > 7 ? args[7] : Py_None, nargs > 8 ? args[8] : Py_None, count,
                  (uint32_t)flags) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Detach up to maxn records (whole chunks; at least one chunk) from the front of the
   buffer. GIL held. Returns the first chunk (NULL: nothing buffered), the records
   taken and an upper bound of their encoded size. */
chunk_t *dft_detach(Py_ssize_t maxn, Py_ssize_t extra_per_rec, Py_ssize_t *ntaken,
                       size_t *upper) {
    QLOCK();
    chunk_t *first = dft_head, *last = NULL;
    Py_ssize_t n = 0;
    size_t up = 0;
    while (dft_head && (n == 0 || n + (Py_ssize_t)dft_head->n <= maxn)) {
        last = dft_head;
        n += dft_head->n;
        if (dft_head != dft_tail)
            dft_full_recs -= dft_head->n;
        up += (size_t)dft_head->n * (size_t)(REC_FIXED + dft_max_kind_len + extra_per_rec) + dft_head->alen;
        dft_head = dft_head->next;
    }
    *ntaken = n;
    *upper = up;
    if (last) {
        last->next = NULL;
        if (!dft_head)
            dft_tail = NULL;
        __atomic_store_n(&dft_taken, dft_taken + (unsigned long long)n, __ATOMIC_RELAXED);
    }
    QUNLOCK();
    if (!last)
        return NULL;
    dft_woken = 0;
    return first;
}


void dft_discard_buffered(void) {
    QLOCK();
    chunk_t *c = dft_head;
    dft_head = dft_tail = NULL;
    dft_full_recs = 0;
    __atomic_store_n(&dft_taken, dft_appended, __ATOMIC_RELAXED);
    QUNLOCK();
    dft_free_chunks(c);
}

/* Forget everything buffered. */
static PyObject *reset(PyObject *self, PyObject *unused) {
    dft_open_spans_forget();
    dft_discard_buffered();
    dft_woken = 0;
    dft_ndropped = 0;
    Py_RETURN_NONE;
}

/* In a forked child: the lock may have been copied held by a thread that does not
   exist here, and the lists half changed. Start afresh; the parent's chunks are
   left as they are (not freed: they may be inconsistent). */
static PyObject *after_fork(PyObject *self, PyObject *unused) {
    dft_open_spans_forget();
#ifdef HAVE_WRITE_LOOP
    pthread_mutex_init(&dft_qlock, NULL);
    pthread_cond_init(&dft_qcond, NULL);
    dft_loop_waiting = 0;
    dft_kicked = 0;
#endif
    spare = NULL;
    nspare = 0;
    dft_head = dft_tail = NULL;
    dft_full_recs = 0;
    __atomic_store_n(&dft_taken, dft_appended, __ATOMIC_RELAXED);
    dft_woken = 0;
    dft_stacks_forget();
    Py_RETURN_NONE;
}

static PyObject *set_limits(PyObject *self, PyObject *args) {
    Py_ssize_t b, l;
    int d;
    if (!PyArg_ParseTuple(args, "nnp", &b, &l, &d))
        return NULL;
    dft_batch_size = b;
    dft_buf_limit = l;
    drop_full = d;
    Py_RETURN_NONE;
}

/* Spans waiting to be written: in process memory, and in the ring's slots not yet
   freed. */
static PyObject *buffered(PyObject *self, PyObject *unused) {
    return PyLong_FromSsize_t(nbuf + (dft_shm ? dft_shm_held() : 0));
}

static PyObject *get_dropped(PyObject *self, PyObject *unused) { return PyLong_FromLongLong(dft_ndropped); }

static PyObject *set_dropped(PyObject *self, PyObject *arg) {
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    dft_ndropped = v;
    if (dft_shm)
        dft_shm->dropped = v;
    Py_RETURN_NONE;
}

static PyObject *new_id_py(PyObject *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(dft_next_id_val++);
}

static PyObject *bump_sticky_gen(PyObject *self, PyObject *unused) {
    dft_sticky_gen++;
    Py_RETURN_NONE;
}

static PyObject *get_sticky_gen(PyObject *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(dft_sticky_gen);
}

static PyObject *clock_ns(PyObject *self, PyObject *unused) { return PyLong_FromLongLong(now_ns()); }

/* allocations(fn): what the per-span paths are held to, no allocation per call,
   counted. Every allocator domain (raw, mem, object) is wrapped while fn runs; a
   call from the calling thread counts. The wrappers take no context of their own
   (their context is the wrapped one's, the wrapped functions are in statics), so a
   thread that reads the allocator while it is being swapped still calls a matching
   pair. */
static PyMemAllocatorEx alloc_wrapped[3];
static unsigned long alloc_thread;
static unsigned long long alloc_count;
static const PyMemAllocatorDomain ALLOC_DOMAINS[3] = {PYMEM_DOMAIN_RAW, PYMEM_DOMAIN_MEM,
                                                       PYMEM_DOMAIN_OBJ};
#define ALLOC_COUNT() do { if (PyThread_get_thread_ident() == alloc_thread) alloc_count++; } while (0)
#define ALLOC_WRAPPERS(i)                                                                    \
    static void *alloc_malloc##i(void *ctx, size_t n) {                                     \
        ALLOC_COUNT();                                                                      \
        return alloc_wrapped[i].malloc(alloc_wrapped[i].ctx, n);                            \
    }                                                                                       \
    static void *alloc_calloc##i(void *ctx, size_t k, size_t n) {                           \
        ALLOC_COUNT();                                                                      \
        return alloc_wrapped[i].calloc(alloc_wrapped[i].ctx, k, n);                         \
    }                                                                                       \
    static void *alloc_realloc##i(void *ctx, void *p, size_t n) {                           \
        ALLOC_COUNT();                                                                      \
        return alloc_wrapped[i].realloc(alloc_wrapped[i].ctx, p, n);                        \
    }                                                                                       \
    static void alloc_free##i(void *ctx, void *p) { alloc_wrapped[i].free(alloc_wrapped[i].ctx, p); }
ALLOC_WRAPPERS(0)
ALLOC_WRAPPERS(1)
ALLOC_WRAPPERS(2)

static PyObject *allocations(PyObject *self, PyObject *fn) {
    if (alloc_thread) {
        PyErr_SetString(PyExc_RuntimeError, "allocations() is already counting");
        return NULL;
    }
    PyMemAllocatorEx mine[3] = {
        {NULL, alloc_malloc0, alloc_calloc0, alloc_realloc0, alloc_free0},
        {NULL, alloc_malloc1, alloc_calloc1, alloc_realloc1, alloc_free1},
        {NULL, alloc_malloc2, alloc_calloc2, alloc_realloc2, alloc_free2}};
    for (int i = 0; i < 3; i++) {
        PyMem_GetAllocator(ALLOC_DOMAINS[i], &alloc_wrapped[i]);
        mine[i].ctx = alloc_wrapped[i].ctx;
    }
    alloc_count = 0;
    alloc_thread = PyThread_get_thread_ident();
    for (int i = 0; i < 3; i++)
        PyMem_SetAllocator(ALLOC_DOMAINS[i], &mine[i]);
    PyObject *r = PyObject_CallNoArgs(fn);
    unsigned long long n = alloc_count;
    for (int i = 0; i < 3; i++)
        PyMem_SetAllocator(ALLOC_DOMAINS[i], &alloc_wrapped[i]);
    alloc_thread = 0;
    if (!r)
        return NULL;
    return Py_BuildValue("(NK)", r, n);
}

/* The module's functions of this file (module.c adds them). */
PyMethodDef dft_records_methods[] = {
    {"allocations", allocations, METH_O,
     "allocations(fn) -> (fn(), n): n, the allocations this thread made while fn ran "
     "(every CPython allocator domain: raw, mem, object)."},
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL,
     "record(kid, t0, t1, id, parent, level, tid, sticky=None, extra=None, count=-1, flags=0)"},
    {"add_kind", add_kind, METH_O, "add_kind(piece) -> kid"},
    {"reset", reset, METH_NOARGS, "Forget every buffered record."},
    {"after_fork", after_fork, METH_NOARGS, "In a forked child: a fresh buffer and lock."},
    {"set_limits", set_limits, METH_VARARGS, "set_limits(batch_size, buffer_limit, drop_when_full)"},
    {"buffered", buffered, METH_NOARGS, "Records buffered now."},
    {"dropped", get_dropped, METH_NOARGS, "Records dropped and counted so far."},
    {"set_dropped", set_dropped, METH_O, "Set the dropped counter."},
    {"new_id", new_id_py, METH_NOARGS, "The next span id."},
    {"bump_sticky_gen", bump_sticky_gen, METH_NOARGS, "Sticky args changed: nodes refresh theirs on next use."},
    {"sticky_gen", get_sticky_gen, METH_NOARGS, "The generation of the sticky args in force."},
    {"clock_ns", clock_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns (the clock of time.perf_counter_ns)"},
    {NULL, NULL, 0, NULL}};
