/* traceable.h: traceable.c's side, nodes and uses: the fields the hot paths read in
 * the object itself (TraceableObject), whether one records now, its sticky args;
 * TraceableBase (with, start/stop, update, node(args=)) and SpanBase (Span.stop). */
#ifndef DFTRACE_TRACEABLE_H
#define DFTRACE_TRACEABLE_H

#include "common.h"
#include "module.h"
#include "records.h"

DFT_HIDDEN_BEGIN

/* ------------------------------------------------------------------------- */
/* nodes and uses: the fields the hot paths read, in the object itself         */

/* A node's or use's __enter__ / __exit__, bound without an allocation: each
   traceable holds the two in its own memory, and the descriptors on TraceableBase
   hand them out (traceable.c). Unreferenced, a hook's refcount is 0; taken, it
   holds a reference to its owner, dropped when the last holder lets it go (its
   tp_dealloc frees nothing). The `with` statement looks both up on every entry:
   this saves it two bound-method objects per block. */
#if !defined(Py_GIL_DISABLED) && !defined(Py_TRACE_REFS)
#define DFT_INLINE_HOOKS 1
#endif
typedef struct {
    PyObject_HEAD
    PyObject *owner;  /* the traceable it belongs to (a reference while taken) */
    vectorcallfunc vectorcall;
} hook_t;

#define PEND_MAX 4

typedef struct {
    PyObject_HEAD
    PyObject *node;   /* _node: the tree node naming the events (itself for a node) */
    PyObject *extra;  /* _extra: the use's own args (Extra or None) */
    PyObject *forced; /* _forced: a use's enable= (None: follows its node) */
    PyObject *on;     /* _on: a node records now (True/False) */
    PyObject *sticky; /* _sticky: its sticky args (Extra or None) as of _sgen */
    unsigned long long sgen;
    unsigned int kid, ikid, bkid; /* kind ids of <name>, <name>.iter, <name>.block */
    PyObject *raw;    /* a use's args not encoded yet (made while its node was off) */
    PyObject *parent; /* _parent: the node above (None for a root) */
    PyObject *own;    /* _own: a node's own sticky args (update()), Extra or None */
    PyObject *pending; /* _pending: sticky args given while nothing recorded (dict) */
    /* The last update(k=v, ...) made while nothing recorded, not yet in `pending`:
       its keyword names (the call site's own tuple) and values. The next call from
       the same site replaces the values; anything that reads `pending` first moves
       them there (pending_flush). */
    PyObject *pend_names;
    PyObject *pend_vals[PEND_MAX];
    hook_t enter_hook, exit_hook; /* bound __enter__ / __exit__ (see hook_t) */
    vectorcallfunc vectorcall; /* node(...) without a keyword dict */
} TraceableObject;

extern PyTypeObject dft_TraceableBaseType;

#define AS_T(o) ((TraceableObject *)(o))
int dft_pending_flush(TraceableObject *t); /* traceable.c; -1 with an error */
PyObject *dft_traceable_call(PyObject *self, PyObject *args, PyObject *kwargs); /* its tp_call */
/* A node or use: one comparison for the tree's classes (only TraceableBase and its
   subclasses have its tp_call), a walk of the MRO for one with a __call__ of its own. */
static inline int IS_T(PyObject *o) {
    return Py_TYPE(o)->tp_call == dft_traceable_call || PyObject_TypeCheck(o, &dft_TraceableBaseType);
}

/* Nothing was ever given an id in this process: no span is open anywhere, so an
   __exit__ or stop() has nothing to close (tracing never started). */
#define NOTHING_OPENED_EVER() (dft_next_id_val == 1)

/* Whether `o` (a node, a use, or the GATE) records now; -1 with an error. */
static inline int is_on(PyObject *o) {
    if (o == dft_gate && dft_slot_gate_on.off >= 0 && Py_TYPE(o) == dft_slot_gate_on.type) {
        PyObject *v = SLOT_REF(o, dft_slot_gate_on);
        if (v == Py_True || v == Py_False)
            return v == Py_True;
    }
    if (IS_T(o)) {
        TraceableObject *t = AS_T(o);
        if (t->on)
            return t->on == Py_True;
        if (t->forced == NULL || t->forced == Py_None) {
            if (t->node && t->node != o && IS_T(t->node) && AS_T(t->node)->on)
                return AS_T(t->node)->on == Py_True;
        } else if (t->forced == Py_False) {
            return 0;
        } else if (dft_gate) {
            return is_on(dft_gate);
        }
    }
    PyObject *on = PyObject_GetAttr(o, dft_str_on);
    if (!on)
        return -1;
    int r = PyObject_IsTrue(on);
    Py_DECREF(on);
    return r;
}

/* The sticky args of a node now: its parent's, then its own (new reference: an
   Extra or None). Refreshed once per update() generation; where no node of the
   chain has args of its own beyond one, no object is made at all. */
static inline PyObject *sticky_chain(TraceableObject *t) {
    if (t->sgen == dft_sticky_gen) {
        PyObject *st = t->sticky ? t->sticky : Py_None;
        Py_INCREF(st);
        return st;
    }
    if (t->pend_names && dft_pending_flush(t) < 0)
        return NULL;
    if (t->pending && PyDict_Check(t->pending) && PyDict_GET_SIZE(t->pending))
        return PyObject_CallOneArg(dft_calls.sticky_of, (PyObject *)t); /* encodes them first */
    PyObject *base;
    if (t->parent && t->parent != Py_None && IS_T(t->parent)) {
        base = sticky_chain(AS_T(t->parent));
        if (!base)
            return NULL;
    } else {
        base = Py_None;
        Py_INCREF(base);
    }
    PyObject *own = t->own, *st;
    if (own == NULL || own == Py_None) {
        st = base;
    } else if (base == Py_None) {
        Py_DECREF(base);
        st = own;
        Py_INCREF(st);
    } else {
        st = PyObject_CallFunctionObjArgs(dft_calls.merge, base, own, NULL);
        Py_DECREF(base);
        if (!st)
            return NULL;
    }
    Py_INCREF(st);
    Py_XSETREF(t->sticky, st);
    t->sgen = dft_sticky_gen;
    return st;
}

/* The sticky args of `node` now (new reference: an Extra or None). */
static inline PyObject *node_sticky(PyObject *node) {
    if (IS_T(node))
        return sticky_chain(AS_T(node));
    PyObject *g = PyObject_GetAttr(node, dft_str_sgen);
    if (!g)
        return NULL;
    unsigned long long gv = PyLong_AsUnsignedLongLongMask(g);
    Py_DECREF(g);
    if (gv == dft_sticky_gen)
        return PyObject_GetAttr(node, dft_str_sticky);
    return PyObject_CallOneArg(dft_calls.sticky_of, node);
}

/* ------------------------------------------------------------------------- */
/* TraceableBase and SpanBase                                                 */

extern PyTypeObject dft_SpanBaseType;
int dft_traceable_ready(void); /* TraceableBase and its __enter__/__exit__ hooks */
int dft_traceable_subclasses(void); /* at register(): the subclasses defined so far */

DFT_HIDDEN_END
#endif /* DFTRACE_TRACEABLE_H */
