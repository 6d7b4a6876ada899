/* module.h: module.c's side, what register() gave the engine and what it reads:
 * the Python objects it calls back into (dft_calls, dft_hooks), the attribute names
 * it reads (interned once), and the slots of dftrace's small classes it reads and
 * sets in place. */
#ifndef DFTRACE_MODULE_H
#define DFTRACE_MODULE_H

#include "common.h"

DFT_HIDDEN_BEGIN

/* ------------------------------------------------------------------------- */
/* the Python side the engine calls back into: what register() was given      */

typedef struct {
    PyObject *local;      /* threading.local with .stk / .thread_stk */
    PyObject *resolve;    /* callable() -> Stack */
    PyObject *wait_room;  /* callable(): wait until the writer made room (may raise) */
    PyObject *wake;       /* callable(): a batch is ready */
    PyObject *unwind;     /* callable(stk, i) */
    PyObject *with_error; /* callable(extra, exc) -> Extra */
    PyObject *merge;      /* callable(sticky, extra) -> Extra (a key in both) */
    PyObject *to_extra;   /* callable(obj) -> Extra (args given as a dict) */
    PyObject *sticky_of;  /* callable(node) -> Extra or None (refresh after update()) */
    PyObject *extra_type; /* the Extra class */
    PyObject *slow_exit;  /* the Python __exit__ for every case but the common one */
    PyObject *iter_end;   /* callable(node, t0, t1, extra, count): an .iter() pass's end */
    PyObject *task_stack; /* TASK_STACK: the context variable holding an asyncio task's stack */
} recstate_t;

extern recstate_t dft_calls;
extern PyObject *dft_update_slow; /* Node._update_py */
extern PyObject *dft_gate; /* dft_hooks.gate (borrowed): what a use forced on follows */

/* The attribute names the engine reads, interned once (module.c; each one is listed
   in ENGINE_READS under the classes it is read from). */
extern PyObject *dft_str_thread_stk, *dft_str_stk, *dft_str_on, *dft_str_kid, *dft_str_ikid,
    *dft_str_bkid, *dft_str_tid, *dft_str_open, *dft_str_extra, *dft_str_node, *dft_str_frag,
    *dft_str_mask, *dft_str_sgen, *dft_str_sticky, *dft_str__args, *dft_str__obj, *dft_str__stk, *dft_str__id,
    *dft_str_open_spans, *dft_str_max_open_spans, *dft_str_args_kw, *dft_str_args_attr,
    *dft_str_asyncio, *dft_str_owner;

/* The __slots__ of dftrace's own small Python classes (Extra, Span), read and set
   in place: each slot's offset is found once from its member descriptor. For an
   instance of another class (a subclass), or where none was found (off -1),
   attribute access is used. */
typedef struct {
    PyTypeObject *type; /* borrowed: R or H holds it */
    PyObject *name;
    Py_ssize_t off;
} slot_t;
extern slot_t dft_slot_frag, dft_slot_mask, dft_slot_args, dft_slot_obj, dft_slot_stk, dft_slot_id;
extern slot_t dft_slot_gate_on; /* GATE._on, read in place (its class's slot) */

/* o's field for slot s (s found on o's class): read or cleared in place. */
#define SLOT_REF(o, s) (*(PyObject **)((char *)(o) + (s).off))

/* New reference to o.<slot>; NULL with an error (AttributeError when unset). */
static inline PyObject *slot_get(PyObject *o, const slot_t *s) {
    if (s->off >= 0 && Py_TYPE(o) == s->type) {
        PyObject *v = SLOT_REF(o, *s);
        if (v) {
            Py_INCREF(v);
            return v;
        }
    }
    return PyObject_GetAttr(o, s->name);
}

static inline int slot_set(PyObject *o, const slot_t *s, PyObject *v) {
    if (s->off >= 0 && Py_TYPE(o) == s->type) {
        Py_INCREF(v);
        Py_XSETREF(SLOT_REF(o, *s), v);
        return 0;
    }
    return PyObject_SetAttr(o, s->name, v);
}

typedef struct {
    PyObject *state;      /* _recorder.STATE (its open_spans map is replaced after fork) */
    PyTypeObject *span;   /* _nodes.Span, allocated here and filled through its slots */
    PyObject *no_span;    /* the Span returned when nothing is recorded */
    PyObject *start_slow; /* _Traceable._start_py(self, *args, **kwargs) */
    PyObject *stop_slow;  /* _Traceable._stop_py(self, *args, **kwargs) */
    PyTypeObject *use;    /* _nodes.Use, allocated here for node(args={...}) */
    PyObject *call_slow;  /* _Traceable._call_py(self, *args, **kwargs) */
    PyObject *span_stop_slow; /* Span._stop_py(self, args=None) */
    PyObject *record_slow; /* _Traceable._record_py(self, t0, t1, args=None) */
    PyObject *gate;       /* GATE */
    PyObject *off_use;    /* OFF_USE: node(...) when tracing is off by configuration */
} hookstate_t;

extern hookstate_t dft_hooks;

DFT_HIDDEN_END
#endif /* DFTRACE_MODULE_H */
