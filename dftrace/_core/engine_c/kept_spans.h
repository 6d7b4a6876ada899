/* kept_spans.h: kept_spans.c's side, the spans `with` and start() keep open, in their
   stack's `open` map, and the ones start() opened, process-wide, in STATE.open_spans
   (push, find on top, take; add, remove: inline, on the hot path). */
#ifndef DFTRACE_KEPT_SPANS_H
#define DFTRACE_KEPT_SPANS_H

#include "common.h"
#include "module.h"
#include "span_lifecycle.h"

DFT_HIDDEN_BEGIN

/* ------------------------------------------------------------------------- */
/* Kept spans: the stack's `open` map, in C                                    */
/*
 * A span opened by `with` or start() waits for its end in its stack's `open` map:
 * with the C engine a KeptSpans (kept_spans.c), without it a dict; both map the
 * span's id to its OpenSpan. A KeptSpans holds its spans themselves (kept_t, no
 * object each) in one array, in the order they opened, which is their ids' order
 * and, for the ones still on the stack, the stack's order: the span a `with` block
 * or stop() ends is most often the last one, on top of its stack, found and taken
 * out here without a lookup. Python's paths (close_kept, cm_exit, _find_open,
 * close_all_open, the signal path, restick_open, capture scopes) read it as the
 * mapping it also is (get, pop, in, items, [i] = OpenSpan): an OpenSpan is made
 * for them from the entry, so a span opened by either engine ends in either.
 */
typedef struct {
    span_t span;      /* its id's value (span.idv) is the map's key */
    PyObject *opener; /* the node, use or capturing scope whose with/start() opened it */
    PyObject *extra;  /* the opener's own args: an Extra or None */
} kept_t;

/* A kept span as Python reads it (_speedups.OpenSpan; engine.OpenSpan is its
   pure-Python twin, with the same names): made from a map's entry when Python asks
   for one, and given back to a map by Python's open_span and restick_open. Its
   span's tid is NULL where Python made it (its stack's is read). */
typedef struct {
    PyObject_HEAD
    kept_t k;
} OpenSpanObject;
extern PyTypeObject dft_OpenSpanType;
#define IS_OPEN_SPAN(o) (Py_TYPE(o) == &dft_OpenSpanType)
#define AS_OPEN(o) ((OpenSpanObject *)(o))

/* A KeptSpans or a StartedSpans (below): the two maps keep their entries alike, in
   one array, ids ascending. */
typedef struct {
    PyObject_HEAD
    void *e;          /* n entries: kept_t in a KeptSpans, started_t in a StartedSpans */
    Py_ssize_t n, cap;
} IdMapObject;

#define AS_MAP(o) ((IdMapObject *)(o))
#define KEPT_OF(o) ((kept_t *)AS_MAP(o)->e)
extern PyTypeObject dft_KeptSpansType; /* a stack's `open` map */
#define IS_KEPT_MAP(o) (Py_TYPE(o) == &dft_KeptSpansType)

/* OpenSpan, KeptSpans and StartedSpans ready (PyType_Ready): 0, or -1 with an error. */
int dft_kept_spans_ready(void);

/* The last entry of a KeptSpans (one there is). */
static inline kept_t *kept_last(PyObject *map) { return &KEPT_OF(map)[AS_MAP(map)->n - 1]; }

/* Entries in their place by id (kept_spans.c), from any place: `e` (a kept_t or a
   started_t; its references move in) replaces the entry of its id, or is inserted.
   0, or -1 with an error and `e` not taken. */
int dft_map_put(IdMapObject *m, const void *e);

/* Keep span `s` (its references move into the map) with its opener and the
   opener's args (borrowed; the map takes references): last, as the newest span of
   its stack. 0, or -1 with an error set and `s` left as it was. */
static inline int kept_push(PyObject *map, span_t *s, PyObject *opener, PyObject *extra) {
    IdMapObject *m = AS_MAP(map);
    kept_t k = {*s, opener, extra};
    if (unlikely(m->n == m->cap || (m->n && KEPT_OF(m)[m->n - 1].span.idv >= s->idv))) {
        if (dft_map_put(m, &k) < 0)
            return -1;
    } else {
        KEPT_OF(m)[m->n++] = k;
    }
    Py_INCREF(opener);
    Py_INCREF(extra);
    return 0;
}

/* The kept span on top of `stk` (a list), when `opener` opened it: a pointer into
   the map, valid until the map changes; else NULL. */
static inline kept_t *kept_on_top(PyObject *map, PyObject *stk, PyObject *opener) {
    IdMapObject *m = AS_MAP(map);
    Py_ssize_t n = PyList_GET_SIZE(stk);
    if (m->n == 0 || n == 0)
        return NULL;
    kept_t *k = &KEPT_OF(m)[m->n - 1];
    if (k->span.id != PyList_GET_ITEM(stk, n - 1) || k->opener != opener)
        return NULL;
    return k;
}

/* Take the last entry (kept_on_top's) out of the map, its references with it. */
static inline void kept_take_last(PyObject *map, kept_t *out) {
    IdMapObject *m = AS_MAP(map);
    *out = KEPT_OF(m)[--m->n];
}

/* Close kept span `k` (taken out of its map) at t1 on `stk` with args x (NULL: the
   opener's own) and `error` (NULL: none); its references go. As span_close. */
static inline int kept_close(kept_t *k, PyObject *stk, long long t1, PyObject *x, PyObject *error) {
    int rc = span_close(&k->span, stk, t1, x ? x : k->extra, error, -1, 0);
    Py_DECREF(k->opener);
    Py_DECREF(k->extra);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* Started spans: STATE.open_spans, in C                                       */
/*
 * The spans start() opened and no stop() ended yet, process-wide: STATE.open_spans
 * maps each one's id to its stack (max_open_spans bounds how many; finalize ends
 * those left). With the C engine a StartedSpans (kept_spans.c): (id, stack) pairs in
 * one array, ids ascending, so a start() appends and its stop() most often takes the
 * last; Python's paths read it as the mapping it also is (len, in, get, pop, [i] =
 * stack, iteration in id order). Without the C engine, a dict.
 */
typedef struct {
    unsigned long long idv;
    PyObject *id, *stk;
} started_t;

extern PyTypeObject dft_StartedSpansType;
#define IS_STARTED_MAP(o) (Py_TYPE(o) == &dft_StartedSpansType)
#define STARTED_OF(o) ((started_t *)AS_MAP(o)->e)

/* Remove the entry of idv from any place (kept_spans.c): 1 removed, 0 absent. */
int dft_map_remove(IdMapObject *m, unsigned long long idv);

/* Span `id` (value idv) was started on `stk` (both borrowed): 0, or -1 with an error. */
static inline int started_add(PyObject *map, unsigned long long idv, PyObject *id, PyObject *stk) {
    IdMapObject *m = AS_MAP(map);
    started_t e = {idv, id, stk};
    Py_INCREF(id);
    Py_INCREF(stk);
    if (unlikely(m->n == m->cap || (m->n && STARTED_OF(m)[m->n - 1].idv >= idv))) {
        if (dft_map_put(m, &e) < 0) {
            Py_DECREF(id);
            Py_DECREF(stk);
            return -1;
        }
    } else {
        STARTED_OF(m)[m->n++] = e;
    }
    return 0;
}

/* Span idv is no longer started (its stop came): 1, or 0 when it was not. The caller
   holds its stack. */
static inline int started_remove(PyObject *map, unsigned long long idv) {
    IdMapObject *m = AS_MAP(map);
    if (m->n && STARTED_OF(m)[m->n - 1].idv == idv) {
        started_t e = STARTED_OF(m)[--m->n];
        Py_DECREF(e.id);
        Py_DECREF(e.stk);
        return 1;
    }
    return dft_map_remove(m, idv);
}

/* STATE.open_spans (a StartedSpans), as last read: STATE replaces it only where it resets
   (reset(), after a fork), and both then call the engine's reset()/after_fork(),
   which forget it (dft_open_spans_forget). */
extern PyObject *dft_open_spans_cache;
static inline PyObject *open_spans(void) {
    PyObject *d = dft_open_spans_cache;
    if (!d) {
        d = dft_hooks.state ? PyObject_GetAttr(dft_hooks.state, dft_str_open_spans) : NULL;
        if (!d || !IS_STARTED_MAP(d))
            return d;
        dft_open_spans_cache = d; /* the cache's reference */
    }
    Py_INCREF(d);
    return d;
}
void dft_open_spans_forget(void);

DFT_HIDDEN_END
#endif /* DFTRACE_KEPT_SPANS_H */
