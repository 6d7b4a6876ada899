/* spans.h: spans.c's side, the stack spans nest on (this thread's, without a
 * threading.local lookup, or the asyncio task's), NVTX ranges, and the span styles
 * SpanWrapper (the decorator) and SpanIter (.iter()). */
#ifndef DFTRACE_SPANS_H
#define DFTRACE_SPANS_H

#include "common.h"
#include "module.h"

DFT_HIDDEN_BEGIN

/* ------------------------------------------------------------------------- */
/* This thread's stack without a threading.local lookup                        */

/* LOCAL.stk as this thread last read it, with the stack's tid and open map (both
   fixed for a stack's life). Borrowed references: LOCAL holds the stack for the
   thread state that read it. Valid while that thread state is the current one
   (its id is never reused) and no LOCAL.stk was assigned since (Python calls
   stacks_changed() at every assignment, which moves stack_epoch). Used only when
   LOCAL is a real threading.local: a greenlet-local one is per greenlet. */
typedef struct {
    unsigned long long tsid, epoch;
    PyObject *stk, *tid, *open;
} stack_cache_t;
extern THREAD_LOCAL stack_cache_t dft_stack_cache;
extern unsigned long long dft_stack_epoch;

/* Every thread reads its LOCAL.stk again (one was assigned, or a fork). */
void dft_stacks_forget(void);
/* LOCAL was registered: `usable` when it is a real threading.local, whose stacks may
   be cached (a greenlet-local one is per greenlet); then as dft_stacks_forget. */
void dft_stack_cache_allow(int usable);
/* LOCAL.stk read (the cache missed), and cached where it can be; as local_stk. */
PyObject *dft_local_stk_read(void);

static inline int cache_valid(void) {
    return dft_stack_cache.stk && dft_stack_cache.epoch == dft_stack_epoch &&
           dft_stack_cache.tsid == PyThreadState_Get()->id;
}

/* New reference to LOCAL.stk (None: ask resolve()); NULL with an error. */
static inline PyObject *local_stk(void) {
    if (cache_valid()) {
        Py_INCREF(dft_stack_cache.stk);
        return dft_stack_cache.stk;
    }
    return dft_local_stk_read();
}

/* New references to a stack's tid / open map. */
static inline PyObject *stk_tid(PyObject *stk) {
    if (stk == dft_stack_cache.stk && cache_valid()) {
        Py_INCREF(dft_stack_cache.tid);
        return dft_stack_cache.tid;
    }
    return PyObject_GetAttr(stk, dft_str_tid);
}

static inline PyObject *stk_open(PyObject *stk) {
    if (stk == dft_stack_cache.stk && cache_valid()) {
        Py_INCREF(dft_stack_cache.open);
        return dft_stack_cache.open;
    }
    return PyObject_GetAttr(stk, dft_str_open);
}

/* Drop the top of a non-empty stack (a list keeps its allocation when it shrinks). */
static inline int drop_top(PyObject *stk) {
    Py_ssize_t n = PyList_GET_SIZE(stk);
    PyObject *top = PyList_GET_ITEM(stk, n - 1);
    Py_SET_SIZE(stk, n - 1);
    Py_DECREF(top);
    return 0;
}

/* Remove span `id` from the top of `stk`; anything left above it is unwound. */
static inline int stack_pop(PyObject *stk, PyObject *id, long long t) {
    Py_ssize_t n = PyList_GET_SIZE(stk);
    if (n > 0 && PyList_GET_ITEM(stk, n - 1) == id)
        return drop_top(stk);
    PyObject *at = PyLong_FromLongLong(t);
    if (!at)
        return -1;
    PyObject *r = PyObject_CallFunctionObjArgs(dft_calls.unwind, stk, id, at, NULL);
    Py_DECREF(at);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* asyncio's running loop, or None; asyncio is never imported from here: until the
   program imports it, no loop can be running. Until then sys.modules is searched for
   it only when its size changed since the last search (an import adds entries). */
extern PyObject *dft_asyncio_get_running_loop;
extern PyObject *dft_modules_seen; /* sys.modules when asyncio was last not in it */
extern Py_ssize_t dft_modules_seen_size;

static inline PyObject *running_loop(void) {
    if (dft_asyncio_get_running_loop == NULL) {
        PyObject *mods = PyImport_GetModuleDict();
        if (mods == dft_modules_seen && PyDict_GET_SIZE(mods) == dft_modules_seen_size)
            Py_RETURN_NONE;
        PyObject *aio = mods ? PyDict_GetItemWithError(mods, dft_str_asyncio) : NULL;
        if (aio == NULL) {
            PyErr_Clear();
            if (mods && PyDict_Check(mods)) {
                dft_modules_seen = mods;
                dft_modules_seen_size = PyDict_GET_SIZE(mods);
            }
            Py_RETURN_NONE;
        }
        dft_asyncio_get_running_loop = PyObject_GetAttrString(aio, "_get_running_loop");
        if (dft_asyncio_get_running_loop == NULL) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    }
    return PyObject_CallNoArgs(dft_asyncio_get_running_loop);
}

/* The stack of the asyncio task running on `loop` where it has one of its own already
   (its context holds it, and its owner is the task: a task made by another inherits
   its maker's context), as a new reference; NULL with no error set otherwise, and
   resolve() makes it (or finds a loop callback's thread stack). Inside a loop
   LOCAL.stk is None: resolve() set it so when it made the task's stack. */
PyObject *dft_task_stack(PyObject *loop);

/* The stack spans of this thread (or asyncio task) nest on; NULL with an error. */
static inline PyObject *current_stack(void) {
    PyObject *loop = running_loop();
    if (!loop)
        return NULL;
    if (loop == Py_None) {
        Py_DECREF(loop);
        PyObject *stk = local_stk();
        if (!stk)
            return NULL;
        if (stk != Py_None)
            return stk;
        Py_DECREF(stk);
    } else {
        PyObject *stk = dft_task_stack(loop);
        Py_DECREF(loop);
        if (stk)
            return stk;
    }
    return PyObject_CallNoArgs(dft_calls.resolve);
}

/* ------------------------------------------------------------------------- */
/* NVTX ranges (nvtx=True): each span also opens one, through nvtx_ranges.py    */


/* Off, a span pays one predictable branch on this flag: NVTX_OPEN / NVTX_CLOSE. */
extern int dft_nvtx_on;
void dft_nvtx_open(uint32_t kid, PyObject *id, PyObject *stk, int pairs);
void dft_nvtx_close(PyObject *id);

#define NVTX_OPEN(kid, id, stk, pairs) \
    do { if (unlikely(dft_nvtx_on)) dft_nvtx_open((kid), (id), (stk), (pairs)); } while (0)
#define NVTX_CLOSE(id) \
    do { if (unlikely(dft_nvtx_on)) dft_nvtx_close(id); } while (0)

/* ------------------------------------------------------------------------- */
/* the span styles of spans.c                                                  */

uint32_t dft_node_kid(PyObject *node, PyObject *name);
extern PyTypeObject dft_SpanWrapperType, dft_SpanIterType;

/* The module's functions of spans.c (set_nvtx, stacks_changed, ...). */
extern PyMethodDef dft_spans_methods[];

DFT_HIDDEN_END
#endif /* DFTRACE_SPANS_H */
