/* records.h: records.c's side, the records: kinds (kid -> name/cat piece), the
 * native buffer of chunks (or the shared-memory ring), ids, drops, and the
 * recording primitive emit_span -> native_append / shm_append, inline: every span
 * style compiles it into its own code, and a span costs no call across files. */
#ifndef DFTRACE_RECORDS_H
#define DFTRACE_RECORDS_H

#include "common.h"
#include "module.h"
#include "shm_ring.h"
#include "spans.h"

DFT_HIDDEN_BEGIN

/* ------------------------------------------------------------------------- */
/* kinds: kid -> the `,"name":..,"cat":..` piece of its lines (kind_t)         */

/* Grown by copying into a larger array; an old array is never freed, because the
   writer may be reading it without the GIL. */
extern kind_t *dft_kinds;
extern Py_ssize_t dft_nkinds, dft_max_kind_len;

/* ------------------------------------------------------------------------- */
/* the native buffer                                                          */

/* The chunk list. Producers append to the tail chunk holding the GIL; the list's
   links (head, tail, the spare list, full_recs) change under qlock, so that the
   writer's loop (write_loop) can take full chunks without the GIL. The records
   buffered are appended - taken: `appended` is the producers' (GIL), `taken` the
   takers' (under qlock, read atomically). */
extern chunk_t *dft_head, *dft_tail;
extern unsigned long long dft_appended, dft_taken;
extern Py_ssize_t dft_full_recs; /* records in the chunks before the tail */
#define nbuf ((Py_ssize_t)(dft_appended - __atomic_load_n(&dft_taken, __ATOMIC_RELAXED)))

#ifdef HAVE_WRITE_LOOP
extern pthread_mutex_t dft_qlock;
extern pthread_cond_t dft_qcond;
extern int dft_loop_waiting; /* write_loop() waits on qcond */
extern int dft_kicked;       /* write_loop() must return to Python */
#define QLOCK() pthread_mutex_lock(&dft_qlock)
#define QUNLOCK() pthread_mutex_unlock(&dft_qlock)
#else
#define QLOCK() ((void)0)
#define QUNLOCK() ((void)0)
#endif
extern Py_ssize_t dft_batch_size; /* wake the writer at this many */
extern Py_ssize_t dft_buf_limit;
extern long long dft_ndropped;
/* Counted drops; with a shared-memory ring also in its header, so the drainer can
   write them when this process dies without finalizing. */
#define COUNT_DROP(k) do { dft_ndropped += (k); if (dft_shm) dft_shm->dropped = dft_ndropped; } while (0)
extern int dft_woken;
extern unsigned long long dft_next_id_val;
extern unsigned long long dft_sticky_gen;

void dft_free_chunks(chunk_t *c);
void dft_recycle_chunks(chunk_t *c);
/* Keeps qlock usable in the child of a fork() made from C (pthread_atfork, once). */
void dft_qlock_fork_safe(void);
chunk_t *dft_new_chunk(void);
/* Forget the records the process buffer holds (they are never written). */
void dft_discard_buffered(void);
chunk_t *dft_detach(Py_ssize_t maxn, Py_ssize_t extra_per_rec, Py_ssize_t *ntaken, size_t *upper);
int dft_make_room(void);
/* How many chunks the spare list can take back now. */
int dft_spare_room(void);

/* Span ids without an allocation per span. An id is a Python int (stacks are
   lists that Python reads too), made by new_id() and given back by release_id()
   when its span ends. An id no one else holds then (refcount 1: only the span's
   own reference; the stack and the maps let go first) is nobody's to read any
   more: up to SPARE_IDS of them are kept and new_id() sets the next value into
   one in place, where it fits an int's single digit (ids < 2^30; small ints are
   shared and never kept). Anything else is an ordinary int. Not with the GIL
   disabled. */
#if !defined(Py_GIL_DISABLED)
#define SPARE_IDS 8
extern PyObject *dft_spare_ids[SPARE_IDS];
extern int dft_nspare_ids;

static inline PyObject *new_id(void) {
    unsigned long long v = dft_next_id_val++;
    if (dft_nspare_ids && v > 256 && v < (1ULL << PyLong_SHIFT)) {
        PyObject *o = dft_spare_ids[--dft_nspare_ids];
#if PY_VERSION_HEX >= 0x030C0000
        ((PyLongObject *)o)->long_value.ob_digit[0] = (digit)v;
#else
        ((PyLongObject *)o)->ob_digit[0] = (digit)v;
#endif
        return o;
    }
    return PyLong_FromUnsignedLongLong(v);
}

/* Let id go (the caller's reference): kept for new_id() when no one else holds it. */
static inline void release_id(PyObject *id) {
    long long v; /* a spare id is a positive int of one digit, past the shared ones */
    if (Py_REFCNT(id) == 1 && dft_nspare_ids < SPARE_IDS && small_int(id, &v) && v > 256)
        dft_spare_ids[dft_nspare_ids++] = id;
    else
        Py_DECREF(id);
}
#else
static inline PyObject *new_id(void) { return PyLong_FromUnsignedLongLong(dft_next_id_val++); }
static inline void release_id(PyObject *id) { Py_DECREF(id); }
#endif

/* Append one record; -1 when memory ran out (the caller counts it as dropped). */
ALWAYS_INLINE int native_append(uint32_t kid, long long t0, long long t1, unsigned long long id,
                         unsigned long long p, Py_ssize_t lvl, unsigned long long tid,
                         uint32_t flags, long long count, const char *a, Py_ssize_t na,
                         const char *b, Py_ssize_t nb) {
    if (dft_shm && !dft_shm_local)
        return shm_append(kid, t0, t1, id, p, lvl, tid, flags, count, a, na, b, nb);
    chunk_t *c = dft_tail;
    if (!c || c->n == CHUNK_RECS) {
        QLOCK();
        c = dft_new_chunk();
        if (c) {
            if (dft_tail) {
                dft_tail->next = c;
                dft_full_recs += dft_tail->n;
            } else {
                dft_head = c;
            }
            dft_tail = c;
#ifdef HAVE_WRITE_LOOP
            if (dft_loop_waiting && dft_full_recs >= dft_batch_size)
                pthread_cond_signal(&dft_qcond);
#endif
        }
        QUNLOCK();
        if (!c)
            return -1;
    }
    rec_t *r = &c->recs[c->n];
    size_t need = (size_t)(na + nb);
    r->aoff = 0;
    r->alen = 0;
    if (need) {
        if (c->alen + need > c->acap) {
            size_t cap = c->acap ? c->acap * 2 : 16384;
            while (cap < c->alen + need)
                cap *= 2;
            if (cap > 0xFFFFFFFFu)
                return -1;
            char *ar = PyMem_RawRealloc(c->arena, cap);
            if (!ar)
                return -1;
            c->arena = ar;
            c->acap = cap;
        }
        put_args(c->arena + c->alen, a, na, b, nb);
        r->aoff = (uint32_t)c->alen;
        r->alen = (uint32_t)need;
        c->alen += need;
    }
    rec_fill(r, kid, t0, t1, id, p, lvl, tid, flags, count);
    c->n++;
    dft_appended++;
    return 0;
}

/* buffer_limit spans wait: in process memory, or in the ring (see shm_held). */
#define AT_LIMIT() (dft_shm && !dft_shm_local ? dft_shm_at_limit() : nbuf >= dft_buf_limit)
/* `n` more records stay under buffer_limit for certain (AT_LIMIT need not be asked
   for each): the ring's estimate counts high, never low. */
#define ROOM_FOR(n) ((dft_shm && !dft_shm_local ? dft_shm_est : nbuf) + (Py_ssize_t)(n) < dft_buf_limit)

/* A batch is ready: wake the writer once per batch, and again every 4096 records
   while it has not drained (its wake() makes a producer wait when the writer has
   fallen a flush interval behind). Returns -1 with the exception set where a signal's
   handler raised one while wake() ran Python (Ctrl-C's KeyboardInterrupt): it must
   reach the program, as it would have untraced; any other failure is swallowed. */
static inline int wake_writer(void) {
    if (!dft_calls.wake || (dft_woken && (nbuf & 0xFFF)))
        return 0;
    dft_woken = 1;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *r = PyObject_CallNoArgs(dft_calls.wake);
    if (!r && !PyErr_ExceptionMatches(PyExc_Exception)) {
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(tb);
        return -1;
    }
    Py_XDECREF(r);
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
    return 0;
}

/* The fragment bytes of an Extra (or None): a borrowed pointer into the
   Extra's bytes, valid while the caller holds it. */
static inline int extra_piece(PyObject *x, const char **s, Py_ssize_t *n) {
    *s = NULL;
    *n = 0;
    if (x == NULL || x == Py_None)
        return 0;
    PyObject *f = slot_get(x, &dft_slot_frag);
    if (!f)
        return -1;
    if (!PyBytes_Check(f)) {
        Py_DECREF(f);
        PyErr_SetString(PyExc_TypeError, "Extra.frag must be bytes");
        return -1;
    }
    *s = PyBytes_AS_STRING(f);
    *n = PyBytes_GET_SIZE(f);
    Py_DECREF(f); /* the Extra keeps it alive */
    return 0;
}

/* The key mask of an Extra (read only where two fragments meet). */
static inline int extra_mask(PyObject *x, unsigned long long *mask) {
    PyObject *m = slot_get(x, &dft_slot_mask);
    if (!m)
        return -1;
    *mask = PyLong_AsUnsignedLongLongMask(m);
    Py_DECREF(m);
    if (*mask == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    return 0;
}

static inline int get_ull(PyObject *o, unsigned long long *out) {
    long long c; /* ids, parents and tids are small ints: read in place */
    if (small_int(o, &c) && c >= 0) {
        *out = (unsigned long long)c;
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}


/* The recording primitive. Returns 0 (recorded, or dropped and counted) or -1 with
   an exception that must reach the caller (a signal's exception during back-pressure).
   Any other failure is swallowed and counted: recording never breaks the program. */
ALWAYS_INLINE int emit_span(uint32_t kid, long long t0, long long t1, PyObject *id, PyObject *p,
                     Py_ssize_t lvl, PyObject *tid, PyObject *sticky, PyObject *x,
                     long long count, uint32_t flags) {
    NVTX_CLOSE(id);
    PyObject *et = NULL, *ev = NULL, *tb = NULL;
    if (unlikely(PyErr_Occurred() != NULL))
        PyErr_Fetch(&et, &ev, &tb); /* an exception the span is closing over stays as it is */
    int rc = 0;
    PyObject *own = NULL, *merged = NULL;
    if (AT_LIMIT()) {
        if (dft_make_room() < 0) {
            COUNT_DROP(1);
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
            return -1;
        }
        if (AT_LIMIT()) {
            COUNT_DROP(1);
            goto done;
        }
    }
    const char *a, *b;
    Py_ssize_t na, nb;
    unsigned long long ma = 0, mb = 0, iv, pv, tv;
    if (x != NULL && x != Py_None && Py_TYPE(x) != (PyTypeObject *)dft_calls.extra_type) {
        own = PyObject_CallOneArg(dft_calls.to_extra, x);
        if (!own)
            goto fail;
        x = own;
    }
    if (extra_piece(sticky, &a, &na) < 0 || extra_piece(x, &b, &nb) < 0)
        goto fail;
    if (na && nb && (extra_mask(sticky, &ma) < 0 || extra_mask(x, &mb) < 0))
        goto fail;
    if (ma & mb) {
        /* maybe a key in both: the span's own args win; let Python merge them */
        merged = PyObject_CallFunctionObjArgs(dft_calls.merge, sticky, x, NULL);
        if (!merged || extra_piece(merged, &b, &nb) < 0)
            goto fail;
        a = NULL;
        na = 0;
    }
    if (get_ull(id, &iv) < 0 || get_ull(p, &pv) < 0 || get_ull(tid, &tv) < 0)
        goto fail;
    int ar = native_append(kid, t0, t1, iv, pv, lvl, tv, flags, count, a, na, b, nb);
    if (ar == -2) { /* the shared ring is full: as at the buffer limit */
        if (dft_make_room() < 0) {
            COUNT_DROP(1);
            Py_XDECREF(own); Py_XDECREF(merged);
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
            return -1;
        }
        ar = native_append(kid, t0, t1, iv, pv, lvl, tv, flags, count, a, na, b, nb);
    }
    if (ar < 0) {
        COUNT_DROP(1);
        goto done;
    }
    if (dft_shm_sealed) { /* a slot of the ring is full: tell the drainer */
        dft_shm_sealed = 0;
        dft_woken = 0;
        if (wake_writer() < 0)
            goto signalled;
    } else if (nbuf >= dft_batch_size && wake_writer() < 0) {
        goto signalled;
    }
    goto done;
fail:
    COUNT_DROP(1);
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception))
        goto signalled; /* a signal's exception raised in Python the span called: the program's */
    PyErr_Clear();
done:
    Py_XDECREF(own);
    Py_XDECREF(merged);
    if (et || PyErr_Occurred())
        PyErr_Restore(et, ev, tb);
    return rc;
signalled:
    Py_XDECREF(own);
    Py_XDECREF(merged);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    return -1;
}

/* The module's functions of records.c (record, add_kind, reset, ...). */
extern PyMethodDef dft_records_methods[];

DFT_HIDDEN_END
#endif /* DFTRACE_RECORDS_H */
