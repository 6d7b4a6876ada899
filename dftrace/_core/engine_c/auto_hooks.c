/* auto_hooks.c: what automatic tracing of an un-annotated PyTorch program
 * (dftrace/torch/_auto.py, auto=True) runs per training step, in C:
 *
 * - AutoState: the optimizer steps taken, the loader being iterated and the
 *   training loader, this step's args ({"step": n[, "epoch": e]}); its step_pre /
 *   step_post methods are the optimizer step hooks (a compute.step span per step);
 * - AutoCall: a call of a model's forward() or of torch.autograd.backward recorded
 *   as a compute.forward / compute.backward span;
 * - AutoFetches: a DataLoader's iterator, a dataloader.fetch span per batch.
 *
 * Each one records nothing while an integration stands down (`down`), while its
 * node is off, or while you recorded it yourself: a span of its category open on
 * the calling thread (asked of _auto.py's covered() only when the stack holds more
 * than its base; an un-annotated program never asks). Their Python twins are
 * _auto.py's, run by the pure-Python engine. */
#include "auto_hooks.h"
#include "span_lifecycle.h"
#include "encoder.h"
#include <structmember.h>

DFT_HIDDEN_BEGIN

#define MAX_ROOTS 8

/* How many backward calls open at once (threads, nesting) a finalize can give their step's args. */
#define OPEN_BACKWARDS 4

typedef struct {
    PyObject_HEAD
    long long steps;     /* optimizer steps taken */
    long long down;      /* integrations training now (they record the same) */
    long long current;   /* id() of the loader iterated last (0: none) */
    long long training;  /* id() of the training loader, or until then the first one's */
    int fixed;           /* training is the loader iterated at the first optimizer step */
    long long epoch;     /* how many times `current` was iterated before */
    /* the training loader's epochs: the first of its own is `shift` (a loader made
       anew for each epoch continues its predecessor's count), its latest
       `train_epoch`; `ended`: that iteration ran to its end */
    long long shift, train_epoch;
    int ended;
    int current_ended; /* `current`'s iteration ended (an evaluation's, run or left): it is not adopted */
    /* an optimizer stepped while a loader is iterated: the step is counted at the next
       batch fetched (a second optimizer stepping meanwhile, a GAN's, is the same
       step), or when `stepped` (compared only) steps again first */
    int pending;
    PyObject *stepped;
    /* with no loader: the optimizer whose steps count (the first; another that steps
       twice in a row, the optimizer of a new phase, takes over), and the one before
       (both compared only) */
    PyObject *counting, *last_opt;
    PyObject *pos;       /* this step's args: a dict {"step": n[, "epoch": e]} */
    PyObject *pos_x;     /* ... encoded (an Extra) */
    PyObject *covered;   /* covered(category) -> bool: you recorded it yourself */
    PyObject *grad_enabled; /* torch.is_grad_enabled */
    PyObject *fetch, *step; /* the nodes */
    uint32_t fetch_kid;
    PyObject *fetch_end;  /* the node of the wait for a loader's end (NULL: not recorded) */
    PyObject *ended_cb;   /* ended_cb(loader_id, t1, batches): a loader's iteration ran to its end (NULL: none) */
    /* evaluated_cb(t0, t1): a root's forward in eval mode between an optimizer step and
       the next batch (an evaluation over tensors at hand); evaluation_over_cb(): the
       step after such forwards begins (NULL: none) */
    PyObject *evaluated_cb, *evaluation_over_cb;
    int evaluating;
    uint32_t fetch_end_kid;
    PyObject *cat_data, *cat_compute; /* "dataloader", "compute" */
    PyObject *step_taken; /* called after each optimizer step while set (root discovery) */
    PyObject *after_step; /* called after each optimizer step while set (a loader's start held) */
    long long optimizer_steps; /* every optimizer step taken (the hooks' own or not) */
    uint32_t step_kid;
    /* the open compute.step span, on step_stk, its optimizer and thread */
    int step_open;
    span_t step_sp;
    PyObject *step_stk;
    PyObject *step_opt;   /* borrowed: compared only */
    uint64_t step_ts;
    /* the step span's own args ({"optimizer": name}) for an optimizer type */
    PyObject *sargs_type, *sargs;
    /* an open forward on this thread: nested calls of a root are not spans */
    uint64_t fwd_ts;
    long fwd_depth;
    /* the ids of the backward spans open now (a finalize writes them with this step's args) */
    unsigned long long bwd_open[OPEN_BACKWARDS];
} AutoState;

static PyTypeObject AutoStateType;

/* ------------------------------------------------------------------------- */
/* the position: this step's args                                              */

static PyObject *str_step, *str_epoch, *str_count, *str_module, *str_optimizer, *str_training, *str_name;

/* The args of this step, made anew (the step or the loader changed). */
static int moved(AutoState *st) {
    PyObject *d = PyDict_New(), *v = NULL;
    if (!d)
        return -1;
    v = PyLong_FromLongLong(st->steps);
    if (!v || PyDict_SetItem(d, str_step, v) < 0)
        goto fail;
    Py_CLEAR(v);
    if (st->training && st->current == st->training) {
        v = PyLong_FromLongLong(st->epoch + st->shift);
        if (!v || PyDict_SetItem(d, str_epoch, v) < 0)
            goto fail;
        Py_CLEAR(v);
    }
    PyObject *x = dft_plain_extra(d, 1);
    if (!x) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "step args not encoded");
        goto fail;
    }
    Py_XSETREF(st->pos, d);
    Py_XSETREF(st->pos_x, x);
    return 0;
fail:
    Py_XDECREF(v);
    Py_DECREF(d);
    return -1;
}

/* {key: value}, encoded. */
static PyObject *one_arg(PyObject *key, PyObject *value) {
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    PyObject *x = PyDict_SetItem(d, key, value) < 0 ? NULL : dft_plain_extra(d, 1);
    Py_DECREF(d);
    if (!x && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "args not encoded");
    return x;
}

/* The span carries this step's args: they join the sticky args it opened with (a
   span's sticky args are written before its own). */
static void give_position(AutoState *st, span_t *sp) {
    if (!st->pos_x)
        return;
    if (sp->sticky == Py_None) {
        Py_SETREF(sp->sticky, Py_NewRef(st->pos_x));
        return;
    }
    PyObject *j = PyObject_CallFunctionObjArgs(dft_calls.merge, sp->sticky, st->pos_x, NULL);
    if (j)
        Py_SETREF(sp->sticky, j);
    else
        PyErr_Clear();
}

static inline uint64_t thread_id(void) { return (uint64_t)PyThreadState_Get()->id; }

/* Whether to record on this thread now: 1 with *stk_out (a new reference), 0 not
   (nothing held), never an error (one is cleared: the caller goes on untraced). */
static int may_record(AutoState *st, PyObject *node, PyObject *category, PyObject **stk_out) {
    *stk_out = NULL;
    if (st->down || dft_calls.local == NULL)
        return 0;
    int on = is_on(node);
    if (on <= 0) {
        PyErr_Clear();
        return 0;
    }
    PyObject *stk = current_stack();
    if (!stk || !PyList_Check(stk) || PyList_GET_SIZE(stk) == 0) {
        PyErr_Clear();
        Py_XDECREF(stk);
        return 0;
    }
    if (PyList_GET_SIZE(stk) > 1 && st->covered) { /* something of yours is open */
        PyObject *r = PyObject_CallOneArg(st->covered, category);
        int yes = r ? PyObject_IsTrue(r) : 1;
        Py_XDECREF(r);
        if (yes) {
            PyErr_Clear();
            Py_DECREF(stk);
            return 0;
        }
    }
    *stk_out = stk;
    return 1;
}

/* ------------------------------------------------------------------------- */
/* AutoState                                                                  */

static PyObject *AutoState_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"fetch", "step", "covered", "grad_enabled", "fetch_end", "iteration_ended",
                         "evaluated", "evaluation_over", NULL};
    PyObject *fetch, *step, *covered, *grad, *fetch_end = NULL, *ended = NULL, *evaluated = NULL, *over = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO|OOOO", kw, &fetch, &step, &covered, &grad, &fetch_end,
                                     &ended, &evaluated, &over))
        return NULL;
    AutoState *st = (AutoState *)type->tp_alloc(type, 0);
    if (!st)
        return NULL;
    st->fetch = Py_NewRef(fetch);
    st->step = Py_NewRef(step);
    st->covered = Py_NewRef(covered);
    st->grad_enabled = Py_NewRef(grad);
    st->fetch_kid = dft_node_kid(fetch, dft_str_kid);
    if (ended && ended != Py_None)
        st->ended_cb = Py_NewRef(ended);
    if (evaluated && evaluated != Py_None && over && over != Py_None) {
        st->evaluated_cb = Py_NewRef(evaluated);
        st->evaluation_over_cb = Py_NewRef(over);
    }
    if (fetch_end && fetch_end != Py_None) {
        st->fetch_end = Py_NewRef(fetch_end);
        st->fetch_end_kid = dft_node_kid(fetch_end, dft_str_kid);
    }
    st->step_kid = dft_node_kid(step, dft_str_kid);
    st->cat_data = PyUnicode_InternFromString("dataloader");
    st->cat_compute = PyUnicode_InternFromString("compute");
    if (!st->cat_data || !st->cat_compute || moved(st) < 0) {
        Py_DECREF(st);
        return NULL;
    }
    return (PyObject *)st;
}

static int AutoState_refs(AutoState *st, visitproc visit, void *arg) {
    PyObject **const refs[] = {&st->pos, &st->pos_x, &st->covered, &st->grad_enabled, &st->fetch,
                               &st->fetch_end, &st->ended_cb, &st->evaluated_cb, &st->evaluation_over_cb, &st->step, &st->cat_data, &st->cat_compute, &st->step_taken, &st->after_step,
                               &st->step_stk, &st->sargs_type, &st->sargs};
    return visit_refs(refs, NREFS(refs), visit, arg);
}

static int AutoState_clear(AutoState *st) { return AutoState_refs(st, NULL, NULL); }

static void AutoState_dealloc(AutoState *st) {
    PyObject_GC_UnTrack(st);
    AutoState_clear(st);
    Py_TYPE(st)->tp_free((PyObject *)st);
}

/* begin(loader_id, epoch): a loader's iteration begins; it is the current one. */
static PyObject *AutoState_begin(PyObject *self, PyObject *args) {
    AutoState *st = (AutoState *)self;
    long long key, epoch;
    if (!PyArg_ParseTuple(args, "LL", &key, &epoch))
        return NULL;
    if (!st->training)
        st->training = key; /* the first loader, until the first optimizer step */
    if (key == st->training) {
        st->train_epoch = epoch + st->shift;
        st->ended = 0;
    }
    st->current = key;
    st->current_ended = 0;
    st->epoch = epoch;
    if (moved(st) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* trained_elsewhere(): an integration's training run, which took optimizer steps,
   ended: its loader was the training one (TRAINED_ELSEWHERE, none of those the hooks
   see). A loader iterated from now on is an evaluation's unless an optimizer steps
   during its iteration (it is adopted then, as a loader made anew for an epoch). */
#define TRAINED_ELSEWHERE (-1LL)
static PyObject *AutoState_trained_elsewhere(PyObject *self, PyObject *unused) {
    AutoState *st = (AutoState *)self;
    st->training = TRAINED_ELSEWHERE;
    st->fixed = 1;
    st->ended = 1;
    st->current = 0;
    st->current_ended = 0;
    if (moved(st) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The step span left open by a step that raised (torch calls no post-hook then):
   it ends, incomplete, at the next step or batch fetched on its thread, so that
   what follows does not nest in it. (A forward or backward may: a closure's.) */
static void end_step_left(AutoState *st) {
    if (!st->step_open)
        return;
    st->step_open = 0;
    if (span_close(&st->step_sp, st->step_stk, now_ns(), NULL, NULL, -1, F_INCOMPLETE) < 0)
        PyErr_Clear();
    Py_CLEAR(st->step_stk);
}

/* The step counted: what follows numbers on (an evaluation before it is over). */
static void step_counted(AutoState *st) {
    st->steps++;
    st->pending = 0;
    st->stepped = NULL;
    if (moved(st) < 0)
        PyErr_Clear();
    if (st->evaluating && st->evaluation_over_cb) {
        st->evaluating = 0;
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        PyObject *r = PyObject_CallNoArgs(st->evaluation_over_cb);
        Py_XDECREF(r);
        PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    }
}

/* step_pre(optimizer, args, kwargs): the optimizer step's pre-hook. */
static PyObject *AutoState_step_pre(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    AutoState *st = (AutoState *)self;
    uint64_t ts = thread_id();
    if (st->pending && nargs > 0 && args[0] == st->stepped)
        step_counted(st); /* the same optimizer again with no batch between: a new step */
    if (st->step_open && st->step_ts == ts)
        end_step_left(st);
    PyObject *stk;
    if (st->step_open || !may_record(st, st->step, st->cat_compute, &stk))
        Py_RETURN_NONE; /* (another thread's step is open: this one is not recorded) */
    if (!st->fixed) { /* the loader iterated now trains (or, none yet, the first one) */
        st->fixed = 1;
        if (st->current) {
            if (st->current != st->training) {
                st->train_epoch = st->epoch;
                st->ended = 0;
            }
            st->training = st->current;
        }
        if (moved(st) < 0)
            PyErr_Clear();
    } else if (st->ended && st->current && st->current != st->training && !st->current_ended) {
        /* another loader iterated after the training loader's iteration ended, and
           under way: it trains now (one made anew for each epoch), its epoch the next
           one (not an evaluation's that ended before the step: `itertools.cycle` of
           the training loader fetches nothing more) */
        st->shift = st->train_epoch + 1 - st->epoch;
        st->training = st->current;
        st->train_epoch++;
        st->ended = 0;
        if (moved(st) < 0)
            PyErr_Clear();
    } else if (st->current && st->current != st->training && st->current_ended) {
        /* an evaluation's loader ended before this step: it trains on, in the training
           loader's epoch */
        st->current = st->training;
        st->epoch = st->train_epoch - st->shift;
        st->current_ended = st->ended;
        if (moved(st) < 0)
            PyErr_Clear();
    }
    if (span_open(&st->step_sp, stk, st->step, st->step_kid, SPAN_NOW) < 0) {
        Py_DECREF(stk);
        Py_RETURN_NONE;
    }
    st->step_open = 1;
    st->step_stk = stk;
    st->step_opt = nargs > 0 ? args[0] : NULL;
    st->step_ts = ts;
    Py_RETURN_NONE;
}

/* step_post(optimizer, args, kwargs): the optimizer step's post-hook: its span ends
   with this step's args and the optimizer's class; then the step is counted. */
static PyObject *AutoState_step_post(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    AutoState *st = (AutoState *)self;
    PyObject *opt = nargs > 0 ? args[0] : NULL;
    if (st->step_open && st->step_opt == opt && st->step_ts == thread_id()) {
        long long t1 = now_ns();
        PyObject *type = opt ? (PyObject *)Py_TYPE(opt) : Py_None;
        st->step_open = 0;
        if (st->sargs == NULL || st->sargs_type != type) {
            PyObject *name = PyObject_GetAttr(type, str_name);
            PyObject *x = name ? one_arg(str_optimizer, name) : NULL;
            Py_XDECREF(name);
            if (x) {
                Py_XSETREF(st->sargs, x);
                Py_XSETREF(st->sargs_type, Py_NewRef(type));
            } else {
                PyErr_Clear();
            }
        }
        give_position(st, &st->step_sp);
        PyObject *stk = st->step_stk;
        st->step_stk = NULL;
        int rc = span_close(&st->step_sp, stk, t1, st->sargs_type == type ? st->sargs : NULL, NULL,
                            -1, 0);
        Py_DECREF(stk);
        if (rc < 0)
            return NULL; /* a signal's exception while waiting for room */
    }
    if (!st->down && st->training && st->current == st->training && !st->ended) {
        /* (once the training loader's iteration ended, no batch comes to count it:
           batches kept from it, itertools.cycle's, are used with no fetch) */
        if (!st->pending) { /* counted at the next batch (see `pending`) */
            st->pending = 1;
            st->stepped = opt;
        }
    } else if (st->down || !st->counting || opt == st->counting || opt == st->last_opt) {
        /* no loader (or an integration's step): what follows numbers on; with several
           optimizers (a GAN's), at the counting one's steps alone */
        st->counting = opt;
        step_counted(st);
    }
    st->last_opt = opt;
    st->optimizer_steps++;
    if (!st->down && st->step_taken) {
        PyObject *r = PyObject_CallNoArgs(st->step_taken);
        Py_XDECREF(r);
        PyErr_Clear();
    }
    if (st->after_step) {
        PyObject *r = PyObject_CallNoArgs(st->after_step);
        Py_XDECREF(r);
        PyErr_Clear();
    }
    Py_RETURN_NONE;
}

static PyObject *AutoState_get_position(PyObject *self, void *c) {
    AutoState *st = (AutoState *)self;
    return st->pos ? PyDict_Copy(st->pos) : PyDict_New();
}

/* The ids of the spans open now that carry this step's args when they end (the
   backward, the optimizer step): a finalize writes them, incomplete, with those args. */
static PyObject *AutoState_get_open_in_step(PyObject *self, void *c) {
    AutoState *st = (AutoState *)self;
    unsigned long long ids[OPEN_BACKWARDS + 1];
    int n = 0;
    for (int i = 0; i < OPEN_BACKWARDS; i++)
        if (st->bwd_open[i])
            ids[n++] = st->bwd_open[i];
    if (st->step_open)
        ids[n++] = st->step_sp.idv;
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(ids[i]);
        if (!v)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, v);
    }
    return out;
}

/* A callable slot of the state (`c`: its offset), None where it is not set. */
static PyObject *AutoState_get_callable(PyObject *self, void *c) {
    PyObject *v = *(PyObject **)((char *)self + (size_t)c);
    return Py_NewRef(v ? v : Py_None);
}

static int AutoState_set_callable(PyObject *self, PyObject *v, void *c) {
    Py_XSETREF(*(PyObject **)((char *)self + (size_t)c), v && v != Py_None ? Py_NewRef(v) : NULL);
    return 0;
}

static PyMemberDef AutoState_members[] = {
    {"steps", T_LONGLONG, offsetof(AutoState, steps), 0, "optimizer steps taken"},
    {"down", T_LONGLONG, offsetof(AutoState, down), 0, "integrations training now"},
    {"current", T_LONGLONG, offsetof(AutoState, current), READONLY, "id() of the loader iterated last"},
    {"training", T_LONGLONG, offsetof(AutoState, training), READONLY, "id() of the training loader"},
    {"optimizer_steps", T_LONGLONG, offsetof(AutoState, optimizer_steps), READONLY, "every optimizer step taken"},
    {"ended", T_INT, offsetof(AutoState, ended), READONLY, "the training loader's iteration ended"},
    {"pending", T_INT, offsetof(AutoState, pending), READONLY,
     "an optimizer stepped, the step counted at the next batch"},
    {"evaluating", T_INT, offsetof(AutoState, evaluating), 0,
     "an evaluation over tensors at hand ran since the last step: evaluation_over() at the next"},
    {NULL}};

static PyGetSetDef AutoState_getset[] = {
    {"position", AutoState_get_position, NULL, "this step's args (a copy)", NULL},
    {"open_in_step", AutoState_get_open_in_step, NULL,
     "the ids of the open spans that end with this step's args (backward, optimizer step)", NULL},
    {"step_taken", AutoState_get_callable, AutoState_set_callable,
     "called after each optimizer step while set", (void *)offsetof(AutoState, step_taken)},
    {"after_step", AutoState_get_callable, AutoState_set_callable,
     "called after each optimizer step while set (after step_taken)", (void *)offsetof(AutoState, after_step)},
    {NULL}};

static PyObject *AutoState_fetches(PyObject *self, PyObject *args);

static PyMethodDef AutoState_methods[] = {
    {"begin", AutoState_begin, METH_VARARGS, "begin(loader_id, epoch): a loader's iteration begins"},
    {"trained_elsewhere", AutoState_trained_elsewhere, METH_NOARGS,
     "trained_elsewhere(): an integration's training run ended; its loader trained"},
    {"step_pre", (PyCFunction)(void (*)(void))AutoState_step_pre, METH_FASTCALL,
     "step_pre(optimizer, args, kwargs): the optimizer step pre-hook"},
    {"step_post", (PyCFunction)(void (*)(void))AutoState_step_post, METH_FASTCALL,
     "step_post(optimizer, args, kwargs): the optimizer step post-hook"},
    {"fetches", AutoState_fetches, METH_VARARGS,
     "fetches(iterator, loader_id, epoch): the iterator, a dataloader.fetch span per batch"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject AutoStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.AutoState",
    .tp_basicsize = sizeof(AutoState),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "AutoState(fetch, step, covered, grad_enabled, fetch_end=None, iteration_ended=None): what "
              "automatic tracing counts.",
    .tp_new = AutoState_new,
    .tp_dealloc = (destructor)AutoState_dealloc,
    .tp_traverse = (traverseproc)AutoState_refs,
    .tp_clear = (inquiry)AutoState_clear,
    .tp_members = AutoState_members,
    .tp_getset = AutoState_getset,
    .tp_methods = AutoState_methods,
};

/* ------------------------------------------------------------------------- */
/* AutoFetches: a DataLoader's iterator                                       */

typedef struct {
    PyObject_HEAD
    PyObject *it;
    AutoState *st;
    long long key, epoch;
    long long items; /* the batches it gave */
    int done; /* its iteration ended (its last next() returned nothing) */
} AutoFetches;

static PyTypeObject AutoFetchesType;

static PyObject *AutoState_fetches(PyObject *self, PyObject *args) {
    PyObject *it;
    long long key, epoch;
    if (!PyArg_ParseTuple(args, "OLL", &it, &key, &epoch))
        return NULL;
    AutoFetches *f = PyObject_GC_New(AutoFetches, &AutoFetchesType);
    if (!f)
        return NULL;
    f->it = Py_NewRef(it);
    f->st = (AutoState *)Py_NewRef(self);
    f->key = key;
    f->epoch = epoch;
    f->items = 0;
    f->done = 0;
    PyObject_GC_Track(f);
    return (PyObject *)f;
}

/* A loader's iteration ended: the wait for its end (its workers shut down) is a
   `fetch.end` span with the training loader's epoch (no step: it is none) and the
   batches the pass gave (`count`). */
static int end_of_iteration(AutoState *st, AutoFetches *f, span_t *sp, PyObject *stk, long long t1) {
    PyObject *x = NULL, *d = PyDict_New(), *e = NULL, *n = PyLong_FromLongLong(f->items);
    if (f->key == st->training) {
        st->ended = 1;
        e = PyLong_FromLongLong(st->epoch + st->shift);
    }
    if (f->key == st->current)
        st->current_ended = 1;
    if (d && n && (f->key != st->training || (e && PyDict_SetItem(d, str_epoch, e) == 0)) &&
        PyDict_SetItem(d, str_count, n) == 0)
        x = dft_plain_extra(d, 1);
    Py_XDECREF(d);
    Py_XDECREF(e);
    Py_XDECREF(n);
    if (!x)
        PyErr_Clear();
    sp->kid = st->fetch_end_kid;
    int rc = span_close(sp, stk, t1, x, NULL, -1, 0); /* -1: a signal's exception, raised */
    Py_XDECREF(x);
    if (rc == 0 && st->ended_cb) { /* (an evaluation's loader, say) */
        PyObject *r = PyObject_CallFunction(st->ended_cb, "LLL", f->key, t1, f->items);
        if (r)
            Py_DECREF(r);
        else if (PyErr_ExceptionMatches(PyExc_Exception))
            PyErr_Clear();
        else
            rc = -1; /* a signal's exception: the program's */
    }
    return rc;
}

/* The loader iterator's next item (NULL: its end, or what it raised: it is done). */
static PyObject *next_of(AutoFetches *f) {
    PyObject *item = PyIter_Next(f->it);
    if (item == NULL)
        f->done = 1;
    else
        f->items++;
    return item;
}

static PyObject *AutoFetches_next(AutoFetches *f) {
    AutoState *st = f->st;
    PyObject *stk;
    if (st->pending) /* the batch after an optimizer step: the next step's */
        step_counted(st);
    if (st->step_open && st->step_ts == thread_id()) /* no batch is fetched in a step */
        end_step_left(st);
    if (!may_record(st, st->fetch, st->cat_data, &stk))
        return next_of(f);
    if (st->current != f->key) {
        st->current = f->key;
        st->current_ended = 0;
        st->epoch = f->epoch;
        if (moved(st) < 0)
            PyErr_Clear();
    }
    span_t sp;
    if (span_open(&sp, stk, st->fetch, st->fetch_kid, SPAN_NOW) < 0) {
        Py_DECREF(stk);
        return next_of(f);
    }
    PyObject *item = next_of(f);
    long long t1 = now_ns();
    PyObject *x = st->training == f->key ? st->pos_x : NULL;
    Py_XINCREF(x);
    if (item == NULL) {
        if (PyErr_Occurred()) /* the loader raised: the span says so */
            span_close_raised(&sp, stk, t1, x, -1);
        else if (st->fetch_end) { /* the end: the wait for it (workers shut down), not a batch */
            end_of_iteration(st, f, &sp, stk, t1); /* NULL returned: the end, or what it raised */
        } else {
            span_close(&sp, stk, t1, NULL, NULL, -1, SPAN_UNRECORDED);
            if (f->key == st->training)
                st->ended = 1;
        }
    } else if (span_close(&sp, stk, t1, x, NULL, -1, 0) < 0) {
        Py_CLEAR(item); /* a signal's exception while waiting for room */
    }
    Py_XDECREF(x);
    Py_DECREF(stk);
    return item;
}

static PyObject *AutoFetches_getattro(PyObject *self, PyObject *name) {
    PyObject *v = PyObject_GenericGetAttr(self, name);
    if (v || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return v;
    PyErr_Clear();
    return PyObject_GetAttr(((AutoFetches *)self)->it, name); /* the loader's iterator's */
}

static Py_ssize_t AutoFetches_len(PyObject *self) { return PyObject_Size(((AutoFetches *)self)->it); }

static int AutoFetches_traverse(AutoFetches *f, visitproc visit, void *arg) {
    Py_VISIT(f->it);
    Py_VISIT(f->st);
    return 0;
}

static int AutoFetches_clear(AutoFetches *f) {
    Py_CLEAR(f->it);
    Py_CLEAR(f->st);
    return 0;
}

/* A loader's iteration left before its end (a break, islice): its iterator, let go
   here, shuts its workers down now; that wait is its `fetch.end`, as at an end, and
   the iteration has ended (an evaluation's, cut short, is an evaluation all the same:
   `ended_cb`). What was raised meanwhile stays. */
static void let_go_early(AutoFetches *f) {
    AutoState *st = f->st;
    PyObject *et, *ev, *tb, *stk;
    PyErr_Fetch(&et, &ev, &tb);
    if (f->key == st->training)
        st->ended = 1;
    if (may_record(st, st->fetch, st->cat_data, &stk)) {
        span_t sp;
        if (span_open(&sp, stk, st->fetch, st->fetch_kid, SPAN_NOW) == 0) {
            Py_CLEAR(f->it);
            if (end_of_iteration(st, f, &sp, stk, now_ns()) < 0)
                PyErr_Clear();
        }
        Py_DECREF(stk);
    }
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

static void AutoFetches_dealloc(AutoFetches *f) {
    PyObject_GC_UnTrack(f);
    if (!f->done && f->it && f->st && f->st->fetch_end && Py_REFCNT(f->it) == 1)
        let_go_early(f);
    AutoFetches_clear(f);
    PyObject_GC_Del(f);
}

static PySequenceMethods AutoFetches_seq = {.sq_length = AutoFetches_len};

static PyTypeObject AutoFetchesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.AutoFetches",
    .tp_basicsize = sizeof(AutoFetches),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A DataLoader's iterator: a dataloader.fetch span per batch waited for.",
    .tp_dealloc = (destructor)AutoFetches_dealloc,
    .tp_traverse = (traverseproc)AutoFetches_traverse,
    .tp_clear = (inquiry)AutoFetches_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)AutoFetches_next,
    .tp_getattro = AutoFetches_getattro,
    .tp_as_sequence = &AutoFetches_seq,
};

/* ------------------------------------------------------------------------- */
/* AutoCall: forward() of the roots, torch.autograd.backward                   */

typedef struct {
    PyObject_HEAD
    PyObject *fn;     /* what is called */
    PyObject *slow;   /* called instead while an integration stands down (NULL: fn) */
    AutoState *st;
    PyObject *node;
    PyObject *dict, *weakreflist;
    vectorcallfunc vectorcall;
    uint32_t kid;
    /* forward(): the modules (roots) whose calls are spans, compared by address
       (each one's weakref drops it: drop_root), and the span's args */
    int forward, nroots;
    uintptr_t roots[MAX_ROOTS];
    PyObject *name_x;           /* {"module": name}, its span's own args */
} AutoCall;

static inline int is_root(AutoCall *c, PyObject *self) {
    for (int i = 0; i < c->nroots; i++)
        if (c->roots[i] == (uintptr_t)self)
            return 1;
    return 0;
}

/* Whether `module` trains now (in train() mode, with gradients on): its forward
   carries the step's args (an evaluation's does not). */
static int trains(AutoState *st, PyObject *module) {
    PyObject *tr = PyObject_GetAttr(module, str_training);
    int yes = tr ? PyObject_IsTrue(tr) : 0;
    Py_XDECREF(tr);
    if (yes > 0) {
        PyObject *g = PyObject_CallNoArgs(st->grad_enabled);
        yes = g ? PyObject_IsTrue(g) : 0;
        Py_XDECREF(g);
    }
    PyErr_Clear();
    return yes > 0;
}

static PyObject *AutoCall_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    AutoCall *c = (AutoCall *)self;
    AutoState *st = c->st;
    PyObject *module = NULL;
    if (c->forward) {
        module = PyVectorcall_NARGS(nargsf) ? args[0] : NULL;
        if (!module || !is_root(c, module))
            return PyObject_Vectorcall(c->fn, args, nargsf, kwnames);
        if (st->fwd_depth && st->fwd_ts == thread_id()) /* a root inside a root */
            return PyObject_Vectorcall(c->fn, args, nargsf, kwnames);
    }
    if (st->down && c->slow)
        return PyObject_Vectorcall(c->slow, args, nargsf, kwnames);
    PyObject *stk;
    if (!may_record(st, c->node, st->cat_compute, &stk))
        return PyObject_Vectorcall(c->fn, args, nargsf, kwnames);
    span_t sp;
    if (span_open(&sp, stk, c->node, c->kid, SPAN_NOW) < 0) {
        Py_DECREF(stk);
        return PyObject_Vectorcall(c->fn, args, nargsf, kwnames);
    }
    uint64_t ts = 0;
    int bwd = OPEN_BACKWARDS; /* its place there, if any */
    if (module) {
        ts = thread_id();
        if (st->fwd_depth == 0)
            st->fwd_ts = ts;
        st->fwd_depth++;
    } else {
        for (int i = 0; i < OPEN_BACKWARDS; i++)
            if (!st->bwd_open[i]) {
                st->bwd_open[bwd = i] = sp.idv;
                break;
            }
    }
    PyObject *result = PyObject_Vectorcall(c->fn, args, nargsf, kwnames);
    long long t1 = now_ns();
    if (bwd < OPEN_BACKWARDS)
        st->bwd_open[bwd] = 0;
    if (module) {
        if (st->fwd_ts == ts && st->fwd_depth > 0)
            st->fwd_depth--;
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb); /* trains() reads attributes: the error waits */
        if (trains(st, module)) {
            give_position(st, &sp);
        } else if ((st->pending || st->ended) && st->evaluated_cb) { /* over tensors at hand, after
                                                                           the step's work or its epoch's */
            PyObject *times = Py_BuildValue("(LL)", sp.t0, t1);
            if (times) {
                st->evaluating = 1;
                PyObject *r = PyObject_CallObject(st->evaluated_cb, times);
                Py_XDECREF(r);
                Py_DECREF(times);
            }
            PyErr_Clear();
        }
        PyErr_Restore(et, ev, tb);
    } else {
        give_position(st, &sp);
    }
    if (!result)
        span_close_raised(&sp, stk, t1, c->name_x, -1);
    else if (span_close(&sp, stk, t1, c->name_x, NULL, -1, 0) < 0)
        Py_CLEAR(result);
    Py_DECREF(stk);
    return result;
}

/* AutoCall(state, node, fn, slow=None, module=None): `module` (a class name) makes
   it a forward(), recorded for the roots added to it. */
static PyObject *AutoCall_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"state", "node", "fn", "slow", "module", NULL};
    PyObject *state, *node, *fn, *slow = Py_None, *module = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO|OO", kw, &AutoStateType, &state, &node, &fn,
                                     &slow, &module))
        return NULL;
    AutoCall *c = (AutoCall *)type->tp_alloc(type, 0);
    if (!c)
        return NULL;
    c->st = (AutoState *)Py_NewRef(state);
    c->node = Py_NewRef(node);
    c->fn = Py_NewRef(fn);
    c->slow = slow == Py_None ? NULL : Py_NewRef(slow);
    c->kid = dft_node_kid(node, dft_str_kid);
    c->vectorcall = AutoCall_vectorcall;
    if (module != Py_None) {
        c->forward = 1;
        if (!(c->name_x = one_arg(str_module, module))) {
            Py_DECREF(c);
            return NULL;
        }
    }
    return (PyObject *)c;
}

/* add_root(module) -> bool: its calls are spans (False: no room; use hooks). */
static PyObject *AutoCall_add_root(PyObject *self, PyObject *module) {
    AutoCall *c = (AutoCall *)self;
    if (is_root(c, module))
        Py_RETURN_TRUE;
    if (c->nroots >= MAX_ROOTS)
        Py_RETURN_FALSE;
    c->roots[c->nroots++] = (uintptr_t)module;
    Py_RETURN_TRUE;
}

/* drop_root(address): the module at id() `address` is gone. */
static PyObject *AutoCall_drop_root(PyObject *self, PyObject *address) {
    AutoCall *c = (AutoCall *)self;
    uintptr_t a = (uintptr_t)PyLong_AsVoidPtr(address);
    if (PyErr_Occurred())
        return NULL;
    for (int i = 0; i < c->nroots; i++)
        if (c->roots[i] == a) {
            c->roots[i] = c->roots[--c->nroots];
            break;
        }
    Py_RETURN_NONE;
}

static int AutoCall_refs(AutoCall *c, visitproc visit, void *arg) {
    PyObject *st = (PyObject *)c->st;
    PyObject **const refs[] = {&c->fn, &c->slow, &st, &c->node, &c->dict, &c->name_x};
    int rc = visit_refs(refs, NREFS(refs), visit, arg);
    c->st = (AutoState *)st;
    return rc;
}

static int AutoCall_clear(AutoCall *c) { return AutoCall_refs(c, NULL, NULL); }

static void AutoCall_dealloc(AutoCall *c) {
    PyObject_GC_UnTrack(c);
    if (c->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)c);
    AutoCall_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* Pickled by reference, as a function is: the name its class holds it under. */
static PyObject *AutoCall_reduce(PyObject *self, PyObject *unused) {
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef AutoCall_methods[] = {
    {"__reduce__", AutoCall_reduce, METH_NOARGS, NULL},
    {"add_root", AutoCall_add_root, METH_O, "add_root(module) -> bool: its calls are spans"},
    {"drop_root", AutoCall_drop_root, METH_O, "drop_root(address): that module is gone"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef AutoCall_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL}};

static PyTypeObject AutoCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dftrace._core._speedups.AutoCall",
    .tp_basicsize = sizeof(AutoCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "AutoCall(state, node, fn, slow=None, module=None): a call of fn as a span "
              "of node, unless you recorded it yourself.",
    .tp_new = AutoCall_new,
    .tp_dealloc = (destructor)AutoCall_dealloc,
    .tp_traverse = (traverseproc)AutoCall_refs,
    .tp_clear = (inquiry)AutoCall_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(AutoCall, vectorcall),
    .tp_dictoffset = offsetof(AutoCall, dict),
    .tp_weaklistoffset = offsetof(AutoCall, weakreflist),
    .tp_getset = AutoCall_getset,
    .tp_methods = AutoCall_methods,
};

/* ------------------------------------------------------------------------- */

int dft_auto_hooks_add(PyObject *m) {
    if (!(str_step = PyUnicode_InternFromString("step")) ||
        !(str_epoch = PyUnicode_InternFromString("epoch")) ||
        !(str_count = PyUnicode_InternFromString("count")) ||
        !(str_module = PyUnicode_InternFromString("module")) ||
        !(str_optimizer = PyUnicode_InternFromString("optimizer")) ||
        !(str_training = PyUnicode_InternFromString("training")) ||
        !(str_name = PyUnicode_InternFromString("__name__")))
        return -1;
    if (PyType_Ready(&AutoStateType) < 0 || PyType_Ready(&AutoFetchesType) < 0 ||
        PyType_Ready(&AutoCallType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "AutoState", (PyObject *)&AutoStateType) < 0 ||
        PyModule_AddObjectRef(m, "AutoCall", (PyObject *)&AutoCallType) < 0)
        return -1;
    return 0;
}

DFT_HIDDEN_END
