/* spans.c: the span styles that need no Python method table of their own: the
 * decorator (SpanWrapper) and .iter() (SpanIter), with what every style shares:
 * this thread's stack cache, NVTX ranges, a node's kind ids. The with/start/stop
 * styles are in traceable.c; all of them record through emit_span (engine.h).
 *
 * A new span style: a type here (or in traceable.c when it is a node's method)
 * that opens on current_stack(), times with now_ns() and closes with emit_span();
 * register its type in module.c's PyInit and list the attributes it reads in
 * ENGINE_READS (module.c). */
#include "engine.h"

PyObject *dft_asyncio_get_running_loop = NULL; /* read by running_loop (engine.h) */

/* ------------------------------------------------------------------------- */
/* This thread's stack without a threading.local lookup                        */

/* The cache itself (its type and readers are in engine.h). */
THREAD_LOCAL stack_cache_t dft_stack_cache;
unsigned long long dft_stack_epoch = 1;
int dft_stack_cache_ok = 0;

/* stacks_changed(): a LOCAL.stk was assigned (or LOCAL replaced). */
PyObject *dft_stacks_changed(PyObject *self, PyObject *unused) {
    dft_stack_epoch++;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------- */
/* NVTX ranges (nvtx=True): each span also opens one, through nvtx_ranges.py    */

/* Off, a span pays one predictable branch on this flag: NVTX_OPEN / NVTX_CLOSE. */
int dft_nvtx_on = 0;
static PyObject *nvtx_open_fn = NULL, *nvtx_close_fn = NULL; /* open_range, close_range */

/* Call an NVTX hook; an exception set before stays as it was, one it raises is dropped. */
static void nvtx_call(PyObject *fn, PyObject *const *args, size_t n) {
    if (fn == NULL)
        return;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    Py_INCREF(fn); /* set_nvtx() on another thread may drop it meanwhile */
    PyObject *r = PyObject_Vectorcall(fn, args, n, NULL);
    Py_DECREF(fn);
    if (r)
        Py_DECREF(r);
    else
        PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

/* Span `id` of kind `kid` opened on `stk`; `pairs`: it closes after the spans opened
   inside it (every span the C engine opens), so it can push a range. */
void dft_nvtx_open(uint32_t kid, PyObject *id, PyObject *stk, int pairs) {
    PyObject *k = PyLong_FromUnsignedLong(kid);
    if (!k) {
        PyErr_Clear();
        return;
    }
    nvtx_call(nvtx_open_fn, (PyObject *const[]){k, id, stk, pairs ? Py_True : Py_False}, 4);
    Py_DECREF(k);
}

/* Span `id` closed (recorded, or ended without a record). */
void dft_nvtx_close(PyObject *id) { nvtx_call(nvtx_close_fn, &id, 1); }

/* set_nvtx(open_range, close_range), or set_nvtx(None, None) to stop. */
PyObject *dft_set_nvtx(PyObject *self, PyObject *args) {
    PyObject *o, *c;
    if (!PyArg_ParseTuple(args, "OO", &o, &c))
        return NULL;
    int on = (o != Py_None && c != Py_None);
    if (on && (!PyCallable_Check(o) || !PyCallable_Check(c))) {
        PyErr_SetString(PyExc_TypeError, "set_nvtx() takes two callables, or None and None");
        return NULL;
    }
    dft_nvtx_on = 0;
    Py_CLEAR(nvtx_open_fn);
    Py_CLEAR(nvtx_close_fn);
    if (on) {
        Py_INCREF(o);
        Py_INCREF(c);
        nvtx_open_fn = o;
        nvtx_close_fn = c;
        dft_nvtx_on = 1;
    }
    Py_RETURN_NONE;
}

/* The kind id `name` (_kid, _ikid, _bkid) of a node's spans; 0xFFFFFFFF: none. */
uint32_t dft_node_kid(PyObject *node, PyObject *name) {
    if (IS_T(node)) {
        TraceableObject *t = AS_T(node);
        return name == dft_str_kid ? t->kid : name == dft_str_ikid ? t->ikid : t->bkid;
    }
    PyObject *k = PyObject_GetAttr(node, name);
    long v = k ? PyLong_AsLong(k) : -1;
    Py_XDECREF(k);
    if (v < 0) {
        PyErr_Clear();
        return 0xFFFFFFFFu;
    }
    return (uint32_t)v;
}

/* Remove span `id` from the top of `stk`; anything left above it is unwound. */
static int stack_pop(PyObject *stk, PyObject *id) {
    Py_ssize_t n = PyList_GET_SIZE(stk);
    if (n > 0 && PyList_GET_ITEM(stk, n - 1) == id)
        return drop_top(stk);
    PyObject *r = PyObject_CallFunctionObjArgs(dft_calls.unwind, stk, id, NULL);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* ------------------------------------------------------------------------- */
/* SpanWrapper: the decorator                                                 */

typedef struct {
    PyObject_HEAD
    PyObject *fn;
    PyObject *node;
    PyObject *gate;
    PyObject *extra;
    PyObject *dict;
    PyObject *weakreflist;
    vectorcallfunc vectorcall;
    uint32_t kid;
} SpanWrapper;

static PyObject *SpanWrapper_vectorcall(PyObject *self_, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames) {
    SpanWrapper *w = (SpanWrapper *)self_;
    int on = is_on(w->gate);
    if (on < 0)
        return NULL;
    if (!on || dft_calls.local == NULL)
        return PyObject_Vectorcall(w->fn, args, nargsf, kwnames);

    PyObject *stk = local_stk();
    if (!stk)
        return NULL;
    if (stk == Py_None) {
        Py_DECREF(stk);
        stk = PyObject_CallNoArgs(dft_calls.resolve);
        if (!stk)
            return NULL;
    }
    if (!PyList_Check(stk) || PyList_GET_SIZE(stk) == 0) {
        Py_DECREF(stk);
        return PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
    }
    PyObject *sticky = node_sticky(w->node);
    if (!sticky) {
        PyErr_Clear();
        sticky = Py_None;
        Py_INCREF(sticky);
    }
    PyObject *id = new_id();
    PyObject *tid = id ? stk_tid(stk) : NULL;
    if (!tid || PyList_Append(stk, id) < 0) {
        Py_XDECREF(tid);
        Py_XDECREF(id);
        Py_DECREF(sticky);
        Py_DECREF(stk);
        PyErr_Clear();
        return PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
    }
    Py_ssize_t lvl = PyList_GET_SIZE(stk) - 1;
    PyObject *p = PyList_GET_ITEM(stk, lvl - 1);
    Py_INCREF(p);
    NVTX_OPEN(w->kid, id, stk, 1);
    long long t0 = now_ns();
    PyObject *result = PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
    long long t1 = now_ns();
    if (!result) {
        /* record the span with args.error, then let the exception go on unchanged */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        PyObject *x = ev ? PyObject_CallFunctionObjArgs(dft_calls.with_error, w->extra, ev, NULL) : NULL;
        if (!x) {
            PyErr_Clear();
            x = w->extra;
            Py_INCREF(x);
        }
        if (stack_pop(stk, id) < 0)
            PyErr_Clear();
        if (emit_span(w->kid, t0, t1, id, p, lvl, tid, sticky, x, -1, 0) < 0) {
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
        } else {
            PyErr_Restore(et, ev, tb);
        }
        Py_DECREF(x);
    } else {
        if (stack_pop(stk, id) < 0)
            PyErr_Clear();
        if (emit_span(w->kid, t0, t1, id, p, lvl, tid, sticky, w->extra, -1, 0) < 0)
            Py_CLEAR(result); /* a signal's exception while waiting for room */
    }
    Py_DECREF(sticky);
    Py_DECREF(tid);
    Py_DECREF(p);
    Py_DECREF(id);
    Py_DECREF(stk);
    return result;
}

static PyObject *SpanWrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *fn, *node, *gate, *extra;
    if (!PyArg_ParseTuple(args, "OOOO", &fn, &node, &gate, &extra))
        return NULL;
    uint32_t kid = dft_node_kid(node, dft_str_kid);
    SpanWrapper *w = (SpanWrapper *)type->tp_alloc(type, 0);
    if (!w)
        return NULL;
    Py_INCREF(fn); Py_INCREF(node); Py_INCREF(gate); Py_INCREF(extra);
    w->fn = fn;
    w->node = node;
    w->gate = gate;
    w->extra = extra;
    w->dict = NULL;
    w->weakreflist = NULL;
    w->vectorcall = SpanWrapper_vectorcall;
    w->kid = kid;
    return (PyObject *)w;
}

static int SpanWrapper_traverse(SpanWrapper *w, visitproc visit, void *arg) {
    Py_VISIT(w->fn);
    Py_VISIT(w->node);
    Py_VISIT(w->gate);
    Py_VISIT(w->extra);
    Py_VISIT(w->dict);
    return 0;
}

static int SpanWrapper_clear(SpanWrapper *w) {
    Py_CLEAR(w->fn);
    Py_CLEAR(w->node);
    Py_CLEAR(w->gate);
    Py_CLEAR(w->extra);
    Py_CLEAR(w->dict);
    return 0;
}

static void SpanWrapper_dealloc(SpanWrapper *w) {
    PyObject_GC_UnTrack(w);
    if (w->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)w);
    SpanWrapper_clear(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* Behave like a function when found on a class: bind to the instance. */
static PyObject *SpanWrapper_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

/* Pickle by reference, like a function: the name under which the module holds us. */
static PyObject *SpanWrapper_reduce(PyObject *self, PyObject *unused) {
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef SpanWrapper_methods[] = {
    {"__reduce__", SpanWrapper_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef SpanWrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL}};

PyTypeObject dft_SpanWrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.SpanWrapper",
    .tp_basicsize = sizeof(SpanWrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A traced function: each call is one span of its node.",
    .tp_new = SpanWrapper_new,
    .tp_dealloc = (destructor)SpanWrapper_dealloc,
    .tp_traverse = (traverseproc)SpanWrapper_traverse,
    .tp_clear = (inquiry)SpanWrapper_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(SpanWrapper, vectorcall),
    .tp_descr_get = SpanWrapper_descr_get,
    .tp_dictoffset = offsetof(SpanWrapper, dict),
    .tp_weaklistoffset = offsetof(SpanWrapper, weakreflist),
    .tp_getset = SpanWrapper_getset,
    .tp_methods = SpanWrapper_methods,
};

/* ------------------------------------------------------------------------- */
/* SpanIter: .iter() — per item a <leaf>.iter span and a <leaf>.block span     */

typedef struct SpanIter {
    PyObject_HEAD
    struct SpanIter *prev_open, *next_open; /* the list of iterators with an open block */
    PyObject *it;      /* the source iterator (NULL once exhausted/closed) */
    PyObject *node;
    PyObject *gate;
    PyObject *extra;   /* Extra or None */
    uint32_t ikid, bkid;
    long long count;
    /* the open block span */
    int block_open;
    PyObject *bstk, *bid, *bp, *btid, *bsticky;
    Py_ssize_t blvl;
    long long bt0;
} SpanIter;

/* Iterators whose loop-body span is open, so that one whose body span ends while
   another iterator's is still open above it (zip(a.iter(x), b.iter(y))) can end
   that one first: both then nest. */
static SpanIter *open_iters = NULL;

static void link_open(SpanIter *s) {
    s->prev_open = NULL;
    s->next_open = open_iters;
    if (open_iters)
        open_iters->prev_open = s;
    open_iters = s;
}

static void unlink_open(SpanIter *s) {
    if (s->prev_open)
        s->prev_open->next_open = s->next_open;
    else if (open_iters == s)
        open_iters = s->next_open;
    if (s->next_open)
        s->next_open->prev_open = s->prev_open;
    s->prev_open = s->next_open = NULL;
}

static int close_block(SpanIter *s, long long t2);

/* Before closing s's block: end the blocks of other iterators still open above it. */
static int close_blocks_above(SpanIter *s, long long t2) {
    PyObject *stk = s->bstk;
    Py_ssize_t n = PyList_GET_SIZE(stk);
    while (n > 0 && PyList_GET_ITEM(stk, n - 1) != s->bid) {
        PyObject *top = PyList_GET_ITEM(stk, n - 1);
        SpanIter *o = open_iters;
        while (o && !(o->block_open && o->bid == top))
            o = o->next_open;
        if (!o)
            return 0; /* not a block: left to stack_pop (unwound) */
        if (close_block(o, t2) < 0)
            return -1;
        Py_ssize_t m = PyList_GET_SIZE(stk);
        if (m >= n)
            return 0;
        n = m;
    }
    return 0;
}

/* Close the loop body's span at t2; -1 when an exception must propagate. */
static int close_block(SpanIter *s, long long t2) {
    if (!s->block_open)
        return 0;
    if (close_blocks_above(s, t2) < 0)
        return -1;
    s->block_open = 0;
    unlink_open(s);
    if (stack_pop(s->bstk, s->bid) < 0)
        PyErr_Clear();
    int rc = emit_span(s->bkid, s->bt0, t2, s->bid, s->bp, s->blvl, s->btid, s->bsticky, s->extra,
                       s->count, 0);
    Py_CLEAR(s->bstk);
    Py_CLEAR(s->bid);
    Py_CLEAR(s->bp);
    Py_CLEAR(s->btid);
    Py_CLEAR(s->bsticky);
    return rc;
}

static PyObject *plain_next(SpanIter *s) {
    PyObject *item = PyIter_Next(s->it);
    if (item)
        s->count++;
    else
        Py_CLEAR(s->it);
    return item;
}

static PyObject *SpanIter_next(SpanIter *s) {
    if (close_block(s, now_ns()) < 0)
        return NULL;
    if (s->it == NULL)
        return NULL;
    int on = is_on(s->gate);
    PyErr_Clear();
    if (on <= 0 || dft_calls.local == NULL)
        return plain_next(s);
    PyObject *stk = current_stack();
    if (!stk || !PyList_Check(stk) || PyList_GET_SIZE(stk) == 0) {
        Py_XDECREF(stk);
        PyErr_Clear();
        return plain_next(s);
    }
    PyObject *sticky = node_sticky(s->node);
    if (!sticky) {
        PyErr_Clear();
        sticky = Py_None;
        Py_INCREF(sticky);
    }
    PyObject *id = new_id();
    PyObject *tid = id ? stk_tid(stk) : NULL;
    if (!tid || PyList_Append(stk, id) < 0) {
        Py_XDECREF(tid); Py_XDECREF(id); Py_DECREF(sticky); Py_DECREF(stk);
        PyErr_Clear();
        return plain_next(s);
    }
    Py_ssize_t lvl = PyList_GET_SIZE(stk) - 1;
    PyObject *p = PyList_GET_ITEM(stk, lvl - 1);
    Py_INCREF(p);
    NVTX_OPEN(s->ikid, id, stk, 1);
    long long t0 = now_ns();
    PyObject *item = PyIter_Next(s->it);
    long long t1 = now_ns();
    if (stack_pop(stk, id) < 0)
        PyErr_Clear();
    if (item == NULL) {
        Py_CLEAR(s->it);
        if (PyErr_Occurred()) {
            /* the source raised: record the .iter span with args.error, re-raise */
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            PyErr_NormalizeException(&et, &ev, &tb);
            PyObject *x = PyObject_CallFunctionObjArgs(dft_calls.with_error, s->extra, ev ? ev : Py_None, NULL);
            if (!x) {
                PyErr_Clear();
                x = s->extra;
                Py_INCREF(x);
            }
            if (emit_span(s->ikid, t0, t1, id, p, lvl, tid, sticky, x, -1, 0) < 0) {
                Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
            } else {
                PyErr_Restore(et, ev, tb);
            }
            Py_DECREF(x);
        } else {
            NVTX_CLOSE(id); /* the end: no .iter span is recorded */
        }
        Py_DECREF(sticky); Py_DECREF(p); Py_DECREF(tid); Py_DECREF(id); Py_DECREF(stk);
        return NULL;
    }
    s->count++;
    if (emit_span(s->ikid, t0, t1, id, p, lvl, tid, sticky, s->extra, s->count, 0) < 0) {
        Py_DECREF(item);
        Py_DECREF(sticky); Py_DECREF(p); Py_DECREF(tid); Py_DECREF(id); Py_DECREF(stk);
        return NULL;
    }
    Py_DECREF(id);
    /* the loop body's span: open until the next call (or close/dealloc) */
    PyObject *bid = new_id();
    if (bid && PyList_Append(stk, bid) == 0) {
        NVTX_OPEN(s->bkid, bid, stk, 1);
        s->block_open = 1;
        s->bstk = stk;
        s->bid = bid;
        s->bp = p;
        s->btid = tid;
        s->bsticky = sticky;
        s->blvl = lvl;
        s->bt0 = t1;
        link_open(s);
        return item;
    }
    PyErr_Clear();
    Py_XDECREF(bid);
    Py_DECREF(sticky);
    Py_DECREF(p);
    Py_DECREF(tid);
    Py_DECREF(stk);
    return item;
}

static PyObject *SpanIter_close(SpanIter *s, PyObject *unused) {
    int rc = close_block(s, now_ns());
    Py_CLEAR(s->it);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *SpanIter_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *node, *gate, *extra, *iterable;
    if (!PyArg_ParseTuple(args, "OOOO", &node, &gate, &extra, &iterable))
        return NULL;
    PyObject *it = PyObject_GetIter(iterable);
    if (!it)
        return NULL;
    SpanIter *s = (SpanIter *)type->tp_alloc(type, 0);
    if (!s) {
        Py_DECREF(it);
        return NULL;
    }
    s->it = it;
    Py_INCREF(node); Py_INCREF(gate); Py_INCREF(extra);
    s->node = node;
    s->gate = gate;
    s->extra = extra;
    s->ikid = dft_node_kid(node, dft_str_ikid);
    s->bkid = dft_node_kid(node, dft_str_bkid);
    return (PyObject *)s;
}

static int SpanIter_traverse(SpanIter *s, visitproc visit, void *arg) {
    Py_VISIT(s->it); Py_VISIT(s->node); Py_VISIT(s->gate); Py_VISIT(s->extra);
    Py_VISIT(s->bstk); Py_VISIT(s->bid); Py_VISIT(s->bp); Py_VISIT(s->btid); Py_VISIT(s->bsticky);
    return 0;
}

static int SpanIter_clear(SpanIter *s) {
    Py_CLEAR(s->it); Py_CLEAR(s->node); Py_CLEAR(s->gate); Py_CLEAR(s->extra);
    if (s->block_open)
        unlink_open(s);
    s->block_open = 0;
    Py_CLEAR(s->bstk); Py_CLEAR(s->bid); Py_CLEAR(s->bp); Py_CLEAR(s->btid); Py_CLEAR(s->bsticky);
    return 0;
}

static void SpanIter_dealloc(SpanIter *s) {
    PyObject_GC_UnTrack(s);
    if (s->block_open && s->node) {
        /* a loop left with break or an exception: close the body's span now */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (close_block(s, now_ns()) < 0)
            PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    }
    SpanIter_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef SpanIter_methods[] = {
    {"close", (PyCFunction)SpanIter_close, METH_NOARGS, "Stop iterating; close the open span."},
    {NULL, NULL, 0, NULL}};

PyTypeObject dft_SpanIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.SpanIter",
    .tp_basicsize = sizeof(SpanIter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An iterable wrapped by node.iter(): .iter and .block spans per item.",
    .tp_new = SpanIter_new,
    .tp_dealloc = (destructor)SpanIter_dealloc,
    .tp_traverse = (traverseproc)SpanIter_traverse,
    .tp_clear = (inquiry)SpanIter_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)SpanIter_next,
    .tp_methods = SpanIter_methods,
};
