/* traceable.c: the methods of nodes and uses (TraceableBase: with, start()/stop(),
 * update(), node(args=...)) and SpanBase (Span.stop(args=None) for the token
 * start() returned). Each has a fast path for the common case and falls back to
 * the Python method given to register() (module.c) for every other one. */
#include "traceable.h"
#include "encoder.h"
#include "kept_spans.h"
#include "span_lifecycle.h"

/* New references to a traceable's _node / _extra. */
static PyObject *get_node(PyObject *o) {
    if (IS_T(o) && AS_T(o)->node) {
        Py_INCREF(AS_T(o)->node);
        return AS_T(o)->node;
    }
    return PyObject_GetAttr(o, dft_str_node);
}

/* A use made while its node was off encodes its args on first use. */
static PyObject *get_extra(PyObject *o) {
    if (!IS_T(o))
        return PyObject_GetAttr(o, dft_str_extra);
    TraceableObject *t = AS_T(o);
    if (!t->extra && t->raw) {
        PyObject *x = PyObject_CallOneArg(dft_calls.to_extra, t->raw);
        if (!x)
            return NULL;
        t->extra = x;
        Py_CLEAR(t->raw);
    }
    PyObject *x = t->extra ? t->extra : Py_None;
    Py_INCREF(x);
    return x;
}


/* ------------------------------------------------------------------------- */
/* TraceableBase: __enter__/__exit__ and start()/stop() for nodes and uses    */
/* Their spans wait in their stack's KeptSpans (kept_spans.h).                 */

/* Open a span of `self` (a node or use, with its args `extra`) on stk and keep it
   in the stack's map `open` (a KeptSpans) until its end: 0, or -1 with no error set
   (nothing opened). */
static int open_kept(PyObject *self, PyObject *extra, PyObject *stk, PyObject *open) {
    PyObject *node = get_node(self);
    if (!node) {
        PyErr_Clear();
        return -1;
    }
    uint32_t kid = dft_node_kid(node, dft_str_kid);
    if (kid == 0xFFFFFFFFu) { /* not a node with a kind: its span cannot be written */
        COUNT_DROP(1);
        Py_DECREF(node);
        return -1;
    }
    span_t sp;
    int rc = span_open(&sp, stk, node, kid, SPAN_NOW);
    Py_DECREF(node);
    if (rc < 0)
        return -1;
    if (kept_push(open, &sp, self, extra) < 0) { /* not kept after all: nothing is recorded */
        PyErr_Clear();
        span_close(&sp, stk, 0, NULL, NULL, -1, SPAN_UNRECORDED);
        return -1;
    }
    return 0;
}

static PyObject *Traceable_enter(PyObject *self, PyObject *unused) {
    int on = is_on(self);
    if (on <= 0 || dft_calls.local == NULL) {
        if (unlikely(on < 0))
            PyErr_Clear();
        Py_INCREF(self);
        return self;
    }
    PyObject *stk = current_stack(), *extra = NULL, *open = NULL;
    if (!stk || !PyList_Check(stk) || PyList_GET_SIZE(stk) == 0)
        goto done;
    extra = get_extra(self);
    open = extra ? stk_open(stk) : NULL;
    if (!open || !IS_KEPT_MAP(open))
        goto done;
    open_kept(self, extra, stk, open);
done:
    if (unlikely(PyErr_Occurred() != NULL))
        PyErr_Clear(); /* entering a span never fails the user's with-statement */
    Py_XDECREF(open);
    Py_XDECREF(extra);
    Py_XDECREF(stk);
    Py_INCREF(self);
    return self;
}

static PyObject *Traceable_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs == 3 && NOTHING_OPENED_EVER())
        Py_RETURN_FALSE; /* tracing never started: nothing to close */
    long long t1 = now_ns();
    PyObject *stk = NULL, *open = NULL;
    if (nargs != 3 || dft_calls.local == NULL)
        goto slow;
    stk = local_stk();
    if (stk == Py_None) {
        /* Inside a loop: the task's own stack, where it has one. */
        PyObject *loop = running_loop();
        PyObject *task_stk = (loop != NULL && loop != Py_None) ? dft_task_stack(loop) : NULL;
        int outside = (loop == Py_None);
        Py_XDECREF(loop);
        if (task_stk != NULL) {
            Py_DECREF(stk);
            stk = task_stk;
        } else {
            /* A thread that never recorded has nothing to close (unless inside a loop). */
            PyObject *own = outside ? PyObject_GetAttr(dft_calls.local, dft_str_thread_stk) : NULL;
            int never = (own == Py_None);
            Py_XDECREF(own);
            if (never) {
                Py_DECREF(stk);
                Py_RETURN_FALSE;
            }
            goto slow;
        }
    }
    if (!stk || !PyList_Check(stk))
        goto slow;
    if (PyList_GET_SIZE(stk) < 2) {
        /* nothing open on this thread (inside an event loop LOCAL.stk is None) */
        Py_DECREF(stk);
        Py_RETURN_FALSE;
    }
    /* No event-loop check needed: a span opened inside a loop lives on its task's
       stack (LOCAL.stk is None there), so a match on top of LOCAL.stk is ours. */
    open = stk_open(stk);
    if (!open || !IS_KEPT_MAP(open) || !kept_on_top(open, stk, self))
        goto slow;
    kept_t k;
    kept_take_last(open, &k);
    /* an exception leaving the block is the span's error (args.error) */
    int rc = kept_close(&k, stk, t1, NULL, args[1] == Py_None ? NULL : args[1]);
    Py_DECREF(open);
    Py_DECREF(stk);
    if (rc < 0)
        return NULL;
    Py_RETURN_FALSE;
slow:
    PyErr_Clear();
    Py_XDECREF(open);
    Py_XDECREF(stk);
    if (dft_calls.slow_exit == NULL)
        Py_RETURN_FALSE;
    return PyObject_Vectorcall(dft_calls.slow_exit, (PyObject *const[]){self, nargs > 0 ? args[0] : Py_None,
                                   nargs > 1 ? args[1] : Py_None, nargs > 2 ? args[2] : Py_None},
                               4, NULL);
}

static PyObject *call_method(PyObject *fn, PyObject *self, PyObject *args, PyObject *kwargs) {
    PyObject *full = PyTuple_New(PyTuple_GET_SIZE(args) + 1);
    if (!full)
        return NULL;
    Py_INCREF(self);
    PyTuple_SET_ITEM(full, 0, self);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(args); k++) {
        Py_INCREF(PyTuple_GET_ITEM(args, k));
        PyTuple_SET_ITEM(full, k + 1, PyTuple_GET_ITEM(args, k));
    }
    PyObject *r = PyObject_Call(fn, full, kwargs);
    Py_DECREF(full);
    return r;
}

static PyObject *Traceable_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames);

static PyObject *Traceable_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *o = PyType_GenericNew(type, args, kwds);
    if (o)
        AS_T(o)->vectorcall = Traceable_vectorcall;
    return o;
}

/* Off by configuration, node(fn) is fn itself and node(...) with options or args the
   use that does nothing (OFF_USE); NULL: not such a call (`fn` NULL: no positional). */
static PyObject *off_call(PyObject *fn) {
    PyObject *r = (fn != NULL && fn != Py_None && !PyDict_Check(fn)) ? fn : dft_hooks.off_use;
    Py_INCREF(r);
    return r;
}

static int Traceable_clear(TraceableObject *t);

/* Uses made by node(args=...) live for one with block: a few are kept for the next
   ones. Only for Use itself (its instances have no __dict__ nor weakrefs), whose
   tp_dealloc register() sets to use_dealloc. */
static freelist_t use_free;

static void use_dealloc(PyObject *o) {
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    Traceable_clear(AS_T(o));
    freelist_free(&use_free, o);
    Py_DECREF(tp);
}

/* node(args=d) for a node and a plain dict: the Use made here, its args encoded once
   (a snapshot) while the node records, else kept as given and encoded only if the
   use is used after recording started. NULL without an error: not this case. */
static PyObject *make_use(PyObject *self, PyObject *d) {
    PyObject *node = d && PyDict_CheckExact(d) ? get_node(self) : NULL;
    if (node == self && dft_hooks.use) {
        PyObject *x = NULL, *raw = NULL;
        if (PyDict_GET_SIZE(d) == 0) {
            x = Py_None;
            Py_INCREF(x);
        } else if (is_on(self) > 0) {
            x = dft_plain_extra(d, 0);
        } else {
            raw = d; /* nothing records now: encoded only if it is used later */
            Py_INCREF(raw);
        }
        PyObject *use = (x || raw) ? freelist_alloc(&use_free, dft_hooks.use) : NULL;
        if (use) {
            TraceableObject *u = AS_T(use);
            Py_INCREF(self);
            u->node = self;
            u->extra = x;
            u->raw = raw;
            Py_INCREF(Py_None);
            u->forced = Py_None;
            u->vectorcall = Traceable_vectorcall;
            Py_DECREF(node);
            return use;
        }
        Py_XDECREF(raw);
        Py_XDECREF(x);
    }
    Py_XDECREF(node);
    PyErr_Clear();
    return NULL;
}

/* Whether register() was given the tree's objects; 0 with a TypeError. */
static int configured(void) {
    if (dft_hooks.call_slow == NULL) {
        PyErr_SetString(PyExc_TypeError, "dftrace is not configured");
        return 0;
    }
    return 1;
}

/* node(args={...}) for a node that records now and plain args: the Use is made
   here (its args encoded once, a snapshot); everything else goes to Python. */
PyObject *dft_traceable_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    if (dft_off_for_good && dft_hooks.off_use && PyTuple_GET_SIZE(args) <= 1)
        return off_call(PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, 0) : NULL);
    PyObject *use = NULL;
    if (dft_hooks.use && !dft_off_for_good && PyTuple_GET_SIZE(args) == 0 && kwargs &&
        PyDict_GET_SIZE(kwargs) == 1)
        use = make_use(self, PyDict_GetItemWithError(kwargs, dft_str_args_kw));
    if (use || !configured())
        return use;
    return call_method(dft_hooks.call_slow, self, args, kwargs);
}

static PyObject *call_slow(PyObject *fn, PyObject *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject **full = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n + nk + 1));
    if (!full)
        return PyErr_NoMemory();
    full[0] = self;
    for (Py_ssize_t k = 0; k < n + nk; k++)
        full[k + 1] = args[k];
    PyObject *r = PyObject_Vectorcall(fn, full, (size_t)(n + 1), kwnames);
    PyMem_Free(full);
    return r;
}

/* node(...) as a vectorcall (no keyword dict built): node(args={...}) and the off
   switch here, anything else in Python (call_slow). */
static PyObject *Traceable_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (dft_off_for_good && dft_hooks.off_use && n <= 1)
        return off_call(n ? args[0] : NULL);
    PyObject *use = NULL;
    if (n == 0 && nk == 1 && !dft_off_for_good &&
        (PyTuple_GET_ITEM(kwnames, 0) == dft_str_args_kw ||
         PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), dft_str_args_kw) == 0))
        use = make_use(self, args[0]);
    if (use || !configured())
        return use;
    return call_slow(dft_hooks.call_slow, self, args, nargsf, kwnames);
}

static freelist_t span_free; /* the Spans start() returns (see span_dealloc) */

static PyObject *Traceable_start(PyObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) || kwnames || dft_hooks.span == NULL || dft_calls.local == NULL)
        return call_slow(dft_hooks.start_slow, self, args, nargsf, kwnames);
    int on = is_on(self);
    if (on <= 0) {
        if (unlikely(on < 0))
            PyErr_Clear();
        Py_INCREF(dft_hooks.no_span);
        return dft_hooks.no_span;
    }
    PyObject *stk = current_stack(), *id = NULL, *extra = NULL, *open = NULL, *spans = NULL,
             *span = NULL;
    if (!stk || !PyList_Check(stk) || PyList_GET_SIZE(stk) == 0)
        goto fail;
    extra = get_extra(self);
    open = extra ? stk_open(stk) : NULL;
    spans = open ? open_spans() : NULL;
    if (!spans || !IS_KEPT_MAP(open) || !IS_STARTED_MAP(spans))
        goto fail;
    if (AS_MAP(spans)->n >= 16) { /* 16: the least max_open_spans accepts */
        PyObject *lim = PyObject_GetAttr(dft_hooks.state, dft_str_max_open_spans);
        Py_ssize_t limit = lim ? PyLong_AsSsize_t(lim) : -1;
        Py_XDECREF(lim);
        PyErr_Clear();
        if (limit >= 0 && AS_MAP(spans)->n >= limit) { /* Python refuses and counts */
            Py_DECREF(spans); Py_DECREF(open); Py_DECREF(extra); Py_DECREF(stk);
            return call_slow(dft_hooks.start_slow, self, args, nargsf, kwnames);
        }
    }
    if (open_kept(self, extra, stk, open) < 0)
        goto fail;
    kept_t *kept = kept_last(open); /* the span just kept */
    unsigned long long idv = kept->span.idv;
    id = kept->span.id;
    Py_INCREF(id);
    span = freelist_alloc(&span_free, dft_hooks.span);
    if (!span || slot_set(span, &dft_slot_obj, self) < 0 || slot_set(span, &dft_slot_stk, stk) < 0 ||
        slot_set(span, &dft_slot_id, id) < 0 || started_add(spans, idv, id, stk) < 0) {
        /* not opened after all: nothing is recorded */
        PyErr_Clear();
        kept_t *k = kept_on_top(open, stk, self);
        if (k) {
            kept_t gone;
            kept_take_last(open, &gone);
            span_close(&gone.span, stk, 0, NULL, NULL, -1, SPAN_UNRECORDED);
            Py_DECREF(gone.opener);
            Py_DECREF(gone.extra);
        }
        goto fail;
    }
    Py_DECREF(id); Py_DECREF(spans); Py_DECREF(open);
    Py_DECREF(extra); Py_DECREF(stk);
    return span;
fail:
    PyErr_Clear(); /* never fail the caller: nothing was recorded */
    Py_XDECREF(span); Py_XDECREF(id); Py_XDECREF(spans);
    Py_XDECREF(open); Py_XDECREF(extra); Py_XDECREF(stk);
    Py_INCREF(dft_hooks.no_span);
    return dft_hooks.no_span;
}

static PyObject *Traceable_stop(PyObject *self, PyObject *const *args, size_t nargsf,
                                PyObject *kwnames) {
    if (NOTHING_OPENED_EVER() && !PyVectorcall_NARGS(nargsf) && !kwnames && is_on(self) == 0)
        Py_RETURN_NONE; /* tracing never started: nothing to close, nothing to warn about */
    long long t1 = now_ns();
    PyObject *stk = NULL, *open = NULL, *spans = NULL;
    if (PyVectorcall_NARGS(nargsf) || kwnames || dft_hooks.span == NULL || dft_calls.local == NULL)
        goto slow;
    spans = open_spans();
    if (!spans || !IS_STARTED_MAP(spans))
        goto slow;
    if (AS_MAP(spans)->n == 0) {
        /* nothing open anywhere: done, unless tracing is on (then Python warns once) */
        if (is_on(self) == 0) {
            Py_DECREF(spans);
            Py_RETURN_NONE;
        }
        goto slow;
    }
    /* The common case: the innermost span on this thread's stack is our start(). */
    stk = local_stk();
    if (!stk || stk == Py_None || !PyList_Check(stk) || PyList_GET_SIZE(stk) < 2)
        goto slow;
    open = stk_open(stk);
    if (!open || !IS_KEPT_MAP(open))
        goto slow;
    kept_t *top = kept_on_top(open, stk, self), k;
    if (!top || !started_remove(spans, top->span.idv))
        goto slow; /* not a start() span (nothing changed) */
    kept_take_last(open, &k);
    int rc = kept_close(&k, stk, t1, NULL, NULL);
    Py_DECREF(spans);
    Py_DECREF(open);
    Py_DECREF(stk);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
slow:
    PyErr_Clear();
    Py_XDECREF(spans);
    Py_XDECREF(open);
    Py_XDECREF(stk);
    if (dft_hooks.stop_slow == NULL)
        Py_RETURN_NONE;
    return call_slow(dft_hooks.stop_slow, self, args, nargsf, kwnames);
}

/* record(t0, t1, args=None): a span that already happened, inside the caller's
   innermost open span. Here: int times in order and args None or a plain dict;
   anything else in Python (record_slow, which also warns about bad times). */
static PyObject *Traceable_record(PyObject *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames || n < 2 || n > 3 || dft_calls.local == NULL)
        goto slow;
    int on = is_on(self);
    if (on <= 0) {
        if (unlikely(on < 0))
            PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!PyLong_CheckExact(args[0]) || !PyLong_CheckExact(args[1]))
        goto slow;
    int o0 = 0, o1 = 0;
    long long t0 = PyLong_AsLongLongAndOverflow(args[0], &o0);
    long long t1 = PyLong_AsLongLongAndOverflow(args[1], &o1);
    if (o0 || o1 || t0 > t1 || PyErr_Occurred()) {
        PyErr_Clear();
        goto slow;
    }
    PyObject *a = n == 3 ? args[2] : NULL;
    if (a == Py_None || (a && PyDict_CheckExact(a) && PyDict_GET_SIZE(a) == 0))
        a = NULL;
    if (a && !PyDict_CheckExact(a))
        goto slow;
    PyObject *node = NULL, *x = NULL, *stk = NULL, *sticky = NULL, *id = NULL, *tid = NULL, *own;
    uint32_t kid;
    Py_ssize_t lvl;
    int rc;
    if (a) {
        x = dft_plain_extra(a, 0);
        if (!x) {
            if (PyErr_Occurred())
                goto fail;
            goto slow; /* not plain: Python sanitizes it */
        }
    }
    own = get_extra(self); /* a use's own args, then these */
    if (!own)
        goto fail;
    if (own != Py_None) {
        PyObject *y = x ? PyObject_CallFunctionObjArgs(dft_calls.merge, own, x, NULL) : own;
        if (y == own)
            Py_INCREF(y);
        Py_DECREF(own);
        Py_XSETREF(x, y);
        if (!x)
            goto fail;
    } else {
        Py_DECREF(own);
    }
    node = get_node(self);
    kid = node ? dft_node_kid(node, dft_str_kid) : 0xFFFFFFFFu;
    if (kid == 0xFFFFFFFFu)
        goto fail;
    stk = current_stack();
    if (!stk || !PyList_Check(stk) || PyList_GET_SIZE(stk) == 0)
        goto fail;
    sticky = node_sticky(node);
    if (!sticky) {
        PyErr_Clear();
        sticky = Py_None;
        Py_INCREF(sticky);
    }
    id = new_id();
    tid = id ? stk_tid(stk) : NULL;
    if (!tid)
        goto fail;
    lvl = PyList_GET_SIZE(stk);
    rc = emit_span(kid, t0, t1, id, PyList_GET_ITEM(stk, lvl - 1), lvl, tid, sticky,
                       x ? x : Py_None, -1, 0);
    Py_DECREF(tid); Py_DECREF(id); Py_DECREF(sticky); Py_DECREF(stk); Py_DECREF(node); Py_XDECREF(x);
    if (rc < 0)
        return NULL; /* an exception that must reach the caller (see emit_span) */
    Py_RETURN_NONE;
fail:
    PyErr_Clear(); /* never fail the caller: nothing was recorded */
    Py_XDECREF(tid); Py_XDECREF(id); Py_XDECREF(sticky); Py_XDECREF(stk); Py_XDECREF(node); Py_XDECREF(x);
    Py_RETURN_NONE;
slow:
    if (dft_hooks.record_slow == NULL)
        Py_RETURN_NONE;
    return call_slow(dft_hooks.record_slow, self, args, nargsf, kwnames);
}

/* update(args=None, /, **kwargs): a node's sticky args, encoded once here (O(1));
   anything but plain values while recording goes to Python (update_slow). A
   vectorcall: keyword values are read from the call's own array, no dict built. */
static int put_kwargs(PyObject *d, PyObject *given, PyObject *const *kwv, PyObject *kwnames) {
    if (given && given != Py_None && PyDict_Update(d, given) < 0)
        return -1;
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    int fresh = PyDict_GET_SIZE(d) == 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        if (!fresh && PyDict_GetItemWithError(d, key) == kwv[k])
            continue; /* the same value again (epoch=0 on every step) */
        if (PyDict_SetItem(d, key, kwv[k]) < 0)
            return -1;
    }
    return 0;
}

/* Move the last update's values (pend_names/pend_vals) into `pending`. */
int dft_pending_flush(TraceableObject *t) {
    PyObject *names = t->pend_names;
    if (!names)
        return 0;
    t->pend_names = NULL;
    int rc = 0;
    Py_ssize_t nk = PyTuple_GET_SIZE(names);
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *v = t->pend_vals[k];
        t->pend_vals[k] = NULL;
        if (rc == 0 && t->pending && PyDict_Check(t->pending) &&
            PyDict_SetItem(t->pending, PyTuple_GET_ITEM(names, k), v) < 0)
            rc = -1;
        Py_XDECREF(v);
    }
    Py_DECREF(names);
    return rc;
}

/* The args of an Extra as values (new reference): its snapshot, or decoded from its
   fragment (Extra.args) when it held containers. */
static PyObject *own_args(PyObject *x) {
    PyObject *a = slot_get(x, &dft_slot_args);
    if (a && a != Py_None)
        return a;
    Py_XDECREF(a);
    PyErr_Clear();
    return PyObject_GetAttr(x, dft_str_args_attr);
}

static PyObject *Traceable_update(PyObject *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    if (dft_off_for_good)
        Py_RETURN_NONE;
    TraceableObject *t = AS_T(self);
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    PyObject *given = n == 1 ? args[0] : NULL;
    int simple = n <= 1 && t->node == self &&
                 (given == NULL || given == Py_None || PyDict_CheckExact(given));
    /* Nothing records the spans this update reaches: tracing not started (every node
       is off then) or this node switched off, and its subtree with it; a use forced
       on reads the values, encoding them, when it opens a span. */
    int idle = is_on(self);
    if (unlikely(idle < 0))
        PyErr_Clear();
    idle = idle == 0;
    if (n == 0 && kwnames && t->pend_names == kwnames && t->node == self && idle) {
        /* the same call site again while nothing records: its new values replace
           the last ones (ai.update(epoch=e, step=s) on every step) */
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
            PyObject *old = t->pend_vals[k];
            Py_INCREF(args[k]);
            t->pend_vals[k] = args[k];
            Py_XDECREF(old);
        }
        dft_sticky_gen++;
        Py_RETURN_NONE;
    }
    if (t->pend_names && dft_pending_flush(t) < 0)
        PyErr_Clear();
    if (n == 0 && kwnames && PyTuple_GET_SIZE(kwnames) <= PEND_MAX && t->node == self &&
        t->pending && PyDict_CheckExact(t->pending) && idle) {
        Py_INCREF(kwnames);
        t->pend_names = kwnames;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
            Py_INCREF(args[k]);
            t->pend_vals[k] = args[k];
        }
        dft_sticky_gen++;
        Py_RETURN_NONE;
    }
    if (simple && t->pending && PyDict_CheckExact(t->pending) && idle) {
        /* nothing records: keep the values as given, encode them when something does */
        if (put_kwargs(t->pending, given, args + n, kwnames) < 0) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        dft_sticky_gen++;
        Py_RETURN_NONE;
    }
    int plain = simple && dft_update_slow &&
                (t->pending == NULL || !PyDict_Check(t->pending) || PyDict_GET_SIZE(t->pending) == 0) &&
                dft_gate && is_on(dft_gate) > 0;
    if (plain) {
        PyObject *d = (t->own && t->own != Py_None) ? own_args(t->own) : PyDict_New();
        if (d && t->own && t->own != Py_None) {
            PyObject *copy = PyDict_Check(d) ? PyDict_Copy(d) : NULL;
            Py_DECREF(d);
            d = copy;
        }
        if (d && put_kwargs(d, given, args + n, kwnames) < 0)
            Py_CLEAR(d);
        PyObject *x = d ? dft_plain_extra(d, 1) : NULL;
        Py_XDECREF(d);
        if (x) {
            Py_XSETREF(t->own, x);
            dft_sticky_gen++;
            Py_RETURN_NONE;
        }
        PyErr_Clear();
    }
    if (!dft_update_slow)
        Py_RETURN_NONE;
    return call_slow(dft_update_slow, self, args, nargsf, kwnames);
}

static PyMethodDef Traceable_methods[] = {
    {"update", (PyCFunction)(void (*)(void))Traceable_update, METH_FASTCALL | METH_KEYWORDS,
     "update(args=None, /, **kwargs): sticky args on the spans of this node and its subtree "
     "that start from now on."},
    {"start", (PyCFunction)(void (*)(void))Traceable_start, METH_FASTCALL | METH_KEYWORDS,
     "start(metadata=False) -> Span: open a span closed by a later stop() (hook style). "
     "With metadata=True write a CM event <name>.start with the time instead."},
    {"stop", (PyCFunction)(void (*)(void))Traceable_stop, METH_FASTCALL | METH_KEYWORDS,
     "stop(span=None, metadata=False): close the span from start() (the innermost open "
     "one of this node on the caller's thread/task, or `span`)."},
    {"record", (PyCFunction)(void (*)(void))Traceable_record, METH_FASTCALL | METH_KEYWORDS,
     "record(t0, t1, args=None): record a span of this event that already happened, from "
     "t0 to t1 (ints on dftrace's clock), inside the caller's innermost open span."},
    {NULL, NULL, 0, NULL}};

/* __enter__ / __exit__: descriptors that hand out the traceable's own hooks (hook_t,
   traceable.h) instead of a new bound method per lookup. */
static PyMethodDef enter_def = {"__enter__", Traceable_enter, METH_NOARGS,
                                "Open a span of this node (nothing when off)."};
static PyMethodDef exit_def = {"__exit__", (PyCFunction)(void (*)(void))Traceable_exit, METH_FASTCALL,
                               "Close the span opened by __enter__; exceptions propagate unchanged."};

static PyObject *hook_enter_call(PyObject *h, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "__enter__() takes no arguments");
        return NULL;
    }
    return Traceable_enter(((hook_t *)h)->owner, NULL);
}

static PyObject *hook_exit_call(PyObject *h, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (kwnames && PyTuple_GET_SIZE(kwnames)) {
        PyErr_SetString(PyExc_TypeError, "__exit__() takes no keyword arguments");
        return NULL;
    }
    return Traceable_exit(((hook_t *)h)->owner, args, PyVectorcall_NARGS(nargsf));
}

/* The last holder let the hook go: drop the owner (the memory is the owner's). */
static void hook_dealloc(PyObject *h) {
    PyObject *owner = ((hook_t *)h)->owner;
    ((hook_t *)h)->owner = NULL;
    Py_XDECREF(owner);
}

static PyObject *hook_repr(PyObject *h) {
    PyObject *owner = ((hook_t *)h)->owner;
    const char *name = ((hook_t *)h)->vectorcall == hook_enter_call ? "__enter__" : "__exit__";
    return owner ? PyUnicode_FromFormat("<bound method %s of %R>", name, owner)
                 : PyUnicode_FromFormat("<unbound %s>", name);
}

static PyTypeObject HookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.BoundHook",
    .tp_basicsize = sizeof(hook_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A node's or use's __enter__ or __exit__, bound.",
    .tp_dealloc = hook_dealloc,
    .tp_repr = hook_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(hook_t, vectorcall),
};

typedef struct {
    PyObject_HEAD
    PyMethodDef *def;
} hookdescr_t;

static PyObject *hookdescr_get(PyObject *d, PyObject *obj, PyObject *type) {
    PyMethodDef *def = ((hookdescr_t *)d)->def;
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(d);
        return d;
    }
#ifdef DFT_INLINE_HOOKS
    if (IS_T(obj)) {
        TraceableObject *t = AS_T(obj);
        hook_t *h = def == &enter_def ? &t->enter_hook : &t->exit_hook;
        if (Py_REFCNT(h) == 0) {
            Py_SET_TYPE(h, &HookType);
            Py_SET_REFCNT(h, 1);
            h->vectorcall = def == &enter_def ? hook_enter_call : hook_exit_call;
            Py_INCREF(obj);
            h->owner = obj;
        } else {
            Py_INCREF(h);
        }
        return (PyObject *)h;
    }
#endif
    return PyCFunction_NewEx(def, obj, NULL);
}

/* TraceableBase.__enter__(node) called on the class. */
static PyObject *hookdescr_call(PyObject *d, PyObject *args, PyObject *kwargs) {
    PyMethodDef *def = ((hookdescr_t *)d)->def;
    if (PyTuple_GET_SIZE(args) < 1 || !IS_T(PyTuple_GET_ITEM(args, 0))) {
        PyErr_Format(PyExc_TypeError, "%s() needs a node or use", def->ml_name);
        return NULL;
    }
    PyObject *bound = PyCFunction_NewEx(def, PyTuple_GET_ITEM(args, 0), NULL);
    PyObject *rest = bound ? PyTuple_GetSlice(args, 1, PyTuple_GET_SIZE(args)) : NULL;
    PyObject *r = rest ? PyObject_Call(bound, rest, kwargs) : NULL;
    Py_XDECREF(rest);
    Py_XDECREF(bound);
    return r;
}

static PyObject *hookdescr_name(PyObject *d, void *c) {
    return PyUnicode_FromString(((hookdescr_t *)d)->def->ml_name);
}

static PyObject *hookdescr_doc(PyObject *d, void *c) {
    return PyUnicode_FromString(((hookdescr_t *)d)->def->ml_doc);
}

static PyGetSetDef hookdescr_getset[] = {
    {"__name__", hookdescr_name, NULL, NULL, NULL},
    {"__doc__", hookdescr_doc, NULL, NULL, NULL},
    {NULL}};

static PyTypeObject HookDescrType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.HookDescriptor",
    .tp_basicsize = sizeof(hookdescr_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "TraceableBase.__enter__ / __exit__: hands out each traceable's own bound hook.",
    .tp_descr_get = hookdescr_get,
    .tp_call = hookdescr_call,
    .tp_getset = hookdescr_getset,
};

static hookdescr_t enter_descr = {PyObject_HEAD_INIT(&HookDescrType) & enter_def};
static hookdescr_t exit_descr = {PyObject_HEAD_INIT(&HookDescrType) & exit_def};

/* tp_traverse, and tp_clear (visit NULL) */
static int Traceable_refs(TraceableObject *t, visitproc visit, void *arg) {
    PyObject **refs[10 + PEND_MAX] = {&t->node, &t->extra, &t->forced, &t->on, &t->sticky, &t->raw,
                                      &t->parent, &t->own, &t->pending, &t->pend_names};
    for (int k = 0; k < PEND_MAX; k++)
        refs[10 + k] = &t->pend_vals[k];
    return visit_refs(refs, NREFS(refs), visit, arg);
}

static int Traceable_clear(TraceableObject *t) { return Traceable_refs(t, NULL, NULL); }

static void Traceable_dealloc(TraceableObject *t) {
    PyObject_GC_UnTrack(t);
    Traceable_clear(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *Traceable_get_extra(PyObject *self, void *closure) { return get_extra(self); }

static int Traceable_set_extra(PyObject *self, PyObject *value, void *closure) {
    TraceableObject *t = AS_T(self);
    Py_XINCREF(value);
    Py_XSETREF(t->extra, value);
    Py_CLEAR(t->raw);
    return 0;
}

/* _pending: read, it holds every update made while nothing recorded. */
static PyObject *Traceable_get_pending(PyObject *self, void *closure) {
    TraceableObject *t = AS_T(self);
    if (t->pend_names && dft_pending_flush(t) < 0)
        return NULL;
    PyObject *p = t->pending ? t->pending : Py_None;
    Py_INCREF(p);
    return p;
}

static int Traceable_set_pending(PyObject *self, PyObject *value, void *closure) {
    TraceableObject *t = AS_T(self);
    Py_CLEAR(t->pend_names);
    for (int k = 0; k < PEND_MAX; k++)
        Py_CLEAR(t->pend_vals[k]);
    Py_XINCREF(value);
    Py_XSETREF(t->pending, value);
    return 0;
}

static PyGetSetDef Traceable_getset[] = {
    {"_extra", Traceable_get_extra, Traceable_set_extra, "the use's own args (an Extra or None)", NULL},
    {"_pending", Traceable_get_pending, Traceable_set_pending,
     "sticky args given while nothing recorded (a dict)", NULL},
    {NULL}};

static PyMemberDef Traceable_members[] = {
    {"_node", T_OBJECT, offsetof(TraceableObject, node), 0, NULL},
    {"_forced", T_OBJECT, offsetof(TraceableObject, forced), 0, NULL},
    {"_on", T_OBJECT, offsetof(TraceableObject, on), 0, NULL},
    {"_sticky", T_OBJECT, offsetof(TraceableObject, sticky), 0, NULL},
    {"_sgen", T_ULONGLONG, offsetof(TraceableObject, sgen), 0, NULL},
    {"_kid", T_UINT, offsetof(TraceableObject, kid), 0, NULL},
    {"_ikid", T_UINT, offsetof(TraceableObject, ikid), 0, NULL},
    {"_bkid", T_UINT, offsetof(TraceableObject, bkid), 0, NULL},
    {"_parent", T_OBJECT, offsetof(TraceableObject, parent), 0, NULL},
    {"_own", T_OBJECT, offsetof(TraceableObject, own), 0, NULL},
    {NULL}};

PyTypeObject dft_TraceableBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.TraceableBase",
    .tp_basicsize = sizeof(TraceableObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "C __call__, __enter__/__exit__ and start()/stop() for dftrace nodes and uses, "
              "with the fields they read.",
    .tp_new = Traceable_new,
    .tp_call = dft_traceable_call,
    .tp_vectorcall_offset = offsetof(TraceableObject, vectorcall),
    .tp_methods = Traceable_methods,
    .tp_members = Traceable_members,
    .tp_getset = Traceable_getset,
    .tp_traverse = (traverseproc)Traceable_refs,
    .tp_clear = (inquiry)Traceable_clear,
    .tp_dealloc = (destructor)Traceable_dealloc,
};

int dft_traceable_ready(void) {
    if (PyType_Ready(&HookType) < 0 || PyType_Ready(&HookDescrType) < 0 ||
        PyType_Ready(&dft_TraceableBaseType) < 0)
        return -1;
    if (PyDict_SetItemString(dft_TraceableBaseType.tp_dict, "__enter__", (PyObject *)&enter_descr) < 0 ||
        PyDict_SetItemString(dft_TraceableBaseType.tp_dict, "__exit__", (PyObject *)&exit_descr) < 0)
        return -1;
    PyType_Modified(&dft_TraceableBaseType);
    return 0;
}

/* The subclasses of TraceableBase defined so far (the tree's, at register()): one
   that keeps the C __call__ is called with vectorcall, as Python 3.12 and later do
   for such classes themselves. */
static int tag_subclasses(PyTypeObject *base) {
    PyObject *subs = PyObject_CallMethod((PyObject *)base, "__subclasses__", NULL);
    if (!subs)
        return -1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(subs); k++) {
        PyTypeObject *tp = (PyTypeObject *)PyList_GET_ITEM(subs, k);
        if (tp->tp_call == dft_traceable_call &&
            tp->tp_vectorcall_offset == offsetof(TraceableObject, vectorcall))
            tp->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
        if (tag_subclasses(tp) < 0) {
            Py_DECREF(subs);
            return -1;
        }
    }
    Py_DECREF(subs);
    return 0;
}

/* The Span start() returns lives until its stop() (node.start() alone: at once):
   a few are kept for the next ones, as for uses. */
static void span_dealloc(PyObject *o) {
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    Py_CLEAR(SLOT_REF(o, dft_slot_obj));
    Py_CLEAR(SLOT_REF(o, dft_slot_stk));
    Py_CLEAR(SLOT_REF(o, dft_slot_id));
    freelist_free(&span_free, o);
    Py_DECREF(tp);
}

int dft_traceable_subclasses(void) {
    if (dft_hooks.span != span_free.type) {
        /* a Span is filled in place: its three slots found */
        PyTypeObject *tp = dft_hooks.span;
        int slots = dft_slot_obj.type == tp && dft_slot_stk.type == tp && dft_slot_id.type == tp &&
                    dft_slot_obj.off >= 0 && dft_slot_stk.off >= 0 && dft_slot_id.off >= 0;
        freelist_serve(&span_free, slots ? tp : NULL, (Py_ssize_t)(sizeof(PyObject) + 3 * sizeof(PyObject *)),
                       span_dealloc);
    }
    if (dft_hooks.use != use_free.type)
        freelist_serve(&use_free, dft_hooks.use, (Py_ssize_t)sizeof(TraceableObject), use_dealloc);
    return tag_subclasses(&dft_TraceableBaseType);
}

/* ------------------------------------------------------------------------- */
/* SpanBase: Span.stop(args=None) for the token start() returned              */

static PyObject *SpanBase_stop(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf), nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    long long t1 = 0;
    PyObject *a = NULL, *stk = NULL, *id = NULL, *obj = NULL, *spans = NULL, *open = NULL, *y = NULL;
    if (n + nk > 1 || (nk == 1 && PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), dft_str_args_kw) != 0))
        goto slow;
    if (n + nk == 1)
        a = args[0];
    if (a == Py_None)
        a = NULL;
    stk = slot_get(self, &dft_slot_stk);
    if (!stk)
        goto slow;
    if (stk == Py_None) { /* stopped already, or nothing was recorded (start() while off) */
        Py_DECREF(stk);
        Py_RETURN_NONE;
    }
    t1 = now_ns();
    id = slot_get(self, &dft_slot_id);
    obj = id ? slot_get(self, &dft_slot_obj) : NULL;
    spans = obj ? open_spans() : NULL;
    if (!spans || !IS_STARTED_MAP(spans))
        goto slow;
    if (!PyList_Check(stk) || PyList_GET_SIZE(stk) < 2 || PyList_GET_ITEM(stk, PyList_GET_SIZE(stk) - 1) != id)
        goto slow;
    open = stk_open(stk);
    if (!open || !IS_KEPT_MAP(open))
        goto slow;
    kept_t *top = kept_on_top(open, stk, obj), k;
    if (!top)
        goto slow;
    if (a) {
        /* args known only now: encoded here (a snapshot), after the use's own */
        PyObject *own = PyDict_CheckExact(a) ? dft_plain_extra(a, 0)
                        : (PyObject *)Py_TYPE(a) == dft_calls.extra_type ? Py_NewRef(a) : NULL;
        if (!own && !PyErr_Occurred())
            own = PyObject_CallOneArg(dft_calls.to_extra, a);
        if (!own)
            goto slow;
        PyObject *base = top->extra;
        y = base == Py_None ? own : PyObject_CallFunctionObjArgs(dft_calls.merge, base, own, NULL);
        if (y != own)
            Py_DECREF(own);
        if (!y)
            goto slow;
    }
    /* encoding the args may have run code: the span must still be on top */
    if (!(top = kept_on_top(open, stk, obj)) || !started_remove(spans, top->span.idv))
        goto slow; /* not open (nothing changed) */
    kept_take_last(open, &k);
    /* stopped: a second stop() does nothing, and the token lets its id go (its .id
       reads None now), so that the id is free for the next span (release_id) */
    if (slot_set(self, &dft_slot_stk, Py_None) < 0 || slot_set(self, &dft_slot_id, Py_None) < 0)
        PyErr_Clear();
    Py_DECREF(id);
    int rc = kept_close(&k, stk, t1, y, NULL);
    Py_XDECREF(y); Py_DECREF(open); Py_DECREF(spans); Py_DECREF(obj); Py_DECREF(stk);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
slow:
    PyErr_Clear();
    Py_XDECREF(y); Py_XDECREF(open); Py_XDECREF(spans); Py_XDECREF(obj); Py_XDECREF(id); Py_XDECREF(stk);
    if (dft_hooks.span_stop_slow == NULL)
        Py_RETURN_NONE;
    return call_slow(dft_hooks.span_stop_slow, self, args, nargsf, kwnames);
}

static PyMethodDef SpanBase_methods[] = {
    {"stop", (PyCFunction)(void (*)(void))SpanBase_stop, METH_FASTCALL | METH_KEYWORDS,
     "stop(args=None): close this span (safe to call twice). args known only at the end "
     "(output shapes, bytes written) are added to the span's args, encoded now."},
    {NULL, NULL, 0, NULL}};

PyTypeObject dft_SpanBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.SpanBase",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "C stop() for the Span tokens start() returns.",
    .tp_new = PyType_GenericNew,
    .tp_methods = SpanBase_methods,
};
