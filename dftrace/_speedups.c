/* Optional C accelerator for dftrace's two hot loops.
 *
 * encode(batch, offset_ns, min_id, fallback, extra_type) -> bytes
 *     Turns raw span records into JSON lines using the byte pieces the Python
 *     encoder prepared for each event kind. Records it does not handle (metadata,
 *     args known only at record time, numbers outside 64 bits) go to `fallback`.
 *
 * SpanWrapper(fn, node, gate, extra, state)
 *     The decorator wrapper: the same algorithm as _recorder.wrap_sync, in C.
 *
 * Everything here has a pure-Python twin; the package works without this module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>
#include <string.h>
#include <stdint.h>
#include <stddef.h>

/* ------------------------------------------------------------------------- */
/* encode                                                                     */

static PyObject *str_tmpl, *str_frag, *str_keys, *str_isdisjoint;

/* kind.tmpl is a tuple whose items 3..5 are (P1, P4, FRAG):
 *   {"id":<i> P1 <tid> ,"ts":<ts> ,"dur":<dur> P4 <level> ,"p_idx":<p> FRAG [extra] }}\n
 * P1 = ,"name":..,"cat":..,"pid":N,"tid":    P4 = ,"ph":"X","args":{"hhash":..,"level":
 */
static int get_ll(PyObject *o, long long *out) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    *out = v;
    return 0;
}

/* One record, its numbers taken out of their Python objects. The byte pieces are
   borrowed: the records (hence their kinds, templates and Extra objects) stay
   alive in the batch for the whole call. */
typedef struct {
    long long i, tid, ts, dur, lvl, p, count;
    const char *p1, *p4, *frag, *xfrag, *line;
    Py_ssize_t n1, n4, nfrag, nxfrag, nline;
    int has_count;
} enc_rec;

static inline char *put(char *o, const char *s, Py_ssize_t n) {
    memcpy(o, s, (size_t)n);
    return o + n;
}

static inline char *put_int(char *o, long long v) {
    char tmp[24];
    int n = 0;
    unsigned long long u;
    if (v < 0) {
        *o++ = '-';
        u = (unsigned long long)(-(v + 1)) + 1;
    } else {
        u = (unsigned long long)v;
    }
    do {
        tmp[n++] = (char)('0' + (u % 10));
        u /= 10;
    } while (u);
    while (n)
        *o++ = tmp[--n];
    return o;
}

#define LIT(s) (s), (Py_ssize_t)(sizeof(s) - 1)

/* Pass 1: numbers and pieces out of the records; records the C loop does not
   handle go through `fallback`, whose bytes are kept in `keep`. Pass 2: format
   everything into one bytes object sized from pass 1. (Releasing the GIL for pass 2
   was measured: a traced thread that never releases the GIL then makes the writer
   wait a whole switch interval to take it back, and end-to-end cost rose ~30%.) */
static PyObject *encode(PyObject *self, PyObject *args) {
    PyObject *batch, *fallback, *extra_type;
    long long off, min_id;
    if (!PyArg_ParseTuple(args, "O!LLOO", &PyList_Type, &batch, &off, &min_id, &fallback, &extra_type))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(batch), m = 0, total = 0;
    enc_rec *recs = PyMem_Malloc(sizeof(enc_rec) * (size_t)(n ? n : 1));
    PyObject *keep = PyList_New(0); /* fallback lines and templates, alive until the end */
    if (!recs || !keep) {
        PyMem_Free(recs);
        Py_XDECREF(keep);
        return PyErr_NoMemory();
    }
    PyObject *last_kind = NULL, *last_tmpl = NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *rec = PyList_GET_ITEM(batch, k);
        PyObject *tmpl = NULL;
        enc_rec *r = &recs[m];
        long long t0, t1;
        memset(r, 0, sizeof(*r));
        if (!PyTuple_CheckExact(rec) || PyTuple_GET_SIZE(rec) != 8)
            goto slow;
        if (PyTuple_GET_ITEM(rec, 0) == last_kind && last_tmpl) {
            tmpl = last_tmpl;
        } else {
            tmpl = PyObject_GetAttr(PyTuple_GET_ITEM(rec, 0), str_tmpl);
            if (!tmpl) {
                PyErr_Clear();
                goto slow;
            }
            int ok = PyTuple_Check(tmpl) && PyTuple_GET_SIZE(tmpl) >= 6 &&
                     PyBytes_Check(PyTuple_GET_ITEM(tmpl, 3)) && PyBytes_Check(PyTuple_GET_ITEM(tmpl, 4)) &&
                     PyBytes_Check(PyTuple_GET_ITEM(tmpl, 5));
            if (ok && PyList_Append(keep, tmpl) < 0)
                ok = 0;
            Py_DECREF(tmpl); /* `keep` holds it now (or it is not usable) */
            if (!ok) {
                PyErr_Clear();
                goto slow;
            }
            last_kind = PyTuple_GET_ITEM(rec, 0);
            last_tmpl = tmpl;
        }
        if (get_ll(PyTuple_GET_ITEM(rec, 1), &t0) || get_ll(PyTuple_GET_ITEM(rec, 2), &t1) ||
            get_ll(PyTuple_GET_ITEM(rec, 3), &r->i) || get_ll(PyTuple_GET_ITEM(rec, 4), &r->p) ||
            get_ll(PyTuple_GET_ITEM(rec, 5), &r->lvl) || get_ll(PyTuple_GET_ITEM(rec, 6), &r->tid))
            goto slow;
        if (r->i <= min_id)
            continue;
        {
            PyObject *x = PyTuple_GET_ITEM(rec, 7);
            if (x == Py_None) {
            } else if (PyLong_CheckExact(x)) {
                if (get_ll(x, &r->count))
                    goto slow;
                r->has_count = 1;
            } else if (Py_TYPE(x) == (PyTypeObject *)extra_type) {
                /* per-use args: only when no key clashes with the kind's static args */
                PyObject *kkeys = PyObject_GetAttr(PyTuple_GET_ITEM(rec, 0), str_keys);
                PyObject *xkeys = kkeys ? PyObject_GetAttr(x, str_keys) : NULL;
                PyObject *dis = xkeys ? PyObject_CallMethodObjArgs(kkeys, str_isdisjoint, xkeys, NULL) : NULL;
                Py_XDECREF(kkeys);
                Py_XDECREF(xkeys);
                int ok = (dis == Py_True);
                Py_XDECREF(dis);
                PyObject *xfrag = ok ? PyObject_GetAttr(x, str_frag) : NULL;
                if (!xfrag || !PyBytes_Check(xfrag) || PyList_Append(keep, xfrag) < 0) {
                    Py_XDECREF(xfrag);
                    PyErr_Clear();
                    goto slow;
                }
                Py_DECREF(xfrag);
                r->xfrag = PyBytes_AS_STRING(xfrag);
                r->nxfrag = PyBytes_GET_SIZE(xfrag);
            } else {
                goto slow;
            }
        }
        r->ts = (t0 + off) / 1000;
        r->dur = (t1 + off) / 1000 - r->ts;
        r->p1 = PyBytes_AS_STRING(PyTuple_GET_ITEM(tmpl, 3));
        r->n1 = PyBytes_GET_SIZE(PyTuple_GET_ITEM(tmpl, 3));
        r->p4 = PyBytes_AS_STRING(PyTuple_GET_ITEM(tmpl, 4));
        r->n4 = PyBytes_GET_SIZE(PyTuple_GET_ITEM(tmpl, 4));
        r->frag = PyBytes_AS_STRING(PyTuple_GET_ITEM(tmpl, 5));
        r->nfrag = PyBytes_GET_SIZE(PyTuple_GET_ITEM(tmpl, 5));
        /* fixed literals 6+6+7+9+3 (+9 with a count) and at most 7 numbers of 20 chars */
        total += 31 + 9 + 7 * 20 + r->n1 + r->n4 + r->nfrag + r->nxfrag;
        m++;
        continue;
    slow:
        memset(r, 0, sizeof(*r));
        {
            PyObject *line = PyObject_CallOneArg(fallback, rec);
            if (!line || (PyBytes_Check(line) && PyList_Append(keep, line) < 0)) {
                Py_XDECREF(line);
                PyMem_Free(recs);
                Py_DECREF(keep);
                return NULL;
            }
            if (PyBytes_Check(line) && PyBytes_GET_SIZE(line)) {
                r->line = PyBytes_AS_STRING(line);
                r->nline = PyBytes_GET_SIZE(line);
                total += r->nline;
                m++;
            }
            Py_DECREF(line);
            /* the fallback may have built templates: look them up afresh */
            last_tmpl = NULL;
            last_kind = NULL;
        }
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) {
        PyMem_Free(recs);
        Py_DECREF(keep);
        return NULL;
    }
    char *o = PyBytes_AS_STRING(out);
    for (Py_ssize_t k = 0; k < m; k++) {
        enc_rec *r = &recs[k];
        if (r->line) {
            o = put(o, r->line, r->nline);
            continue;
        }
        o = put(o, LIT("{\"id\":"));
        o = put_int(o, r->i);
        o = put(o, r->p1, r->n1);
        o = put_int(o, r->tid);
        o = put(o, LIT(",\"ts\":"));
        o = put_int(o, r->ts);
        o = put(o, LIT(",\"dur\":"));
        o = put_int(o, r->dur);
        o = put(o, r->p4, r->n4);
        o = put_int(o, r->lvl);
        o = put(o, LIT(",\"p_idx\":"));
        o = put_int(o, r->p);
        o = put(o, r->frag, r->nfrag);
        if (r->has_count) {
            o = put(o, LIT(",\"count\":"));
            o = put_int(o, r->count);
        }
        if (r->xfrag)
            o = put(o, r->xfrag, r->nxfrag);
        o = put(o, LIT("}}\n"));
    }
    PyMem_Free(recs);
    Py_DECREF(keep);
    Py_ssize_t used = o - PyBytes_AS_STRING(out);
    if (_PyBytes_Resize(&out, used) < 0)
        return NULL;
    return out;
}

/* ------------------------------------------------------------------------- */
/* the shared recorder state the wrappers need                                */

typedef struct {
    PyObject *local;     /* threading.local with .stk */
    PyObject *buffer;    /* the BUFFER list */
    PyObject *resolve;   /* callable() -> Stack */
    PyObject *pressure;  /* callable() */
    PyObject *unwind;    /* callable(stk, i) */
    PyObject *with_error;/* callable(extra, exc) -> extra */
    PyObject *next_id;   /* callable() -> int (itertools.count.__next__) */
    PyObject *slow_exit; /* the Python __exit__ for every case but the common one */
} recstate_t;

static recstate_t R = {0};
static PyObject *str_thread_stk, *str_stk, *str_on, *str_kind, *str_tid, *str_open, *str_extra, *str_node;

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    recstate_t r;
    if (!PyArg_ParseTuple(args, "OO!OOOOOO", &r.local, &PyList_Type, &r.buffer, &r.resolve,
                          &r.pressure, &r.unwind, &r.with_error, &r.next_id, &r.slow_exit))
        return NULL;
    Py_INCREF(r.local); Py_INCREF(r.buffer); Py_INCREF(r.resolve); Py_INCREF(r.pressure);
    Py_INCREF(r.unwind); Py_INCREF(r.with_error); Py_INCREF(r.next_id); Py_INCREF(r.slow_exit);
    Py_XDECREF(R.local); Py_XDECREF(R.buffer); Py_XDECREF(R.resolve); Py_XDECREF(R.pressure);
    Py_XDECREF(R.unwind); Py_XDECREF(R.with_error); Py_XDECREF(R.next_id); Py_XDECREF(R.slow_exit);
    R = r;
    Py_RETURN_NONE;
}

/* record(kind, t0, t1, id, parent, level, tid, extra): append an untracked record. */
static PyObject *record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "record() takes 8 arguments");
        return NULL;
    }
    PyObject *rec = PyTuple_New(8);
    if (!rec)
        return NULL;
    for (Py_ssize_t k = 0; k < 8; k++) {
        Py_INCREF(args[k]);
        PyTuple_SET_ITEM(rec, k, args[k]);
    }
    PyObject_GC_UnTrack(rec);
    int err = PyList_Append(R.buffer, rec);
    Py_DECREF(rec);
    if (err)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *clock_ns(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(now_ns());
}

/* ------------------------------------------------------------------------- */
/* SpanWrapper                                                                */

typedef struct {
    PyObject_HEAD
    PyObject *fn;
    PyObject *node;
    PyObject *gate;
    PyObject *extra;
    PyObject *dict;
    PyObject *weakreflist;
    vectorcallfunc vectorcall;
} SpanWrapper;

/* Append one record (kind, t0, t1, id, parent, level, tid, extra) to the buffer. A
   record never takes part in a reference cycle: it is kept out of the garbage
   collector's sight, or every collection would walk the whole buffer. */
static int append_record(PyObject *kind, long long t0, long long t1, PyObject *id, PyObject *p,
                         Py_ssize_t lvl, PyObject *tid, PyObject *x) {
    PyObject *rec = PyTuple_New(8);
    PyObject *a = PyLong_FromLongLong(t0), *b = PyLong_FromLongLong(t1), *l = PyLong_FromSsize_t(lvl);
    if (!rec || !a || !b || !l) {
        Py_XDECREF(rec); Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(l);
        return -1;
    }
    Py_INCREF(kind); Py_INCREF(id); Py_INCREF(p); Py_INCREF(tid); Py_INCREF(x);
    PyTuple_SET_ITEM(rec, 0, kind);
    PyTuple_SET_ITEM(rec, 1, a);
    PyTuple_SET_ITEM(rec, 2, b);
    PyTuple_SET_ITEM(rec, 3, id);
    PyTuple_SET_ITEM(rec, 4, p);
    PyTuple_SET_ITEM(rec, 5, l);
    PyTuple_SET_ITEM(rec, 6, tid);
    PyTuple_SET_ITEM(rec, 7, x);
    PyObject_GC_UnTrack(rec);
    int err = PyList_Append(R.buffer, rec);
    Py_DECREF(rec);
    return err;
}

static PyObject *span_record(SpanWrapper *w, long long t0, long long t1, PyObject *id, PyObject *p,
                             Py_ssize_t lvl, PyObject *tid, PyObject *extra) {
    PyObject *kind = PyObject_GetAttr(w->node, str_kind);
    int err = kind ? append_record(kind, t0, t1, id, p, lvl, tid, extra) : -1;
    Py_XDECREF(kind);
    if (err)
        return NULL;
    Py_RETURN_NONE;
}

/* The next span id; every 4096 ids, let the writer know how full the buffer is
   (it may make this thread wait when the writer cannot keep up). */
static PyObject *new_id(void) {
    PyObject *id = PyObject_CallNoArgs(R.next_id);
    if (id) {
        long long iv = PyLong_AsLongLong(id);
        if (iv != -1 && (iv & 0xFFF) == 0) {
            PyObject *r = PyObject_CallNoArgs(R.pressure);
            Py_XDECREF(r);
            PyErr_Clear();
        }
    }
    return id;
}

/* Remove span `id` from the top of `stk`; anything left above it is unwound. */
static int stack_pop(PyObject *stk, PyObject *id) {
    Py_ssize_t n = PyList_GET_SIZE(stk);
    if (n > 0 && PyList_GET_ITEM(stk, n - 1) == id)
        return PyList_SetSlice(stk, n - 1, n, NULL);
    PyObject *r = PyObject_CallFunctionObjArgs(R.unwind, stk, id, NULL);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *SpanWrapper_vectorcall(PyObject *self_, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames) {
    SpanWrapper *w = (SpanWrapper *)self_;
    PyObject *on = PyObject_GetAttr(w->gate, str_on);
    if (!on)
        return NULL;
    int is_on = PyObject_IsTrue(on);
    Py_DECREF(on);
    if (is_on <= 0 || R.buffer == NULL)
        return PyObject_Vectorcall(w->fn, args, nargsf, kwnames);

    PyObject *stk = PyObject_GetAttr(R.local, str_stk);
    if (!stk)
        return NULL;
    if (stk == Py_None) {
        Py_DECREF(stk);
        stk = PyObject_CallNoArgs(R.resolve);
        if (!stk)
            return NULL;
    }
    if (!PyList_Check(stk) || PyList_GET_SIZE(stk) == 0) {
        Py_DECREF(stk);
        return PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
    }
    PyObject *id = new_id();
    if (!id) {
        Py_DECREF(stk);
        return NULL;
    }
    Py_ssize_t lvl = PyList_GET_SIZE(stk);
    PyObject *p = PyList_GET_ITEM(stk, lvl - 1);
    Py_INCREF(p);
    PyObject *tid = PyObject_GetAttr(stk, str_tid);
    if (!tid || PyList_Append(stk, id) < 0) {
        Py_XDECREF(tid);
        Py_DECREF(p); Py_DECREF(id); Py_DECREF(stk);
        return NULL;
    }
    long long t0 = now_ns();
    PyObject *result = PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
    long long t1 = now_ns();
    PyObject *extra = w->extra;
    Py_INCREF(extra);
    if (!result) {
        /* record the span with args.error, then let the exception go on unchanged */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyErr_NormalizeException(&et, &ev, &tb);
        if (ev) {
            PyObject *x = PyObject_CallFunctionObjArgs(R.with_error, extra, ev, NULL);
            if (x) {
                Py_DECREF(extra);
                extra = x;
            } else {
                PyErr_Clear();
            }
        }
        if (stack_pop(stk, id) < 0)
            PyErr_Clear();
        PyObject *r = span_record(w, t0, t1, id, p, lvl, tid, extra);
        Py_XDECREF(r);
        PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    } else {
        if (stack_pop(stk, id) < 0)
            PyErr_Clear();
        PyObject *r = span_record(w, t0, t1, id, p, lvl, tid, extra);
        if (!r)
            PyErr_Clear(); /* never let recording break the caller */
        Py_XDECREF(r);
    }
    Py_DECREF(extra);
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

static PyTypeObject SpanWrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._speedups.SpanWrapper",
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
/* TraceableBase: __enter__/__exit__ for nodes and uses                       */

/* asyncio's running loop, or None; asyncio is never imported from here: until the
   program imports it, no loop can be running. */
static PyObject *asyncio_get_running_loop = NULL;

static PyObject *running_loop(void) {
    if (asyncio_get_running_loop == NULL) {
        PyObject *mods = PyImport_GetModuleDict();
        PyObject *aio = mods ? PyDict_GetItemString(mods, "asyncio") : NULL;
        if (aio == NULL)
            Py_RETURN_NONE;
        asyncio_get_running_loop = PyObject_GetAttrString(aio, "_get_running_loop");
        if (asyncio_get_running_loop == NULL) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    }
    return PyObject_CallNoArgs(asyncio_get_running_loop);
}

/* The stack spans of this thread nest on, or NULL (error set) / resolved one. */
static PyObject *current_stack(int *in_loop) {
    PyObject *loop = running_loop();
    if (!loop)
        return NULL;
    *in_loop = (loop != Py_None);
    Py_DECREF(loop);
    PyObject *stk = NULL;
    if (!*in_loop) {
        stk = PyObject_GetAttr(R.local, str_stk);
        if (!stk)
            return NULL;
        if (stk != Py_None)
            return stk;
        Py_DECREF(stk);
    }
    return PyObject_CallNoArgs(R.resolve);
}

/* The entry a with-block or start() leaves in its stack's `open` map:
   (t0, opener, extra, parent id, level), timed now. */
static PyObject *open_entry(PyObject *self, PyObject *extra, PyObject *stk) {
    Py_ssize_t lvl = PyList_GET_SIZE(stk);
    PyObject *t0 = PyLong_FromLongLong(now_ns()), *lv = PyLong_FromSsize_t(lvl);
    PyObject *ent = (t0 && lv) ? PyTuple_New(5) : NULL;
    if (!ent) {
        Py_XDECREF(t0);
        Py_XDECREF(lv);
        return NULL;
    }
    PyObject *par = PyList_GET_ITEM(stk, lvl - 1);
    Py_INCREF(self); Py_INCREF(extra); Py_INCREF(par);
    PyTuple_SET_ITEM(ent, 0, t0);
    PyTuple_SET_ITEM(ent, 1, self);
    PyTuple_SET_ITEM(ent, 2, extra);
    PyTuple_SET_ITEM(ent, 3, par);
    PyTuple_SET_ITEM(ent, 4, lv);
    return ent;
}

static PyObject *Traceable_enter(PyObject *self, PyObject *unused) {
    PyObject *on = PyObject_GetAttr(self, str_on);
    int is_on = on ? PyObject_IsTrue(on) : -1;
    Py_XDECREF(on);
    if (is_on <= 0 || R.buffer == NULL) {
        PyErr_Clear();
        Py_INCREF(self);
        return self;
    }
    int in_loop = 0;
    PyObject *stk = current_stack(&in_loop), *id = NULL, *extra = NULL, *open = NULL, *ent = NULL;
    if (!stk || !PyList_Check(stk) || PyList_GET_SIZE(stk) == 0)
        goto done;
    id = new_id();
    if (!id)
        goto done;
    extra = PyObject_GetAttr(self, str_extra);
    open = extra ? PyObject_GetAttr(stk, str_open) : NULL;
    if (!open || !PyDict_Check(open))
        goto done;
    ent = open_entry(self, extra, stk);
    if (!ent)
        goto done;
    if (PyDict_SetItem(open, id, ent) < 0)
        goto done;
    if (PyList_Append(stk, id) < 0)
        PyDict_DelItem(open, id);
done:
    PyErr_Clear(); /* entering a span never fails the user's with-statement */
    Py_XDECREF(ent);
    Py_XDECREF(open);
    Py_XDECREF(extra);
    Py_XDECREF(id);
    Py_XDECREF(stk);
    Py_INCREF(self);
    return self;
}

static PyObject *Traceable_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long t1 = now_ns();
    PyObject *stk = NULL, *open = NULL, *top, *ent, *node = NULL, *kind = NULL, *tid = NULL;
    if (nargs != 3 || R.buffer == NULL)
        goto slow;
    if (args[1] != Py_None)
        goto slow; /* an exception: let Python tag the span with args.error */
    stk = PyObject_GetAttr(R.local, str_stk);
    if (stk == Py_None) {
        /* A thread that never recorded has nothing to close (unless inside a loop). */
        PyObject *own = PyObject_GetAttr(R.local, str_thread_stk);
        int never = (own == Py_None);
        Py_XDECREF(own);
        if (never) {
            PyObject *loop = running_loop();
            never = (loop == Py_None);
            Py_XDECREF(loop);
            if (never) {
                Py_DECREF(stk);
                Py_RETURN_FALSE;
            }
        }
        goto slow;
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
    open = PyObject_GetAttr(stk, str_open);
    if (!open || !PyDict_Check(open))
        goto slow;
    Py_ssize_t n = PyList_GET_SIZE(stk);
    top = PyList_GET_ITEM(stk, n - 1);
    ent = PyDict_GetItemWithError(open, top);
    if (!ent || !PyTuple_Check(ent) || PyTuple_GET_SIZE(ent) != 5 || PyTuple_GET_ITEM(ent, 1) != self)
        goto slow;
    node = PyObject_GetAttr(self, str_node);
    kind = node ? PyObject_GetAttr(node, str_kind) : NULL;
    tid = kind ? PyObject_GetAttr(stk, str_tid) : NULL;
    if (!tid)
        goto slow;
    {
        PyObject *rec = PyTuple_New(8);
        PyObject *t1o = PyLong_FromLongLong(t1);
        if (!rec || !t1o) {
            Py_XDECREF(rec);
            Py_XDECREF(t1o);
            goto slow;
        }
        Py_INCREF(ent);
        Py_INCREF(top);
        PyTuple_SET_ITEM(rec, 0, kind);
        kind = NULL;
        PyObject *t0 = PyTuple_GET_ITEM(ent, 0), *extra = PyTuple_GET_ITEM(ent, 2),
                 *p = PyTuple_GET_ITEM(ent, 3), *lvl = PyTuple_GET_ITEM(ent, 4);
        Py_INCREF(t0); Py_INCREF(extra); Py_INCREF(p); Py_INCREF(lvl);
        PyTuple_SET_ITEM(rec, 1, t0);
        PyTuple_SET_ITEM(rec, 2, t1o);
        PyTuple_SET_ITEM(rec, 3, top);
        PyTuple_SET_ITEM(rec, 4, p);
        PyTuple_SET_ITEM(rec, 5, lvl);
        PyTuple_SET_ITEM(rec, 6, tid);
        tid = NULL;
        PyTuple_SET_ITEM(rec, 7, extra);
        PyObject_GC_UnTrack(rec);
        int err = PyList_Append(R.buffer, rec);
        Py_DECREF(rec);
        if (PyDict_DelItem(open, top) < 0 || PyList_SetSlice(stk, n - 1, n, NULL) < 0 || err)
            PyErr_Clear();
        Py_DECREF(ent);
    }
    Py_DECREF(node);
    Py_DECREF(open);
    Py_DECREF(stk);
    Py_RETURN_FALSE;
slow:
    PyErr_Clear();
    Py_XDECREF(tid);
    Py_XDECREF(kind);
    Py_XDECREF(node);
    Py_XDECREF(open);
    Py_XDECREF(stk);
    if (R.slow_exit == NULL)
        Py_RETURN_FALSE;
    PyObject *r = PyObject_Vectorcall(R.slow_exit, (PyObject *const[]){self, nargs > 0 ? args[0] : Py_None,
                                          nargs > 1 ? args[1] : Py_None, nargs > 2 ? args[2] : Py_None},
                                      4, NULL);
    if (!r) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

/* start()/stop(): the common calls in C, everything else in Python ---------- */

typedef struct {
    PyObject *state;      /* _recorder.STATE (its open_spans dict is replaced after fork) */
    PyTypeObject *span;   /* _nodes.Span, allocated here and filled through its slots */
    PyObject *no_span;    /* the Span returned when nothing is recorded */
    PyObject *start_slow; /* _Traceable._start_py(self, *args, **kwargs) */
    PyObject *stop_slow;  /* _Traceable._stop_py(self, *args, **kwargs) */
} hookstate_t;

static hookstate_t H = {0};
static PyObject *str_open_spans, *str__obj, *str__token, *str_max_open_spans;

static PyObject *configure_hooks(PyObject *self, PyObject *args) {
    hookstate_t h;
    if (!PyArg_ParseTuple(args, "OO!OOO", &h.state, &PyType_Type, &h.span, &h.no_span,
                          &h.start_slow, &h.stop_slow))
        return NULL;
    Py_INCREF(h.state); Py_INCREF(h.span); Py_INCREF(h.no_span);
    Py_INCREF(h.start_slow); Py_INCREF(h.stop_slow);
    Py_XDECREF(H.state); Py_XDECREF(H.span); Py_XDECREF(H.no_span);
    Py_XDECREF(H.start_slow); Py_XDECREF(H.stop_slow);
    H = h;
    Py_RETURN_NONE;
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

static PyObject *Traceable_start(PyObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) || kwnames || H.span == NULL || R.buffer == NULL)
        return call_slow(H.start_slow, self, args, nargsf, kwnames);
    PyObject *on = PyObject_GetAttr(self, str_on);
    int is_on = on ? PyObject_IsTrue(on) : -1;
    Py_XDECREF(on);
    if (is_on <= 0) {
        PyErr_Clear();
        Py_INCREF(H.no_span);
        return H.no_span;
    }
    int in_loop = 0;
    PyObject *stk = current_stack(&in_loop), *id = NULL, *extra = NULL, *open = NULL, *ent = NULL,
             *spans = NULL, *token = NULL, *span = NULL;
    if (!stk || !PyList_Check(stk) || PyList_GET_SIZE(stk) == 0)
        goto fail;
    id = new_id();
    if (!id)
        goto fail;
    extra = PyObject_GetAttr(self, str_extra);
    open = extra ? PyObject_GetAttr(stk, str_open) : NULL;
    spans = open ? PyObject_GetAttr(H.state, str_open_spans) : NULL;
    if (!spans || !PyDict_Check(open) || !PyDict_Check(spans))
        goto fail;
    if (PyDict_GET_SIZE(spans) >= 16) { /* 16: the least max_open_spans accepts */
        PyObject *lim = PyObject_GetAttr(H.state, str_max_open_spans);
        Py_ssize_t limit = lim ? PyLong_AsSsize_t(lim) : -1;
        Py_XDECREF(lim);
        PyErr_Clear();
        if (limit >= 0 && PyDict_GET_SIZE(spans) >= limit) { /* Python refuses and counts */
            Py_DECREF(spans); Py_DECREF(open); Py_DECREF(extra); Py_DECREF(id); Py_DECREF(stk);
            return call_slow(H.start_slow, self, args, nargsf, kwnames);
        }
    }
    ent = open_entry(self, extra, stk);
    if (!ent)
        goto fail;
    token = PyTuple_Pack(2, stk, id);
    span = token ? H.span->tp_alloc(H.span, 0) : NULL;
    if (!span || PyObject_SetAttr(span, str__obj, self) < 0 ||
        PyObject_SetAttr(span, str__token, token) < 0)
        goto fail;
    if (PyDict_SetItem(open, id, ent) < 0)
        goto fail;
    if (PyList_Append(stk, id) < 0 || PyDict_SetItem(spans, id, stk) < 0) {
        PyDict_DelItem(open, id);
        goto fail;
    }
    Py_DECREF(token); Py_DECREF(ent); Py_DECREF(spans); Py_DECREF(open); Py_DECREF(extra);
    Py_DECREF(id); Py_DECREF(stk);
    return span;
fail:
    PyErr_Clear(); /* never fail the caller: nothing was recorded */
    Py_XDECREF(span); Py_XDECREF(token); Py_XDECREF(ent); Py_XDECREF(spans); Py_XDECREF(open);
    Py_XDECREF(extra); Py_XDECREF(id); Py_XDECREF(stk);
    Py_INCREF(H.no_span);
    return H.no_span;
}

static PyObject *Traceable_stop(PyObject *self, PyObject *const *args, size_t nargsf,
                                PyObject *kwnames) {
    long long t1 = now_ns();
    PyObject *stk = NULL, *open = NULL, *spans = NULL, *node = NULL, *kind = NULL, *tid = NULL;
    if (PyVectorcall_NARGS(nargsf) || kwnames || H.span == NULL || R.buffer == NULL)
        goto slow;
    spans = PyObject_GetAttr(H.state, str_open_spans);
    if (!spans || !PyDict_Check(spans))
        goto slow;
    if (PyDict_GET_SIZE(spans) == 0) {
        /* nothing open anywhere: done, unless tracing is on (then Python warns once) */
        PyObject *on = PyObject_GetAttr(self, str_on);
        int is_on = on ? PyObject_IsTrue(on) : 1;
        Py_XDECREF(on);
        if (is_on == 0) {
            Py_DECREF(spans);
            Py_RETURN_NONE;
        }
        goto slow;
    }
    /* The common case: the innermost span on this thread's stack is our start(). */
    stk = PyObject_GetAttr(R.local, str_stk);
    if (!stk || stk == Py_None || !PyList_Check(stk) || PyList_GET_SIZE(stk) < 2)
        goto slow;
    open = PyObject_GetAttr(stk, str_open);
    if (!open || !PyDict_Check(open))
        goto slow;
    Py_ssize_t n = PyList_GET_SIZE(stk);
    PyObject *top = PyList_GET_ITEM(stk, n - 1);
    PyObject *ent = PyDict_GetItemWithError(open, top);
    if (!ent || !PyTuple_Check(ent) || PyTuple_GET_SIZE(ent) != 5 || PyTuple_GET_ITEM(ent, 1) != self)
        goto slow;
    int has = PyDict_Contains(spans, top);
    if (has != 1)
        goto slow;
    node = PyObject_GetAttr(self, str_node);
    kind = node ? PyObject_GetAttr(node, str_kind) : NULL;
    tid = kind ? PyObject_GetAttr(stk, str_tid) : NULL;
    if (!tid)
        goto slow;
    Py_INCREF(ent);
    Py_INCREF(top);
    long long t0 = PyLong_AsLongLong(PyTuple_GET_ITEM(ent, 0));
    Py_ssize_t lvl = PyLong_AsSsize_t(PyTuple_GET_ITEM(ent, 4));
    if (PyDict_DelItem(spans, top) < 0 || PyDict_DelItem(open, top) < 0 ||
        PyList_SetSlice(stk, n - 1, n, NULL) < 0 ||
        append_record(kind, t0, t1, top, PyTuple_GET_ITEM(ent, 3), lvl, tid, PyTuple_GET_ITEM(ent, 2)) < 0)
        PyErr_Clear();
    Py_DECREF(top);
    Py_DECREF(ent);
    Py_DECREF(tid); Py_DECREF(kind); Py_DECREF(node); Py_DECREF(spans); Py_DECREF(open);
    Py_DECREF(stk);
    Py_RETURN_NONE;
slow:
    PyErr_Clear();
    Py_XDECREF(tid); Py_XDECREF(kind); Py_XDECREF(node); Py_XDECREF(spans); Py_XDECREF(open);
    Py_XDECREF(stk);
    if (H.stop_slow == NULL)
        Py_RETURN_NONE;
    return call_slow(H.stop_slow, self, args, nargsf, kwnames);
}

static PyMethodDef Traceable_methods[] = {
    {"__enter__", Traceable_enter, METH_NOARGS, "Open a span of this node (nothing when off)."},
    {"__exit__", (PyCFunction)(void (*)(void))Traceable_exit, METH_FASTCALL,
     "Close the span opened by __enter__; exceptions propagate unchanged."},
    {"start", (PyCFunction)(void (*)(void))Traceable_start, METH_FASTCALL | METH_KEYWORDS,
     "start(metadata=False) -> Span: open a span closed by a later stop() (hook style). "
     "With metadata=True write a CM event <name>.start with the time instead."},
    {"stop", (PyCFunction)(void (*)(void))Traceable_stop, METH_FASTCALL | METH_KEYWORDS,
     "stop(span=None, metadata=False): close the span from start() (the innermost open "
     "one of this node on the caller's thread/task, or `span`)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject TraceableBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._speedups.TraceableBase",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "C __enter__/__exit__ for dftrace nodes.",
    .tp_new = PyType_GenericNew,
    .tp_methods = Traceable_methods,
};

/* ------------------------------------------------------------------------- */
/* SpanIter: .iter() — per item a <leaf>.iter span and a <leaf>.block span     */

typedef struct {
    PyObject_HEAD
    PyObject *it;      /* the source iterator (NULL once exhausted/closed) */
    PyObject *node;
    PyObject *gate;
    PyObject *extra;   /* Extra or None */
    long long count;
    /* the open block span */
    int block_open;
    PyObject *bstk, *bid, *bp, *btid, *bx;
    Py_ssize_t blvl;
    long long bt0;
} SpanIter;

static PyObject *str_iter_kind, *str_block_kind, *str_args;

static PyObject *count_extra(SpanIter *s) {
    if (s->extra == Py_None)
        return PyLong_FromLongLong(s->count);
    /* per-use args plus the count: a dict the encoder merges */
    PyObject *args = PyObject_GetAttr(s->extra, str_args);
    PyObject *d = args ? PyDict_Copy(args) : NULL;
    Py_XDECREF(args);
    if (!d)
        return NULL;
    PyObject *c = PyLong_FromLongLong(s->count);
    if (!c || PyDict_SetItemString(d, "count", c) < 0) {
        Py_XDECREF(c);
        Py_DECREF(d);
        return NULL;
    }
    Py_DECREF(c);
    return d;
}


static void close_block(SpanIter *s, long long t2) {
    if (!s->block_open)
        return;
    s->block_open = 0;
    if (stack_pop(s->bstk, s->bid) < 0)
        PyErr_Clear();
    PyObject *kind = PyObject_GetAttr(s->node, str_block_kind);
    if (!kind || append_record(kind, s->bt0, t2, s->bid, s->bp, s->blvl, s->btid, s->bx) < 0)
        PyErr_Clear();
    Py_XDECREF(kind);
    Py_CLEAR(s->bstk);
    Py_CLEAR(s->bid);
    Py_CLEAR(s->bp);
    Py_CLEAR(s->btid);
    Py_CLEAR(s->bx);
}

static PyObject *SpanIter_next(SpanIter *s) {
    long long now = now_ns();
    close_block(s, now);
    if (s->it == NULL)
        return NULL;
    PyObject *on = PyObject_GetAttr(s->gate, str_on);
    int is_on = on ? PyObject_IsTrue(on) : 0;
    Py_XDECREF(on);
    PyErr_Clear();
    if (!is_on || R.buffer == NULL) {
        PyObject *item = PyIter_Next(s->it);
        if (item)
            s->count++;
        else
            Py_CLEAR(s->it);
        return item;
    }
    int in_loop = 0;
    PyObject *stk = current_stack(&in_loop);
    if (!stk || !PyList_Check(stk) || PyList_GET_SIZE(stk) == 0) {
        Py_XDECREF(stk);
        PyErr_Clear();
        PyObject *item = PyIter_Next(s->it);
        if (item)
            s->count++;
        else
            Py_CLEAR(s->it);
        return item;
    }
    PyObject *id = new_id();
    PyObject *tid = id ? PyObject_GetAttr(stk, str_tid) : NULL;
    if (!tid) {
        Py_XDECREF(id);
        Py_DECREF(stk);
        return NULL;
    }
    Py_ssize_t lvl = PyList_GET_SIZE(stk);
    PyObject *p = PyList_GET_ITEM(stk, lvl - 1);
    Py_INCREF(p);
    if (PyList_Append(stk, id) < 0) {
        Py_DECREF(p); Py_DECREF(tid); Py_DECREF(id); Py_DECREF(stk);
        return NULL;
    }
    long long t0 = now_ns();
    PyObject *item = PyIter_Next(s->it);
    long long t1 = now_ns();
    if (stack_pop(stk, id) < 0)
        PyErr_Clear();
    PyObject *x = NULL;
    if (item == NULL) {
        Py_CLEAR(s->it);
        if (PyErr_Occurred()) {
            /* the source raised: record the .iter span with args.error, re-raise */
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            PyErr_NormalizeException(&et, &ev, &tb);
            x = PyObject_CallFunctionObjArgs(R.with_error, s->extra, ev ? ev : Py_None, NULL);
            PyObject *kind = x ? PyObject_GetAttr(s->node, str_iter_kind) : NULL;
            if (!kind || append_record(kind, t0, t1, id, p, lvl, tid, x) < 0)
                PyErr_Clear();
            Py_XDECREF(kind);
            Py_XDECREF(x);
            PyErr_Restore(et, ev, tb);
        }
        Py_DECREF(p); Py_DECREF(tid); Py_DECREF(id); Py_DECREF(stk);
        return NULL;
    }
    s->count++;
    x = count_extra(s);
    PyObject *kind = x ? PyObject_GetAttr(s->node, str_iter_kind) : NULL;
    if (!kind || append_record(kind, t0, t1, id, p, lvl, tid, x) < 0)
        PyErr_Clear();
    Py_XDECREF(kind);
    Py_DECREF(id);
    /* the loop body's span: open until the next call (or close/dealloc) */
    PyObject *bid = PyObject_CallNoArgs(R.next_id);
    if (bid && PyList_Append(stk, bid) == 0 && x) {
        s->block_open = 1;
        s->bstk = stk;
        s->bid = bid;
        s->bp = p;
        s->btid = tid;
        s->bx = x;
        s->blvl = lvl;
        s->bt0 = t1;
        return item;
    }
    PyErr_Clear();
    Py_XDECREF(bid);
    Py_XDECREF(x);
    Py_DECREF(p);
    Py_DECREF(tid);
    Py_DECREF(stk);
    return item;
}

static PyObject *SpanIter_close(SpanIter *s, PyObject *unused) {
    close_block(s, now_ns());
    Py_CLEAR(s->it);
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
    return (PyObject *)s;
}

static int SpanIter_traverse(SpanIter *s, visitproc visit, void *arg) {
    Py_VISIT(s->it); Py_VISIT(s->node); Py_VISIT(s->gate); Py_VISIT(s->extra);
    Py_VISIT(s->bstk); Py_VISIT(s->bid); Py_VISIT(s->bp); Py_VISIT(s->btid); Py_VISIT(s->bx);
    return 0;
}

static int SpanIter_clear(SpanIter *s) {
    Py_CLEAR(s->it); Py_CLEAR(s->node); Py_CLEAR(s->gate); Py_CLEAR(s->extra);
    Py_CLEAR(s->bstk); Py_CLEAR(s->bid); Py_CLEAR(s->bp); Py_CLEAR(s->btid); Py_CLEAR(s->bx);
    s->block_open = 0;
    return 0;
}

static void SpanIter_dealloc(SpanIter *s) {
    PyObject_GC_UnTrack(s);
    if (s->block_open && s->node) {
        /* a loop left with break or an exception: close the body's span now */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        close_block(s, now_ns());
        PyErr_Restore(et, ev, tb);
    }
    SpanIter_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef SpanIter_methods[] = {
    {"close", (PyCFunction)SpanIter_close, METH_NOARGS, "Stop iterating; close the open span."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject SpanIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._speedups.SpanIter",
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

/* ------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"encode", encode, METH_VARARGS, "encode(batch, offset_ns, min_id, fallback, extra_type) -> bytes"},
    {"configure", configure, METH_VARARGS, "configure(local, buffer, resolve, pressure, unwind, with_error, next_id)"},
    {"configure_hooks", configure_hooks, METH_VARARGS, "configure_hooks(state, span_type, no_span, start_slow, stop_slow)"},
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL, "record(kind, t0, t1, id, parent, level, tid, extra): append one record"},
    {"clock_ns", clock_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns (the clock of time.perf_counter_ns)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_speedups",
                                       "C accelerators for dftrace's hot paths.", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
#define INTERN(v, s) if (!(v = PyUnicode_InternFromString(s))) return NULL
    INTERN(str_tmpl, "tmpl");
    INTERN(str_frag, "frag");
    INTERN(str_keys, "keys");
    INTERN(str_isdisjoint, "isdisjoint");
    INTERN(str_stk, "stk");
    INTERN(str_thread_stk, "thread_stk");
    INTERN(str_on, "_on");
    INTERN(str_kind, "_kind");
    INTERN(str_tid, "tid");
    INTERN(str_open, "open");
    INTERN(str_extra, "_extra");
    INTERN(str_node, "_node");
    INTERN(str_iter_kind, "_iter_kind");
    INTERN(str_block_kind, "_block_kind");
    INTERN(str_args, "args");
    INTERN(str_open_spans, "open_spans");
    INTERN(str_max_open_spans, "max_open_spans");
    INTERN(str__obj, "_obj");
    INTERN(str__token, "_token");
#undef INTERN
    if (PyType_Ready(&SpanWrapperType) < 0 || PyType_Ready(&TraceableBaseType) < 0 ||
        PyType_Ready(&SpanIterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&SpanWrapperType);
    if (PyModule_AddObject(m, "SpanWrapper", (PyObject *)&SpanWrapperType) < 0) {
        Py_DECREF(&SpanWrapperType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&SpanIterType);
    if (PyModule_AddObject(m, "SpanIter", (PyObject *)&SpanIterType) < 0) {
        Py_DECREF(&SpanIterType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&TraceableBaseType);
    if (PyModule_AddObject(m, "TraceableBase", (PyObject *)&TraceableBaseType) < 0) {
        Py_DECREF(&TraceableBaseType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
