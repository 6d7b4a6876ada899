/* kept_spans.h: the spans `with` and start() keep open, in their stack's `open` map,
   and the ones start() opened, process-wide, in STATE.open_spans.
   Part of engine.h, included at its place there (after span_lifecycle.h). */
#ifndef DFTRACE_KEPT_SPANS_H
#define DFTRACE_KEPT_SPANS_H

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
/* A kept span as Python reads it (_speedups.OpenSpan; engine.OpenSpan is its
   pure-Python twin, with the same names): made from a map's entry when Python asks
   for one, and given back to a map by Python's open_span and restick_open. */
typedef struct {
    PyObject_HEAD
    span_t span;      /* its tid is NULL where Python made it (its stack's is read) */
    PyObject *opener;
    PyObject *extra;
} OpenSpanObject;
extern PyTypeObject dft_OpenSpanType;
#define IS_OPEN_SPAN(o) (Py_TYPE(o) == &dft_OpenSpanType)
#define AS_OPEN(o) ((OpenSpanObject *)(o))

typedef struct {
    span_t span;      /* its id's value (span.idv) is the map's key */
    PyObject *opener; /* the node, use or capturing scope whose with/start() opened it */
    PyObject *extra;  /* the opener's own args: an Extra or None */
} kept_t;

typedef struct {
    PyObject_HEAD
    kept_t *k;        /* n entries, ids ascending */
    Py_ssize_t n, cap;
} KeptSpansObject;

#define AS_KEPT(o) ((KeptSpansObject *)(o))

/* Put entry `k` (its references move in) in its place by id; -1 with an error. */
int dft_kept_put(KeptSpansObject *m, const kept_t *k);

/* Keep span `s` (its references move into the map) with its opener and the
   opener's args (borrowed; the map takes references): last, as the newest span of
   its stack. 0, or -1 with an error set and `s` left as it was. */
static inline int kept_push(PyObject *map, span_t *s, PyObject *opener, PyObject *extra) {
    KeptSpansObject *m = AS_KEPT(map);
    kept_t k = {*s, opener, extra};
    if (unlikely(m->n == m->cap || (m->n && m->k[m->n - 1].span.idv >= s->idv))) {
        if (dft_kept_put(m, &k) < 0)
            return -1;
    } else {
        m->k[m->n++] = k;
    }
    Py_INCREF(opener);
    Py_INCREF(extra);
    return 0;
}

/* The kept span on top of `stk` (a list), when `opener` opened it: a pointer into
   the map, valid until the map changes; else NULL. */
static inline kept_t *kept_on_top(PyObject *map, PyObject *stk, PyObject *opener) {
    KeptSpansObject *m = AS_KEPT(map);
    Py_ssize_t n = PyList_GET_SIZE(stk);
    if (m->n == 0 || n == 0)
        return NULL;
    kept_t *k = &m->k[m->n - 1];
    if (k->span.id != PyList_GET_ITEM(stk, n - 1) || k->opener != opener)
        return NULL;
    return k;
}

/* Take the last entry (kept_on_top's) out of the map, its references with it. */
static inline void kept_take_last(PyObject *map, kept_t *out) {
    KeptSpansObject *m = AS_KEPT(map);
    *out = m->k[--m->n];
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

typedef struct {
    PyObject_HEAD
    started_t *s;     /* n entries, ids ascending */
    Py_ssize_t n, cap;
} StartedSpansObject;

extern PyTypeObject dft_StartedSpansType;
#define IS_STARTED_MAP(o) (Py_TYPE(o) == &dft_StartedSpansType)
#define AS_STARTED(o) ((StartedSpansObject *)(o))

/* Add / remove in any place (kept_spans.c): 0 / 1 removed, 0 absent; -1 with an error. */
int dft_started_put(StartedSpansObject *m, unsigned long long idv, PyObject *id, PyObject *stk);
int dft_started_remove(StartedSpansObject *m, unsigned long long idv);

/* Span `id` (value idv) was started on `stk` (both borrowed): 0, or -1 with an error. */
static inline int started_add(PyObject *map, unsigned long long idv, PyObject *id, PyObject *stk) {
    StartedSpansObject *m = AS_STARTED(map);
    if (unlikely(m->n == m->cap || (m->n && m->s[m->n - 1].idv >= idv)))
        return dft_started_put(m, idv, id, stk);
    Py_INCREF(id);
    Py_INCREF(stk);
    m->s[m->n++] = (started_t){idv, id, stk};
    return 0;
}

/* Span idv is no longer started (its stop came): 1, or 0 when it was not. The caller
   holds its stack. */
static inline int started_remove(PyObject *map, unsigned long long idv) {
    StartedSpansObject *m = AS_STARTED(map);
    if (m->n && m->s[m->n - 1].idv == idv) {
        started_t e = m->s[--m->n];
        Py_DECREF(e.id);
        Py_DECREF(e.stk);
        return 1;
    }
    return dft_started_remove(m, idv);
}

#endif /* DFTRACE_KEPT_SPANS_H */
