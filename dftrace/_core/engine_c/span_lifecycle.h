/* span_lifecycle.h: a span's lifecycle, span_open / span_close, inline in every C
   span style (spans.c, traceable.c): it uses the records, the stack and the nodes. */
#ifndef DFTRACE_SPAN_LIFECYCLE_H
#define DFTRACE_SPAN_LIFECYCLE_H

#include "common.h"
#include "records.h"
#include "spans.h"
#include "traceable.h"

DFT_HIDDEN_BEGIN

/* ------------------------------------------------------------------------- */
/* A span's lifecycle: span_open / span_close, the only place it is written    */
/*
 * Every C span style opens and closes its spans with this pair: the decorator
 * (SpanWrapper), .iter()'s item and loop-body spans (SpanIter), with-enter/exit,
 * node-level start()/stop() and Span.stop(args=). Its Python twin is engine.py's
 * open_span / close_span. A span keeps no reference to its stack: the caller
 * holds the stack and hands it to both.
 */
typedef struct {
    PyObject *id;     /* its id, on the stack while it is open */
    unsigned long long idv; /* its value */
    PyObject *parent; /* the id below it when it opened (0: none) */
    PyObject *sticky; /* its node's sticky args when it opened: an Extra or None */
    PyObject *tid;    /* its stack's track (NULL: read from the stack at its close) */
    Py_ssize_t level; /* the stack's depth below it */
    long long t0;
    uint32_t kid;     /* its kind */
    uint32_t oslot;   /* its place in the ring's open-span table + 1 (0: none; shm_ring.h) */
} span_t;

/* The pair is compiled into each caller: a span pays no call for it. */
#define SPAN_INLINE ALWAYS_INLINE

#define SPAN_NOW 0 /* span_open's t0: read the clock, last */

/* Span `s` (id, parent, level, track and kind set), open now with `count` (-1:
   none), into the ring's open-span table, all but its t0 and id: the slot, or NULL
   (no ring, no room; s->oslot says which). */
SPAN_INLINE rec_t *span_keep_open(span_t *s, long long count) {
    unsigned long long pv, tv;
    s->oslot = 0;
    if (!dft_shm_open || !s->tid)
        return NULL;
    if (get_ull(s->parent, &pv) < 0 || get_ull(s->tid, &tv) < 0) {
        PyErr_Clear();
        return NULL;
    }
    /* no Python runs from here to the id's store (the caller reads the clock only):
       no other thread can take the slot meanwhile */
    rec_t *e = shm_open_slot(s->idv, &s->oslot);
    if (e) {
        rec_fill(e, s->kid, 0, 0, 0, pv, s->level, tv, F_INCOMPLETE, count);
        e->aoff = e->alen = 0;
    }
    return e;
}

/* Open span `s` of kind `kid` for `node` on `stk` (a non-empty list the caller
   holds): a new id pushed on stk, the id below it as its parent, the depth as its
   level, the node's sticky args now (a span `with` or start() keeps is then kept in
   its stack's map: kept_push, kept_spans.h). Then NVTX, its place in the ring's
   open-span table, then t0 (`t0`, or the clock when SPAN_NOW). 0, or -1 with
   nothing opened and no error set: the caller goes on untraced. */
SPAN_INLINE int span_open(span_t *s, PyObject *stk, PyObject *node, uint32_t kid, long long t0) {
    PyObject *sticky = node_sticky(node);
    if (!sticky) {
        PyErr_Clear();
        sticky = Py_None;
        Py_INCREF(sticky);
    }
    unsigned long long idv = dft_next_id_val;
    PyObject *id = new_id(), *tid = id ? stk_tid(stk) : NULL;
    if (!tid || PyList_Append(stk, id) < 0)
        goto fail;
    Py_ssize_t lvl = PyList_GET_SIZE(stk) - 1;
    PyObject *p = PyList_GET_ITEM(stk, lvl - 1);
    Py_INCREF(p);
    s->id = id;
    s->idv = idv;
    s->parent = p;
    s->sticky = sticky;
    s->tid = tid;
    s->level = lvl;
    s->kid = kid;
    NVTX_OPEN(kid, id, stk, 1);
    rec_t *e = span_keep_open(s, -1);
    s->t0 = t0 != SPAN_NOW ? t0 : now_ns();
    if (e) {
        e->t0 = s->t0;
        shm_open_publish(e, idv);
    }
    return 0;
fail:
    PyErr_Clear();
    Py_XDECREF(tid);
    Py_XDECREF(id);
    Py_DECREF(sticky);
    return -1;
}

/* Record span `s` (still holding its references) at t1; see span_close. */
SPAN_INLINE int span_record(span_t *s, PyObject *stk, long long t1, PyObject *x, PyObject *error,
                            long long count, uint32_t flags) {
    int rc = 0;
    PyObject *tid = s->tid, *own_tid = NULL, *tagged = NULL;
    if (unlikely(!tid))
        tid = own_tid = stk_tid(stk);
    if (error) {
        tagged = PyObject_CallFunctionObjArgs(dft_calls.with_error, x ? x : Py_None, error, NULL);
        if (!tagged && PyErr_ExceptionMatches(PyExc_RecursionError)) {
            /* a recursion that ran into the limit ends here too: with_error() gets
               the few frames it needs, so that the span still says how it ended */
            PyErr_Clear();
            Py_SetRecursionLimit(Py_GetRecursionLimit() + 64);
            tagged = PyObject_CallFunctionObjArgs(dft_calls.with_error, x ? x : Py_None, error, NULL);
            Py_SetRecursionLimit(Py_GetRecursionLimit() - 64);
        }
        if (tagged)
            x = tagged;
        else
            PyErr_Clear();
    }
    if (likely(tid != NULL)) {
        rc = emit_span(s->kid, s->t0, t1, s->id, s->parent, s->level, tid, s->sticky, x, count, flags);
    } else {
        PyErr_Clear();
        NVTX_CLOSE(s->id);
        COUNT_DROP(1);
    }
    Py_XDECREF(tagged);
    Py_XDECREF(own_tid);
    return rc;
}

static inline void span_release(span_t *s) {
    if (s->id) {
        release_id(s->id);
        s->id = NULL;
    }
    Py_CLEAR(s->parent);
    Py_CLEAR(s->sticky);
    Py_CLEAR(s->tid);
}

/* span_close's flags: F_INCOMPLETE (the record's flag), or this one. */
#define SPAN_UNRECORDED (1u << 16) /* it ended without a record (an iterator's end) */

/* Close span `s` at t1: pop it from `stk` (anything left above it is unwound), then
   record it on stk's track with args `x` (borrowed: an Extra, a dict or None;
   NULL: none), tagged `error: <type>` when `error` (an exception) is given, with
   `count` (-1: none) and `flags`. Its references are released. 0, or -1 with an
   exception that must reach the caller (a signal's, while waiting for room); call
   it with no exception set (span_close_raised: the one that is set is the error). */
SPAN_INLINE int span_close(span_t *s, PyObject *stk, long long t1, PyObject *x, PyObject *error,
                           long long count, uint32_t flags) {
    int rc = 0;
    if (shm_open_end(s->idv, s->oslot))
        flags |= SPAN_UNRECORDED; /* written at a finalize, incomplete */
    s->oslot = 0;
    if (stack_pop(stk, s->id, t1) < 0)
        PyErr_Clear();
    if (flags & SPAN_UNRECORDED)
        NVTX_CLOSE(s->id);
    else
        rc = span_record(s, stk, t1, x, error, count, flags);
    span_release(s);
    return rc;
}

/* span_close (no error, no flag), then a span of kind `kid` opens in its place at
   t1: its next sibling, with its parent, level, sticky args and track (.iter(): the
   loop body's span after its item's). -1 as span_close, with no span open. */
SPAN_INLINE int span_close_open_next(span_t *s, PyObject *stk, long long t1, PyObject *x,
                                     long long count, uint32_t kid) {
    int written = shm_open_end(s->idv, s->oslot); /* at a finalize, incomplete */
    s->oslot = 0;
    if (!written && span_record(s, stk, t1, x, NULL, count, 0) < 0) {
        if (stack_pop(stk, s->id, t1) < 0)
            PyErr_Clear();
        span_release(s);
        return -1;
    }
    unsigned long long idv = dft_next_id_val;
    PyObject *id = new_id();
    Py_ssize_t n = PyList_GET_SIZE(stk);
    if (id && n > 0 && PyList_GET_ITEM(stk, n - 1) == s->id) {
        PyList_SET_ITEM(stk, n - 1, id); /* the stack's reference to the old id goes */
        Py_INCREF(id);
        Py_DECREF(s->id);
    } else { /* not on top any more: unwound, then pushed */
        if (stack_pop(stk, s->id, t1) < 0 || !id || PyList_Append(stk, id) < 0) {
            PyErr_Clear();
            Py_XDECREF(id);
            span_release(s);
            return 0; /* recorded; no next span */
        }
    }
    release_id(s->id);
    s->id = id;
    s->idv = idv;
    s->kid = kid;
    s->t0 = t1;
    rec_t *e = span_keep_open(s, count);
    if (e) {
        e->t0 = t1;
        shm_open_publish(e, idv);
    }
    NVTX_OPEN(kid, id, stk, 1);
    return 0;
}

/* span_close for a span whose code raised: the exception set now is its error, and
   stays set for the caller to return (unless recording raised one of its own). */
SPAN_INLINE int span_close_raised(span_t *s, PyObject *stk, long long t1, PyObject *x,
                                    long long count) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyErr_NormalizeException(&et, &ev, &tb);
    int rc = span_close(s, stk, t1, x, ev ? ev : Py_None, count, 0);
    if (rc < 0) {
        Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
    } else {
        PyErr_Restore(et, ev, tb);
    }
    return rc;
}

DFT_HIDDEN_END
#endif /* DFTRACE_SPAN_LIFECYCLE_H */
