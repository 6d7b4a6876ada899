/* spans.c: the span styles that need no Python method table of their own: the
 * decorator (SpanWrapper) and .iter() (SpanIter), with what every style shares:
 * this thread's stack cache, NVTX ranges, a node's kind ids. The with/start/stop
 * styles are in traceable.c; all of them open and close their spans with
 * span_open / span_close (span_lifecycle.h), which record through emit_span.
 *
 * A new span style: a type here (or in traceable.c when it is a node's method)
 * that opens on current_stack() with span_open() and closes with span_close();
 * register its type in module.c's PyInit and list the attributes it reads in
 * ENGINE_READS (module.c). */
#include "spans.h"
#include "span_lifecycle.h"
#include "kept_spans.h"
#include "traceable.h"

PyObject *dft_asyncio_get_running_loop = NULL; /* read by running_loop (spans.h) */
PyObject *dft_modules_seen = NULL; /* borrowed: compared, never read through */
Py_ssize_t dft_modules_seen_size = -1;

/* ------------------------------------------------------------------------- */
/* This thread's stack without a threading.local lookup                        */

/* The cache itself (its type and readers are in spans.h). */
THREAD_LOCAL stack_cache_t dft_stack_cache;
unsigned long long dft_stack_epoch = 1;
static int stack_cache_ok = 0; /* LOCAL is a real threading.local */

void dft_stacks_forget(void) { dft_stack_epoch++; }

void dft_stack_cache_allow(int usable) {
    stack_cache_ok = usable;
    dft_stacks_forget();
}

PyObject *dft_local_stk_read(void) {
    PyObject *stk = PyObject_GetAttr(dft_calls.local, dft_str_stk);
    if (!stk || !stack_cache_ok || !PyList_Check(stk))
        return stk;
    PyObject *tid = PyObject_GetAttr(stk, dft_str_tid), *open = tid ? PyObject_GetAttr(stk, dft_str_open) : NULL;
    if (open && IS_KEPT_MAP(open)) {
        dft_stack_cache.stk = stk;
        dft_stack_cache.tid = tid;
        dft_stack_cache.open = open;
        dft_stack_cache.epoch = dft_stack_epoch;
        dft_stack_cache.tsid = PyThreadState_Get()->id;
    }
    PyErr_Clear();
    Py_XDECREF(tid);
    Py_XDECREF(open);
    return stk;
}

/* ------------------------------------------------------------------------- */
/* An asyncio task's stack without resolve()                                    */

static PyObject *current_task_fn = NULL; /* _asyncio.current_task (3.12 on) */
static PyObject *current_tasks = NULL;   /* else asyncio.tasks._current_tasks: {loop: task} */

/* The task running on `loop` as asyncio.current_task reads it (new reference, None
   for none), or NULL with no error set where neither way is there. */
static PyObject *task_of(PyObject *loop) {
    if (current_task_fn == NULL && current_tasks == NULL) {
        PyObject *mods = PyImport_GetModuleDict(); /* borrowed */
        PyObject *c = mods ? PyDict_GetItemString(mods, "_asyncio") : NULL;
        current_task_fn = c ? PyObject_GetAttrString(c, "current_task") : NULL;
        if (current_task_fn == NULL) {
            PyErr_Clear();
            PyObject *tasks = mods ? PyDict_GetItemString(mods, "asyncio.tasks") : NULL;
            PyObject *d = tasks ? PyObject_GetAttrString(tasks, "_current_tasks") : NULL;
            if (d == NULL || !PyDict_CheckExact(d)) {
                PyErr_Clear();
                Py_XDECREF(d);
                return NULL;
            }
            current_tasks = d;
        }
    }
    if (current_task_fn != NULL) {
        PyObject *task = PyObject_CallOneArg(current_task_fn, loop);
        if (task == NULL)
            PyErr_Clear();
        return task;
    }
    PyObject *task = PyDict_GetItemWithError(current_tasks, loop); /* borrowed */
    if (task == NULL) {
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return NULL;
        }
        task = Py_None;
    }
    Py_INCREF(task);
    return task;
}

PyObject *dft_task_stack(PyObject *loop) {
    PyObject *stk = NULL;
    if (dft_calls.task_stack == NULL || PyContextVar_Get(dft_calls.task_stack, NULL, &stk) < 0) {
        PyErr_Clear();
        return NULL;
    }
    if (stk == NULL || stk == Py_None || !PyList_Check(stk)) {
        Py_XDECREF(stk);
        return NULL;
    }
    PyObject *task = task_of(loop);
    PyObject *owner = (task != NULL && task != Py_None) ? PyObject_GetAttr(stk, dft_str_owner) : NULL;
    if (owner == NULL)
        PyErr_Clear();
    int mine = owner != NULL && owner == task;
    Py_XDECREF(owner);
    Py_XDECREF(task);
    if (!mine) {
        Py_DECREF(stk);
        return NULL;
    }
    return stk;
}

/* stacks_changed(): a LOCAL.stk was assigned (or LOCAL replaced). */
static PyObject *stacks_changed(PyObject *self, PyObject *unused) {
    dft_stacks_forget();
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
static PyObject *set_nvtx(PyObject *self, PyObject *args) {
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

/* ------------------------------------------------------------------------- */
/* The decorator's call of the traced function: as deep as without dftrace     */

/* Python 3.12 charges each call from C into Python code two units of a C recursion
   budget (1500 in 3.12.0 and 3.12.1) that sys.setrecursionlimit() does not raise,
   while a call from Python code into Python code costs none of it. Recursion through
   the decorator would stop at 750 levels where the same code undecorated reaches the
   recursion limit, so the decorator gives those units back for the call while the
   thread's Python stack is shallower than Python's default recursion limit: as deep
   as a program that keeps that limit can go. Deeper (a program that raised it), each
   call is charged again, as the interpreter frames piling up on the C stack are what
   the budget guards: a RecursionError comes before the stack runs out. */
#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
#define DEFAULT_RECURSION_LIMIT 1000
#define EVAL_C_UNITS 2 /* what 3.12's ceval.c charges one evaluation (PY_EVAL_C_STACK_UNITS) */

static inline int give_back_eval_units(PyThreadState *ts) {
    if (ts->py_recursion_limit - ts->py_recursion_remaining >= DEFAULT_RECURSION_LIMIT)
        return 0;
    ts->c_recursion_remaining += EVAL_C_UNITS;
    return EVAL_C_UNITS;
}

static PyObject *call_traced(PyObject *fn, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyThreadState *ts = PyThreadState_Get();
    int units = give_back_eval_units(ts);
    PyObject *r = PyObject_Vectorcall(fn, args, nargsf, kwnames);
    ts->c_recursion_remaining -= units;
    return r;
}
#else
#define call_traced PyObject_Vectorcall
#endif

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
        return call_traced(w->fn, args, nargsf, kwnames);

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
        return call_traced(w->fn, args, nargsf, kwnames);
    }
    span_t sp;
    if (span_open(&sp, stk, w->node, w->kid, SPAN_NOW) < 0) {
        Py_DECREF(stk);
        return call_traced(w->fn, args, nargsf, kwnames);
    }
    PyObject *result = call_traced(w->fn, args, nargsf, kwnames);
    long long t1 = now_ns();
    if (!result)
        span_close_raised(&sp, stk, t1, w->extra, -1); /* args.error; the exception goes on */
    else if (span_close(&sp, stk, t1, w->extra, NULL, -1, 0) < 0)
        Py_CLEAR(result); /* a signal's exception while waiting for room */
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
    w->fn = Py_NewRef(fn);
    w->node = Py_NewRef(node);
    w->gate = Py_NewRef(gate);
    w->extra = Py_NewRef(extra);
    w->vectorcall = SpanWrapper_vectorcall;
    w->kid = kid;
    return (PyObject *)w;
}

/* tp_traverse, and tp_clear (visit NULL) */
static int SpanWrapper_refs(SpanWrapper *w, visitproc visit, void *arg) {
    PyObject **const refs[] = {&w->fn, &w->node, &w->gate, &w->extra, &w->dict};
    return visit_refs(refs, NREFS(refs), visit, arg);
}

static int SpanWrapper_clear(SpanWrapper *w) { return SpanWrapper_refs(w, NULL, NULL); }

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
    .tp_traverse = (traverseproc)SpanWrapper_refs,
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
    PyObject *it;      /* the source iterator (NULL once exhausted/closed); the iterable
                          itself until the first item is asked for (fresh) */
    int fresh;
    PyObject *node;
    PyObject *gate;
    PyObject *extra;   /* Extra or None */
    uint32_t ikid, bkid;
    long long count;
    /* the open loop-body span, on bstk */
    int block_open;
    PyObject *bstk;
    span_t block;
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
    while (n > 0 && PyList_GET_ITEM(stk, n - 1) != s->block.id) {
        PyObject *top = PyList_GET_ITEM(stk, n - 1);
        SpanIter *o = open_iters;
        while (o && !(o->block_open && o->block.id == top))
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
    int rc = span_close(&s->block, s->bstk, t2, s->extra, NULL, s->count, 0);
    Py_CLEAR(s->bstk);
    return rc;
}

/* close_open_blocks(t[, ids]): the loop-body spans of iterators still suspended
   (an exception or a signal inside a for loop leaves its generator holding them)
   written now, flagged incomplete, ending at t, innermost first: all of them (at
   finalize), or those whose span id is in the list ids (just unwound from their
   stack by a span that enclosed them). */
static PyObject *close_open_blocks(PyObject *self, PyObject *args) {
    long long t;
    PyObject *ids = NULL;
    if (!PyArg_ParseTuple(args, "L|O", &t, &ids))
        return NULL;
    if (ids == Py_None)
        ids = NULL;
    long n = 0;
    SpanIter *s = open_iters; /* the newest first: it is above the older ones */
    while (s) {
        SpanIter *next = s->next_open;
        int take = s->block_open;
        if (take && ids) {
            take = PySequence_Contains(ids, s->block.id);
            if (take < 0) {
                PyErr_Clear();
                take = 0;
            }
        }
        if (take) {
            unlink_open(s);
            s->block_open = 0;
            if (span_close(&s->block, s->bstk, t, s->extra, NULL, s->count, F_INCOMPLETE) < 0)
                PyErr_Clear();
            Py_CLEAR(s->bstk);
            n++;
            next = open_iters; /* closing may have unlinked others: walk again */
        }
        s = next;
    }
    return PyLong_FromLong(n);
}

/* open_block_kinds(): {span id: kind} of the .iter() loop-body spans open now. */
static PyObject *open_block_kinds(PyObject *self, PyObject *unused) {
    PyObject *out = PyDict_New();
    if (!out)
        return NULL;
    for (SpanIter *s = open_iters; s; s = s->next_open) {
        if (!s->block_open)
            continue;
        PyObject *kid = PyLong_FromUnsignedLong(s->block.kid);
        if (!kid || PyDict_SetItem(out, s->block.id, kid) < 0) {
            Py_XDECREF(kid);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(kid);
    }
    return out;
}

/* The source's iterator, made when the first item is asked for (inside the first item's
   span: a DataLoader starts its workers there). -1 with the error set. */
static int take_iter(SpanIter *s) {
    s->fresh = 0;
    PyObject *it = PyObject_GetIter(s->it);
    Py_SETREF(s->it, it);
    return it ? 0 : -1;
}

static PyObject *plain_next(SpanIter *s) {
    if (s->fresh && take_iter(s) < 0)
        return NULL;
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
    span_t item_span;
    if (span_open(&item_span, stk, s->node, s->ikid, SPAN_NOW) < 0) {
        Py_DECREF(stk);
        return plain_next(s);
    }
    PyObject *item = s->fresh && take_iter(s) < 0 ? NULL : PyIter_Next(s->it);
    long long t1 = now_ns();
    if (item == NULL) {
        Py_CLEAR(s->it);
        if (PyErr_Occurred()) { /* the source raised: the .iter span with args.error */
            span_close_raised(&item_span, stk, t1, s->extra, -1);
        } else { /* the end: no item, so no .iter span; the wait for it, and for the
                    source's iterator to go (its workers, its threads), is <leaf>.end */
            span_close(&item_span, stk, t1, NULL, NULL, -1, SPAN_UNRECORDED);
            if (dft_calls.iter_end) {
                PyObject *r = PyObject_CallFunction(dft_calls.iter_end, "OLLOL", s->node, item_span.t0, now_ns(),
                                                    s->extra ? s->extra : Py_None, s->count);
                if (r)
                    Py_DECREF(r);
                else if (PyErr_ExceptionMatches(PyExc_Exception))
                    PyErr_Clear(); /* (else a signal's exception, raised: the program's) */
            }
        }
        Py_DECREF(stk);
        return NULL;
    }
    s->count++;
    /* the item's span ends; the loop body's follows it until the next call (or
       close/dealloc) */
    if (span_close_open_next(&item_span, stk, t1, s->extra, s->count, s->bkid) < 0) {
        Py_DECREF(item);
        Py_DECREF(stk);
        return NULL;
    }
    if (item_span.id) {
        s->block = item_span;
        s->block_open = 1;
        s->bstk = stk;
        link_open(s);
    } else {
        Py_DECREF(stk);
    }
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
    SpanIter *s = (SpanIter *)type->tp_alloc(type, 0);
    if (!s)
        return NULL;
    Py_INCREF(iterable);
    s->it = iterable;
    s->fresh = 1;
    Py_INCREF(node); Py_INCREF(gate); Py_INCREF(extra);
    s->node = node;
    s->gate = gate;
    s->extra = extra;
    s->ikid = dft_node_kid(node, dft_str_ikid);
    s->bkid = dft_node_kid(node, dft_str_bkid);
    return (PyObject *)s;
}

/* tp_traverse, and tp_clear (visit NULL) */
static int SpanIter_refs(SpanIter *s, visitproc visit, void *arg) {
    PyObject **const refs[] = {&s->it, &s->node, &s->gate, &s->extra, &s->bstk, &s->block.id,
                               &s->block.parent, &s->block.sticky, &s->block.tid};
    return visit_refs(refs, NREFS(refs), visit, arg);
}

static int SpanIter_clear(SpanIter *s) {
    if (s->block_open)
        unlink_open(s);
    s->block_open = 0;
    return SpanIter_refs(s, NULL, NULL);
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
    .tp_traverse = (traverseproc)SpanIter_refs,
    .tp_clear = (inquiry)SpanIter_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)SpanIter_next,
    .tp_methods = SpanIter_methods,
};

/* The module's functions of this file (module.c adds them). */
PyMethodDef dft_spans_methods[] = {
    {"set_nvtx", set_nvtx, METH_VARARGS,
     "set_nvtx(open_range, close_range): every span also calls these (None, None: off)"},
    {"stacks_changed", stacks_changed, METH_NOARGS, "A LOCAL.stk was assigned: threads read theirs again."},
    {"open_block_kinds", open_block_kinds, METH_NOARGS,
     "open_block_kinds() -> {span id: kind} of the .iter() loop-body spans open now"},
    {"close_open_blocks", close_open_blocks, METH_VARARGS,
     "close_open_blocks(t, ids=None) -> n: write the open .iter() loop-body spans (those with an id "
     "in ids), incomplete, ending at t"},
    {NULL, NULL, 0, NULL}};
