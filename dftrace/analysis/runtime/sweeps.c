/* Interval sweeps of the summary: the fast path of dftrace.analysis.reduce.busy, built into
 * the _kernels module (its functions are listed in scan.c's method table).
 *
 * innermost(tid, ts, end, level, level_valid, group, order) paints each thread's
 *   time with its innermost span: the (group, start, end) runs where it is in an
 *   activity group and each span's self time. It gives what _busy's numpy painting
 *   gives, malformed spans included: at each instant the deepest level (of -1 or more)
 *   with more spans open than reversed ones (end before ts) wins, and where several of
 *   that level are open their group codes and positions are averaged as the
 *   painting's sums are. Each thread's spans are taken by start, the longest first:
 *   sorted here when ``order`` is empty, and then None comes back if two spans of a
 *   thread have the same start and end (their order, which decides which one is the
 *   innermost, is polars' sort's: the caller passes it, span indices thread by thread
 *   in the order the threads first appear). It also finds each span's nesting edges
 *   (what _aggregate's polars query finds without it), for the threads whose spans all
 *   have a level: an orphan is a span of level 2 or more whose enclosing span (of the
 *   level above on its thread, the latest to start at or before it, the longest of
 *   those starting together) is missing or ends before it does; an opener is a span
 *   that starts before every span of its thread has ended. Both come back as one byte
 *   a span, or None where a thread's levels spread wider than its spans are many.
 * union(key, starts, ends, n_keys) merges the overlapping or touching intervals of
 *   each key (0 to n_keys - 1; sorted by start when they are not already), keys in
 *   the order they first appear: for each run the first row of its key, start, end.
 * masks(group, start, end, size, alone_bit) sweeps the boundaries of a process's
 *   intervals, each toggling its group's bit: the time in each bit mask (size masks at
 *   least), and the runs where the mask is alone_bit alone (none when it is -1).
 * cover(pieces, size, alone_bit, emit_bit) sweeps one process's intervals as masks
 *   does, from pieces (group int8, start, end) that need not be disjoint between
 *   them: a file's parts, each part's intervals unioned per group. A group is active
 *   while any of its intervals is open. Each piece is walked as the runs it is made of
 *   (one group, by start, each interval after the last one's end), merged by time
 *   without a copy of the intervals or a sort: the time in each bit mask, the runs
 *   where the mask is alone_bit alone, and the runs where emit_bit is in it (the
 *   union of that group's intervals). None where the pieces are not a few such runs.
 * steps(code, start, end, n, is_work, cuts, epoch_span[, after_work]) places one
 *   process's steps from its step rows, as _steps' numpy model does (see its comment below).
 * across(code, start, dur, order) compares the ranks' times of each step, as
 *   answers.steps.steps_across_units' query does.
 * extents(keys, k, start, end, values, taken) groups rows by k integer keys: each
 *   group's least start, greatest end, rows and sum (_aggregate's scanned pieces).
 *
 * Arrays come in as contiguous buffers (int64, level_valid and is_work uint8,
 * innermost's group int8) and go back as bytes the caller views with numpy. The work
 * runs without the GIL.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Groups of the time breakdown (_busy.GROUPS): an averaged group code is clipped to them. */
#define LAST_GROUP 4

/* A stable merge sort of T by LESS, skipping a merge where the halves are already in
 * order: nearly sorted input (spans written as they end) costs little more than a pass. */
#define DEFINE_MERGE_SORT(NAME, T, LESS)                                                  \
    static void NAME(T *a, T *tmp, Py_ssize_t n) {                                        \
        if (n <= 16) {                                                                    \
            for (Py_ssize_t i = 1; i < n; i++) {                                          \
                T x = a[i];                                                               \
                Py_ssize_t j = i;                                                         \
                while (j > 0 && LESS(&x, &a[j - 1])) { a[j] = a[j - 1]; j--; }            \
                a[j] = x;                                                                 \
            }                                                                             \
            return;                                                                       \
        }                                                                                 \
        Py_ssize_t half = n / 2;                                                          \
        NAME(a, tmp, half);                                                               \
        NAME(a + half, tmp, n - half);                                                    \
        if (!LESS(&a[half], &a[half - 1])) return;                                        \
        memcpy(tmp, a, half * sizeof(T));                                                 \
        Py_ssize_t i = 0, j = half, k = 0;                                                \
        while (i < half && j < n) a[k++] = LESS(&a[j], &tmp[i]) ? a[j++] : tmp[i++];      \
        while (i < half) a[k++] = tmp[i++];                                               \
    }

/* A stable LSD radix sort of n (key, idx) pairs by key, 11 bits a pass over the bits
 * the largest key has: ties keep the order given. */
typedef struct { uint64_t key; int64_t idx; } Keyed;

static void radix_sort(Keyed *a, Keyed *tmp, Py_ssize_t n) {
    uint64_t top = 0;
    for (Py_ssize_t i = 0; i < n; i++) top |= a[i].key;
    Py_ssize_t count[2049];
    Keyed *from = a, *to = tmp;  /* each pass from one array into the other */
    for (int shift = 0; shift < 64 && (top >> shift); shift += 11) {
        memset(count, 0, sizeof(count));
        for (Py_ssize_t i = 0; i < n; i++) count[((from[i].key >> shift) & 2047) + 1]++;
        for (int d = 0; d < 2048; d++) count[d + 1] += count[d];
        for (Py_ssize_t i = 0; i < n; i++) to[count[(from[i].key >> shift) & 2047]++] = from[i];
        Keyed *swap = from;
        from = to;
        to = swap;
    }
    if (from != a) memcpy(a, from, n * sizeof(Keyed));
}

typedef struct { int64_t tid, ts, end, idx; } SpanKey;
typedef struct { int64_t first_span, begin, end; } Thread;  /* its least span index, keys[begin..end) */
typedef struct { int64_t start, end; } Pair;
typedef struct { int64_t row, key, runs; } KeyRuns;  /* a key's first row and its runs */

/* A thread's spans by start, the longest first (then in the order given). */
static inline int span_less(const SpanKey *a, const SpanKey *b) {
    if (a->tid != b->tid) return a->tid < b->tid;
    if (a->ts != b->ts) return a->ts < b->ts;
    if (a->end != b->end) return a->end > b->end;
    return a->idx < b->idx;
}
static inline int thread_less(const Thread *a, const Thread *b) { return a->first_span < b->first_span; }
static inline int pair_less(const Pair *a, const Pair *b) { return a->start < b->start; }
static inline int key_less(const int64_t *a, const int64_t *b) { return *a < *b; }

DEFINE_MERGE_SORT(sort_spans, SpanKey, span_less)
DEFINE_MERGE_SORT(sort_threads, Thread, thread_less)
DEFINE_MERGE_SORT(sort_pairs, Pair, pair_less)
DEFINE_MERGE_SORT(sort_keys, int64_t, key_less)

/* Sorts the spans (``tid``, ``ts``, ``end``, n of each) into ``keys`` as sort_spans
 * does (by thread, start, the longest first, then index), by a radix sort of one
 * integer a span, its thread and start, where both fit in 64 bits: a few passes
 * over the spans, where the merge sort moved each of them log(n) times (a span is
 * written after the spans it encloses, so a thread's spans come in no long run of
 * starts). 0 when they do not fit (``keys`` untouched). ``pairs`` and ``tmp``: n Keyed
 * each; ``key_tmp``: n SpanKey. */
static int radix_spans(const int64_t *tid, const int64_t *ts, const int64_t *end, Py_ssize_t n, SpanKey *keys,
                       Keyed *pairs, Keyed *tmp, SpanKey *key_tmp) {
    if (!n) return 1;
    int64_t tid_lo = tid[0], tid_hi = tid[0], ts_lo = ts[0], ts_hi = ts[0];
    for (Py_ssize_t i = 1; i < n; i++) {
        if (tid[i] < tid_lo) tid_lo = tid[i];
        if (tid[i] > tid_hi) tid_hi = tid[i];
        if (ts[i] < ts_lo) ts_lo = ts[i];
        if (ts[i] > ts_hi) ts_hi = ts[i];
    }
    uint64_t tid_range = (uint64_t)tid_hi - (uint64_t)tid_lo, ts_range = (uint64_t)ts_hi - (uint64_t)ts_lo;
    int tid_bits = 0, ts_bits = 0;
    while (tid_bits < 64 && (tid_range >> tid_bits)) tid_bits++;
    while (ts_bits < 64 && (ts_range >> ts_bits)) ts_bits++;
    if (tid_bits + ts_bits > 64) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t thread = tid_bits ? ((uint64_t)tid[i] - (uint64_t)tid_lo) << ts_bits : 0;
        pairs[i] = (Keyed){thread | ((uint64_t)ts[i] - (uint64_t)ts_lo), (int64_t)i};
    }
    radix_sort(pairs, tmp, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t j = pairs[i].idx;
        keys[i] = (SpanKey){tid[j], ts[j], end[j], j};
    }
    /* Spans of a thread starting together: the longest first, then by index. */
    for (Py_ssize_t a = 0, b; a < n; a = b) {
        for (b = a + 1; b < n && keys[b].tid == keys[a].tid && keys[b].ts == keys[a].ts; b++) {}
        if (b - a > 1) sort_spans(keys + a, key_tmp, b - a);
    }
    return 1;
}

static inline int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static inline int64_t clip(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Growable output of (group, start, end) runs. */
typedef struct {
    int8_t *groups;
    int64_t *starts, *ends;
    Py_ssize_t n, cap;
} Runs;

static int runs_append(Runs *r, int8_t group, int64_t start, int64_t end) {
    if (r->n == r->cap) {
        Py_ssize_t cap = r->cap ? r->cap * 2 : 256;
        int8_t *g = realloc(r->groups, cap);
        if (g) r->groups = g;
        int64_t *s = realloc(r->starts, cap * sizeof(int64_t));
        if (s) r->starts = s;
        int64_t *e = realloc(r->ends, cap * sizeof(int64_t));
        if (e) r->ends = e;
        if (!g || !s || !e) return -1;
        r->cap = cap;
    }
    r->groups[r->n] = group;
    r->starts[r->n] = start;
    r->ends[r->n] = end;
    r->n++;
    return 0;
}

/* A run, joined to the last one where it is of the same group and touches it. */
static int runs_push(Runs *r, int8_t group, int64_t start, int64_t end) {
    if (r->n && r->groups[r->n - 1] == group && r->ends[r->n - 1] == start) {
        r->ends[r->n - 1] = end;
        return 0;
    }
    return runs_append(r, group, start, end);
}

static void runs_free(Runs *r) {
    free(r->groups);
    free(r->starts);
    free(r->ends);
}

/* Binary heaps: closes by time (least first), levels by index (greatest first). */
typedef struct { int64_t time, position; } Close;

static void close_push(Close *h, Py_ssize_t *n, Close c) {
    Py_ssize_t i = (*n)++;
    while (i > 0) {
        Py_ssize_t up = (i - 1) / 2;
        if (h[up].time <= c.time) break;
        h[i] = h[up];
        i = up;
    }
    h[i] = c;
}

static void close_pop(Close *h, Py_ssize_t *n) {
    Close last = h[--(*n)];
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= *n) break;
        if (child + 1 < *n && h[child + 1].time < h[child].time) child++;
        if (last.time <= h[child].time) break;
        h[i] = h[child];
        i = child;
    }
    if (*n) h[i] = last;
}

static void level_push(int64_t *h, Py_ssize_t *n, int64_t v) {
    Py_ssize_t i = (*n)++;
    while (i > 0) {
        Py_ssize_t up = (i - 1) / 2;
        if (h[up] >= v) break;
        h[i] = h[up];
        i = up;
    }
    h[i] = v;
}

static void level_pop(int64_t *h, Py_ssize_t *n) {
    int64_t last = h[--(*n)];
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= *n) break;
        if (child + 1 < *n && h[child + 1] > h[child]) child++;
        if (last >= h[child]) break;
        h[i] = h[child];
        i = child;
    }
    if (*n) h[i] = last;
}

/* Work arrays of one call, sized for its largest thread (its spans at most). */
typedef struct {
    int64_t *depth, *slot, *stack, *levels, *count, *code, *owner;
    Close *closes;
    Pair *reversed, *pair_tmp;
    Py_ssize_t n_levels_cap;
} Work;

/* The nesting edges of one thread whose spans ``s[0..k)`` (sorted by start) all have
 * their level in ``depth``: 0, or 1 where the levels spread too wide to be looked up. */
static int thread_edges(const SpanKey *s, Py_ssize_t k, const int64_t *depth, int64_t *last, uint8_t *orphan,
                        uint8_t *opener) {
    int64_t first_end = INT64_MAX, lo = INT64_MAX, hi = INT64_MIN;
    for (Py_ssize_t p = 0; p < k; p++) {
        if (s[p].end < first_end) first_end = s[p].end;
        if (depth[p] < lo) lo = depth[p];
        if (depth[p] > hi) hi = depth[p];
    }
    for (Py_ssize_t p = 0; p < k; p++) opener[s[p].idx] = s[p].ts < first_end;
    if ((uint64_t)hi - (uint64_t)lo >= (uint64_t)k) return 1;
    /* last[level - lo]: the span of that level that started last so far, the longest
     * of those starting together: each level's latest start is taken before the spans
     * starting with it look for their enclosing span. */
    for (int64_t i = 0; i <= hi - lo; i++) last[i] = -1;
    for (Py_ssize_t a = 0, b; a < k; a = b) {
        for (b = a; b < k && s[b].ts == s[a].ts; b++) {
            int64_t *at = &last[depth[b] - lo];
            if (*at < 0 || s[*at].ts < s[b].ts || s[*at].end < s[b].end) *at = b;
        }
        for (Py_ssize_t p = a; p < b; p++) {
            if (depth[p] <= 1) continue;
            int64_t parent = depth[p] - 1 < lo ? -1 : last[depth[p] - 1 - lo];
            orphan[s[p].idx] = parent < 0 || s[parent].end < s[p].end;
        }
    }
    return 0;
}

/* Paints one thread: its spans ``s[0..k)`` in sorted order (their positions). */
static int paint_thread(const SpanKey *s, Py_ssize_t k, const int64_t *level, const uint8_t *level_valid,
                        const int8_t *group, Work *w, Runs *runs, int64_t *self_us, uint8_t *orphan,
                        uint8_t *opener, int *edges_wide) {
    int have_levels = 1;
    for (Py_ssize_t p = 0; p < k; p++) have_levels &= level_valid[s[p].idx] != 0;
    if (have_levels) {
        for (Py_ssize_t p = 0; p < k; p++) w->depth[p] = level[s[p].idx];
        *edges_wide |= thread_edges(s, k, w->depth, w->levels, orphan, opener);
    } else {  /* nesting rebuilt from the times, as _busy._depths does */
        Py_ssize_t top = 0;
        for (Py_ssize_t p = 0; p < k; p++) {
            while (top > 0 && w->stack[top - 1] <= s[p].ts) top--;
            w->depth[p] = top + 1;
            w->stack[top++] = s[p].end;
        }
    }
    /* Spans that paint: of level -1 or more, not of zero length. Their levels become
     * slots 0.. in order (an offset where the levels are few, else a sorted table). */
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (Py_ssize_t p = 0; p < k; p++) {
        if (w->depth[p] < -1 || s[p].ts == s[p].end) { w->slot[p] = -1; continue; }
        if (w->depth[p] < lo) lo = w->depth[p];
        if (w->depth[p] > hi) hi = w->depth[p];
        w->slot[p] = 0;
    }
    if (lo > hi) return 0;
    Py_ssize_t n_levels;
    if ((uint64_t)hi - (uint64_t)lo < (uint64_t)k) {
        n_levels = (Py_ssize_t)(hi - lo) + 1;
        for (Py_ssize_t p = 0; p < k; p++)
            if (w->slot[p] >= 0) w->slot[p] = w->depth[p] - lo;
    } else {
        n_levels = 0;
        for (Py_ssize_t p = 0; p < k; p++)
            if (w->slot[p] >= 0) w->levels[n_levels++] = w->depth[p];
        sort_keys(w->levels, w->stack, n_levels);
        Py_ssize_t distinct = 0;
        for (Py_ssize_t i = 0; i < n_levels; i++)
            if (!distinct || w->levels[i] != w->levels[distinct - 1]) w->levels[distinct++] = w->levels[i];
        n_levels = distinct;
        for (Py_ssize_t p = 0; p < k; p++) {
            if (w->slot[p] < 0) continue;
            Py_ssize_t a = 0, b = n_levels;
            while (b - a > 1) {
                Py_ssize_t mid = (a + b) / 2;
                if (w->levels[mid] <= w->depth[p]) a = mid; else b = mid;
            }
            w->slot[p] = a;
        }
    }
    memset(w->count, 0, n_levels * sizeof(int64_t));
    memset(w->code, 0, n_levels * sizeof(int64_t));
    memset(w->owner, 0, n_levels * sizeof(int64_t));
    /* Reversed spans (end before ts) count -1 from their end to their ts; they open
     * out of order, so in a list of their own by end. */
    Py_ssize_t n_reversed = 0;
    for (Py_ssize_t p = 0; p < k; p++)
        if (w->slot[p] >= 0 && s[p].end < s[p].ts) w->reversed[n_reversed++] = (Pair){s[p].end, (int64_t)p};
    sort_pairs(w->reversed, w->pair_tmp, n_reversed);

    int64_t *open_levels = w->stack;  /* the heap of levels with spans open (may hold stale ones) */
    Py_ssize_t n_open = 0, n_closes = 0, next = 0, next_reversed = 0;
    int64_t previous = 0, painted_by = -1;
    int8_t painted_group = -1;
    for (;;) {
        while (next < k && (w->slot[next] < 0 || s[next].end < s[next].ts)) next++;
        int64_t t = INT64_MAX;
        int any = 0;
        if (next < k) { t = s[next].ts; any = 1; }
        if (next_reversed < n_reversed && (!any || w->reversed[next_reversed].start < t)) {
            t = w->reversed[next_reversed].start;
            any = 1;
        }
        if (n_closes && (!any || w->closes[0].time < t)) { t = w->closes[0].time; any = 1; }
        if (!any) break;
        if (painted_by >= 0 && t > previous) {
            self_us[painted_by] += t - previous;
            if (painted_group >= 0 && runs_push(runs, painted_group, previous, t) < 0) return -1;
        }
        /* Every change at t: closes, then opens (the order does not matter, only the
         * state between distinct times). */
        while (n_closes && w->closes[0].time == t) {
            Py_ssize_t p = w->closes[0].position;
            close_pop(w->closes, &n_closes);
            int64_t weight = s[p].end < s[p].ts ? -1 : 1, slot = w->slot[p];
            w->count[slot] -= weight;
            w->code[slot] -= weight * (group[s[p].idx] + 2);
            w->owner[slot] -= weight * p;
            if (w->count[slot] > 0 && w->count[slot] + weight <= 0) level_push(open_levels, &n_open, slot);
        }
        for (;;) {
            Py_ssize_t p;
            int64_t weight, close_at;
            if (next < k && s[next].ts == t) {
                p = next++;
                weight = 1;
                close_at = s[p].end;
            } else if (next_reversed < n_reversed && w->reversed[next_reversed].start == t) {
                p = w->reversed[next_reversed++].end;
                weight = -1;
                close_at = s[p].ts;
            } else {
                break;
            }
            if (weight > 0 && (w->slot[p] < 0 || s[p].end < s[p].ts)) continue;  /* not painting, or reversed */
            int64_t slot = w->slot[p];
            w->count[slot] += weight;
            w->code[slot] += weight * (group[s[p].idx] + 2);
            w->owner[slot] += weight * p;
            if (w->count[slot] > 0 && w->count[slot] - weight <= 0) level_push(open_levels, &n_open, slot);
            close_push(w->closes, &n_closes, (Close){close_at, (int64_t)p});
        }
        while (n_open && w->count[open_levels[0]] <= 0) level_pop(open_levels, &n_open);
        if (n_open) {
            int64_t slot = open_levels[0], count = w->count[slot];
            painted_group = (int8_t)clip(floor_div(w->code[slot], count) - 2, -1, LAST_GROUP);
            painted_by = s[clip(floor_div(w->owner[slot], count), 0, k - 1)].idx;
        } else {
            painted_by = -1;
        }
        previous = t;
    }
    return 0;
}

static int same_length(Py_buffer *views, int n, Py_ssize_t *length) {
    *length = views[0].len / (Py_ssize_t)sizeof(int64_t);
    for (int i = 0; i < n; i++) {
        if (views[i].len != *length * (Py_ssize_t)sizeof(int64_t)) {
            PyErr_SetString(PyExc_ValueError, "arrays of int64 of one length expected");
            return 0;
        }
    }
    return 1;
}

static PyObject *bytes_of(const void *data, Py_ssize_t size) {
    return PyBytes_FromStringAndSize(size ? data : NULL, size);
}

PyObject *sweeps_innermost(PyObject *self, PyObject *args) {
    Py_buffer b[7];
    memset(b, 0, sizeof(b));
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*:innermost", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6])) {
        for (int i = 0; i < 7; i++) if (b[i].obj) PyBuffer_Release(&b[i]);
        return NULL;
    }
    PyObject *result = NULL, *self_obj = NULL, *orphan_obj = NULL, *opener_obj = NULL;
    Runs runs = {0};
    Work w = {0};
    int64_t **arrays[] = {&w.depth, &w.slot, &w.stack, &w.levels, &w.count, &w.code, &w.owner};
    SpanKey *keys = NULL, *key_tmp = NULL;
    Thread *threads = NULL, *thread_tmp = NULL;
    Py_ssize_t n;
    if (!same_length(b, 4, &n)) goto done;
    if (b[4].len != n || b[5].len != n || (b[6].len && b[6].len != n * (Py_ssize_t)sizeof(int64_t))) {
        PyErr_SetString(PyExc_ValueError, "level_valid and group: one byte a span; order: none or every span");
        goto done;
    }
    const int64_t *tid = b[0].buf, *ts = b[1].buf, *end = b[2].buf, *level = b[3].buf, *order = b[6].buf;
    const uint8_t *level_valid = b[4].buf;
    const int8_t *group = b[5].buf;
    int given = b[6].len > 0;
    for (Py_ssize_t i = 0; i < n && given; i++) {
        if (order[i] < 0 || order[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "order: span indices");
            goto done;
        }
    }
    self_obj = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (!self_obj) goto done;
    int64_t *self_us = (int64_t *)PyByteArray_AS_STRING(self_obj);
    memset(self_us, 0, n * sizeof(int64_t));
    orphan_obj = PyByteArray_FromStringAndSize(NULL, n);
    opener_obj = PyByteArray_FromStringAndSize(NULL, n);
    if (!orphan_obj || !opener_obj) goto done;
    uint8_t *orphan = (uint8_t *)PyByteArray_AS_STRING(orphan_obj);
    uint8_t *opener = (uint8_t *)PyByteArray_AS_STRING(opener_obj);
    memset(orphan, 0, n);
    memset(opener, 0, n);
    Py_ssize_t size = n ? n : 1;
    keys = malloc(size * sizeof(SpanKey));
    key_tmp = malloc(size * sizeof(SpanKey));
    threads = malloc(size * sizeof(Thread));
    thread_tmp = malloc(size * sizeof(Thread));
    int ok = keys && key_tmp && threads && thread_tmp;
    /* The stack doubles as the heap of open levels: a push for each change, 2 a span. */
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++)
        ok &= (*arrays[i] = malloc((arrays[i] == &w.stack ? 2 : 1) * size * sizeof(int64_t))) != NULL;
    ok &= (w.closes = malloc(size * sizeof(Close))) != NULL;
    ok &= (w.reversed = malloc(size * sizeof(Pair))) != NULL;
    ok &= (w.pair_tmp = malloc(size * sizeof(Pair))) != NULL;
    if (!ok) { PyErr_NoMemory(); goto done; }
    int failed = 0, tied = 0, edges_wide = 0;
    Py_BEGIN_ALLOW_THREADS
    if (given) {
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t j = order[i];
            keys[i] = (SpanKey){tid[j], ts[j], end[j], j};
        }
    } else {
        /* The reversed spans' lists, not yet in use, hold the radix sort's pairs. */
        if (!radix_spans(tid, ts, end, n, keys, (Keyed *)w.reversed, (Keyed *)w.pair_tmp, key_tmp)) {
            for (Py_ssize_t i = 0; i < n; i++) keys[i] = (SpanKey){tid[i], ts[i], end[i], (int64_t)i};
            sort_spans(keys, key_tmp, n);
        }
        for (Py_ssize_t i = 1; i < n && !tied; i++)
            tied = keys[i].tid == keys[i - 1].tid && keys[i].ts == keys[i - 1].ts && keys[i].end == keys[i - 1].end;
    }
    /* Threads in the order they first appear, as the numpy path partitions them. */
    Py_ssize_t n_threads = 0;
    for (Py_ssize_t i = 0; i < n && !tied; i++) {
        if (!i || keys[i].tid != keys[i - 1].tid) threads[n_threads++] = (Thread){keys[i].idx, i, i};
        if (keys[i].idx < threads[n_threads - 1].first_span) threads[n_threads - 1].first_span = keys[i].idx;
        threads[n_threads - 1].end = i + 1;
    }
    sort_threads(threads, thread_tmp, n_threads);
    for (Py_ssize_t t = 0; t < n_threads && !failed; t++) {
        const Thread *th = &threads[t];
        failed = paint_thread(keys + th->begin, th->end - th->begin, level, level_valid, group, &w, &runs,
                              self_us, orphan, opener, &edges_wide) < 0;
    }
    Py_END_ALLOW_THREADS
    if (failed) { PyErr_NoMemory(); goto done; }
    if (tied) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (edges_wide) {
        Py_SETREF(orphan_obj, Py_NewRef(Py_None));
        Py_SETREF(opener_obj, Py_NewRef(Py_None));
    }
    result = Py_BuildValue("(NNNOOO)", bytes_of(runs.groups, runs.n), bytes_of(runs.starts, runs.n * 8),
                           bytes_of(runs.ends, runs.n * 8), self_obj, orphan_obj, opener_obj);
done:
    Py_XDECREF(self_obj);
    Py_XDECREF(orphan_obj);
    Py_XDECREF(opener_obj);
    runs_free(&runs);
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++) free(*arrays[i]);
    free(w.closes);
    free(w.reversed);
    free(w.pair_tmp);
    free(keys);
    free(key_tmp);
    free(threads);
    free(thread_tmp);
    for (int i = 0; i < 7; i++) PyBuffer_Release(&b[i]);
    return result;
}

PyObject *sweeps_union(PyObject *self, PyObject *args) {
    Py_buffer b[3];
    memset(b, 0, sizeof(b));
    Py_ssize_t n_keys;
    if (!PyArg_ParseTuple(args, "y*y*y*n:union", &b[0], &b[1], &b[2], &n_keys)) {
        for (int i = 0; i < 3; i++) if (b[i].obj) PyBuffer_Release(&b[i]);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t *at = NULL, *fill = NULL;
    KeyRuns *order = NULL;
    Pair *pairs = NULL, *tmp = NULL;
    int64_t *firsts = NULL;
    Runs runs = {0};
    Py_ssize_t n;
    if (!same_length(b, 3, &n)) goto done;
    const int64_t *key = b[0].buf, *starts = b[1].buf, *ends = b[2].buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (key[i] < 0 || key[i] >= n_keys) {
            PyErr_SetString(PyExc_ValueError, "keys: 0 to n_keys - 1");
            goto done;
        }
    }
    at = calloc(n_keys + 1, sizeof(Py_ssize_t));
    fill = malloc((n_keys + 1) * sizeof(Py_ssize_t));
    order = malloc((n_keys + 1) * sizeof(KeyRuns));
    pairs = malloc((n + 1) * sizeof(Pair));
    if (!at || !fill || !order || !pairs) { PyErr_NoMemory(); goto done; }
    int failed = 0;
    Py_ssize_t n_order_keys = 0;
    Py_BEGIN_ALLOW_THREADS
    /* Each key's intervals, in the order given, keys in the order they first appear. */
    for (Py_ssize_t i = 0; i < n; i++) at[key[i] + 1]++;
    for (Py_ssize_t k = 0; k < n_keys; k++) at[k + 1] += at[k];
    memcpy(fill, at, (n_keys + 1) * sizeof(Py_ssize_t));
    n_order_keys = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (fill[key[i]] == at[key[i]]) order[n_order_keys++] = (KeyRuns){(int64_t)i, key[i], 0};
        pairs[fill[key[i]]++] = (Pair){starts[i], ends[i]};
    }
    for (Py_ssize_t o = 0; o < n_order_keys && !failed; o++) {
        Pair *p = pairs + at[order[o].key];
        Py_ssize_t m = at[order[o].key + 1] - at[order[o].key];
        Py_ssize_t sorted = 1;
        for (Py_ssize_t i = 1; i < m && sorted; i++) sorted = p[i - 1].start <= p[i].start;
        if (!sorted) {  /* stable, as np.argsort(kind="stable"); its work space is taken only
                         * here: intervals unioned before (a file's pieces') come in order */
            if (!tmp) failed = (tmp = malloc((n + 1) * sizeof(Pair))) == NULL;
            if (failed) break;
            sort_pairs(p, tmp, m);
        }
        /* A run ends where an interval starts after everything before it ended. */
        int64_t run_start = p[0].start, run_end = p[0].end, reach = p[0].end;
        Py_ssize_t first_run = runs.n;
        for (Py_ssize_t i = 1; i < m && !failed; i++) {
            if (p[i].start > reach) {
                failed = runs_append(&runs, 0, run_start, run_end) < 0;
                run_start = p[i].start;
                run_end = p[i].end;
            } else if (p[i].end > run_end) {
                run_end = p[i].end;
            }
            if (p[i].end > reach) reach = p[i].end;
        }
        if (!failed) failed = runs_append(&runs, 0, run_start, run_end) < 0;
        order[o].runs = runs.n - first_run;
    }
    Py_END_ALLOW_THREADS
    if (failed) { PyErr_NoMemory(); goto done; }
    /* Each run's row of its key (the first with it): the caller takes the key's values there. */
    firsts = malloc((runs.n + 1) * sizeof(int64_t));
    if (!firsts) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t o = 0, r = 0; o < n_order_keys; o++)
        for (int64_t j = 0; j < order[o].runs; j++) firsts[r++] = order[o].row;
    result = Py_BuildValue("(NNN)", bytes_of(firsts, runs.n * 8), bytes_of(runs.starts, runs.n * 8),
                           bytes_of(runs.ends, runs.n * 8));
done:
    free(at);
    free(fill);
    free(order);
    free(pairs);
    free(tmp);
    free(firsts);
    runs_free(&runs);
    for (int i = 0; i < 3; i++) PyBuffer_Release(&b[i]);
    return result;
}

PyObject *sweeps_masks(PyObject *self, PyObject *args) {
    Py_buffer b[3];
    memset(b, 0, sizeof(b));
    Py_ssize_t size;
    int alone;
    if (!PyArg_ParseTuple(args, "y*y*y*ni:masks", &b[0], &b[1], &b[2], &size, &alone)) {
        for (int i = 0; i < 3; i++) if (b[i].obj) PyBuffer_Release(&b[i]);
        return NULL;
    }
    PyObject *result = NULL;
    int64_t *keys = NULL, *tmp = NULL;
    int64_t totals[256] = {0};
    Runs runs = {0};
    Py_ssize_t n;
    if (!same_length(b, 3, &n)) goto done;
    if (size < 0 || size > 256) { PyErr_SetString(PyExc_ValueError, "size: 0 to 256"); goto done; }
    const int64_t *group = b[0].buf, *starts = b[1].buf, *ends = b[2].buf;
    Py_ssize_t m = 2 * n;
    keys = malloc((m ? m : 1) * sizeof(int64_t));
    tmp = malloc((m ? m : 1) * sizeof(int64_t));
    if (!keys || !tmp) { PyErr_NoMemory(); goto done; }
    int failed = 0, top = -1;
    Py_BEGIN_ALLOW_THREADS
    /* Each boundary is one integer, time * 8 + group, as the numpy sweep sorts them.
     * A group's boundaries (the last three bits) are in order when its intervals are
     * disjoint and sorted, as after a union: sorted lists merged, not one big sort. */
    Py_ssize_t at[9] = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        at[(((uint64_t)starts[i] * 8 + (uint64_t)group[i]) & 7) + 1]++;
        at[(((uint64_t)ends[i] * 8 + (uint64_t)group[i]) & 7) + 1]++;
    }
    for (int g = 0; g < 8; g++) at[g + 1] += at[g];
    Py_ssize_t fill[8];
    memcpy(fill, at, sizeof(fill));
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t start = (int64_t)((uint64_t)starts[i] * 8 + (uint64_t)group[i]);
        int64_t end = (int64_t)((uint64_t)ends[i] * 8 + (uint64_t)group[i]);
        keys[fill[start & 7]++] = start;
        keys[fill[end & 7]++] = end;
    }
    for (int g = 0; g < 8; g++) {
        int in_order = 1;
        for (Py_ssize_t i = at[g] + 1; i < at[g + 1] && in_order; i++) in_order = keys[i - 1] <= keys[i];
        if (!in_order) sort_keys(keys + at[g], tmp, at[g + 1] - at[g]);
    }
    Py_ssize_t head[8];
    memcpy(head, at, sizeof(head));
    unsigned state = 0;
    int64_t previous = 0;
    for (Py_ssize_t i = 0; i < m && !failed; i++) {
        int best = -1;
        for (int g = 0; g < 8; g++)
            if (head[g] < at[g + 1] && (best < 0 || keys[head[g]] < keys[head[best]])) best = g;
        int64_t key = keys[head[best]++], time = key >> 3;
        if (i) {  /* the state from the previous boundary to this one */
            totals[state] += time - previous;
            if ((int)state > top) top = (int)state;
            if (alone >= 0 && (int)state == alone && time > previous)
                failed = runs_push(&runs, 0, previous, time) < 0;
        }
        state ^= 1u << (key & 7);
        previous = time;
    }
    Py_END_ALLOW_THREADS
    if (failed) { PyErr_NoMemory(); goto done; }
    if (top + 1 > size) size = top + 1;
    result = Py_BuildValue("(NNN)", bytes_of(totals, size * 8), bytes_of(runs.starts, runs.n * 8),
                           bytes_of(runs.ends, runs.n * 8));
done:
    free(keys);
    free(tmp);
    runs_free(&runs);
    for (int i = 0; i < 3; i++) PyBuffer_Release(&b[i]);
    return result;
}

/* One run of a piece given to cover(): intervals of one group, by start, each
 * starting at or after the last one's end; its boundaries come in time order. */
typedef struct {
    const int64_t *starts, *ends;
    Py_ssize_t at, n;  /* the interval whose boundary is next, of n */
    int closing;       /* that boundary is its end */
    int group;
} Cursor;

static inline int64_t cursor_time(const Cursor *c) { return c->closing ? c->ends[c->at] : c->starts[c->at]; }

/* A heap of cursors by the time of their next boundary, least first. */
static void cursor_sift(Cursor *h, Py_ssize_t n, Py_ssize_t i) {
    Cursor x = h[i];
    int64_t t = cursor_time(&x);
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && cursor_time(&h[child + 1]) < cursor_time(&h[child])) child++;
        if (t <= cursor_time(&h[child])) break;
        h[i] = h[child];
        i = child;
    }
    h[i] = x;
}

/* The most runs cover() merges; pieces made of more are swept after a union. */
#define MAX_CURSORS 65536

PyObject *sweeps_cover(PyObject *self, PyObject *args) {
    PyObject *pieces_obj;
    Py_ssize_t size;
    int alone, emit;
    if (!PyArg_ParseTuple(args, "Onii:cover", &pieces_obj, &size, &alone, &emit)) return NULL;
    if (size < 0 || size > 256) { PyErr_SetString(PyExc_ValueError, "size: 0 to 256"); return NULL; }
    PyObject *pieces = PySequence_Fast(pieces_obj, "cover: a sequence of (group, start, end) expected");
    if (!pieces) return NULL;
    Py_ssize_t n_pieces = PySequence_Fast_GET_SIZE(pieces), n_views = 0;
    PyObject *result = NULL;
    Py_buffer *views = calloc(3 * (size_t)n_pieces + 1, sizeof(Py_buffer));
    Cursor *heap = NULL;
    Runs alone_runs = {0}, emit_runs = {0};
    int64_t totals[256] = {0};
    if (!views) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t p = 0; p < n_pieces; p++) {
        Py_buffer *v = views + 3 * p;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(pieces, p), "y*y*y*:cover", &v[0], &v[1], &v[2])) {
            for (int i = 0; i < 3; i++) if (v[i].obj) PyBuffer_Release(&v[i]);
            goto done;
        }
        n_views = 3 * (p + 1);
        Py_ssize_t n = v[0].len;
        if (v[1].len != n * 8 || v[2].len != n * 8) {
            PyErr_SetString(PyExc_ValueError, "cover: group (int8), start and end (int64) of one length expected");
            goto done;
        }
    }
    /* The runs of every piece, or None where there are too many or an interval ends
     * before it starts. */
    Py_ssize_t n_cursors = 0;
    heap = malloc(sizeof(Cursor) * (MAX_CURSORS + 1));
    if (!heap) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t p = 0; p < n_pieces; p++) {
        const int8_t *g = views[3 * p].buf;
        const int64_t *s = views[3 * p + 1].buf, *e = views[3 * p + 2].buf;
        Py_ssize_t n = views[3 * p].len;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (e[i] < s[i] || g[i] < 0 || g[i] > 7) { result = Py_NewRef(Py_None); goto done; }
            if (i && g[i] == g[i - 1] && s[i] >= e[i - 1]) { heap[n_cursors - 1].n++; continue; }
            if (n_cursors == MAX_CURSORS) { result = Py_NewRef(Py_None); goto done; }
            heap[n_cursors++] = (Cursor){s + i, e + i, 0, 1, 0, g[i]};
        }
    }
    int failed = 0, top = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = n_cursors / 2; i-- > 0;) cursor_sift(heap, n_cursors, i);
    int64_t open[8] = {0}, previous = 0;
    unsigned state = 0;
    int first = 1;
    while (n_cursors && !failed) {
        Cursor *c = &heap[0];
        int64_t time = cursor_time(c);
        if (!first && time > previous) {  /* the state from the previous boundary to this one */
            totals[state] += time - previous;
            if ((int)state > top) top = (int)state;
            if (alone >= 0 && (int)state == alone) failed |= runs_push(&alone_runs, 0, previous, time) < 0;
            if (emit >= 0 && (state & (unsigned)emit)) failed |= runs_push(&emit_runs, 0, previous, time) < 0;
        }
        first = 0;
        if (c->closing) {
            if (--open[c->group] == 0) state &= ~(1u << c->group);
            c->closing = 0;
            c->at++;
        } else {
            if (open[c->group]++ == 0) state |= 1u << c->group;
            c->closing = 1;
        }
        previous = time;
        if (c->at == c->n) heap[0] = heap[--n_cursors];
        if (n_cursors) cursor_sift(heap, n_cursors, 0);
    }
    Py_END_ALLOW_THREADS
    if (failed) { PyErr_NoMemory(); goto done; }
    if (top + 1 > size) size = top + 1;
    result = Py_BuildValue("(NNNNN)", bytes_of(totals, size * 8), bytes_of(alone_runs.starts, alone_runs.n * 8),
                           bytes_of(alone_runs.ends, alone_runs.n * 8), bytes_of(emit_runs.starts, emit_runs.n * 8),
                           bytes_of(emit_runs.ends, emit_runs.n * 8));
done:
    for (Py_ssize_t i = 0; i < n_views; i++) PyBuffer_Release(&views[i]);
    free(views);
    free(heap);
    runs_free(&alone_runs);
    runs_free(&emit_runs);
    Py_DECREF(pieces);
    return result;
}

/* Sorts ``values`` (each with its idx) by value, ties in the order given. */
static void sort_by_value(Keyed *a, Keyed *tmp, const int64_t *values, Py_ssize_t n) {
    int64_t low = n ? values[a[0].idx] : 0;
    for (Py_ssize_t i = 1; i < n; i++) if (values[a[i].idx] < low) low = values[a[i].idx];
    for (Py_ssize_t i = 0; i < n; i++) a[i].key = (uint64_t)values[a[i].idx] - (uint64_t)low;
    radix_sort(a, tmp, n);
}

/* ``block`` cut down to ``size`` bytes, the rest handed back to the heap (the same
 * block where it cannot be cut). */
static void *shrunk(void *block, size_t size) {
    void *cut = realloc(block, size);
    return cut ? cut : block;
}

/* For a kernel that takes rows by their ``code`` (0 or more, checked): the radix
 * sort's pairs and work space, and each of ``arrays`` (n int64 each, one at least).
 * 1 when all are had, else 0 with the Python error set (the caller frees them all). */
static int keyed_rows(const int64_t *code, Py_ssize_t n, Keyed **pairs, Keyed **tmp, int64_t **const *arrays,
                      size_t n_arrays) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (code[i] < 0) { PyErr_SetString(PyExc_ValueError, "code: 0 or more"); return 0; }
    }
    Py_ssize_t size = n ? n : 1;
    int ok = (*pairs = malloc(size * sizeof(Keyed))) != NULL;
    ok &= (*tmp = malloc(size * sizeof(Keyed))) != NULL;
    for (size_t i = 0; i < n_arrays; i++) ok &= (*arrays[i] = malloc(size * sizeof(int64_t))) != NULL;
    if (!ok) PyErr_NoMemory();
    return ok;
}

/* How many of the m sorted ``values`` are below x (or at most x when ``or_equal``). */
static Py_ssize_t count_below(const int64_t *values, Py_ssize_t m, int64_t x, int or_equal) {
    Py_ssize_t lo = 0, hi = m;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (values[mid] < x || (or_equal && values[mid] == x)) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* The same, searched from ``hint`` (an earlier answer) outwards: a few steps where
 * the values searched for come nearly in order. */
static Py_ssize_t count_below_near(const int64_t *values, Py_ssize_t m, int64_t x, int or_equal, Py_ssize_t hint) {
#define BELOW(j) (values[j] < x || (or_equal && values[j] == x))
    Py_ssize_t lo, hi, step = 1;
    if (hint > m) hint = m;
    if (hint < m && BELOW(hint)) {
        lo = hint + 1;
        while (lo + step - 1 < m && BELOW(lo + step - 1)) { lo += step; step *= 2; }
        hi = lo + step - 1 < m ? lo + step - 1 : m;
    } else {
        hi = hint;
        while (hi - step >= 0 && !BELOW(hi - step)) { hi -= step; step *= 2; }
        lo = hi - step >= 0 ? hi - step + 1 : 0;
    }
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (BELOW(mid)) lo = mid + 1; else hi = mid;
    }
    return lo;
#undef BELOW
}

/* Whether ``at`` lies in the pipeline span that began last at or before it (``cuts``:
 * their sorted starts, ``cut_ends`` their ends, or NULL) and that span ended by
 * ``until``: an evaluation's fetch, which is not the next step's. */
static int inside_ended(const int64_t *cuts, const int64_t *cut_ends, Py_ssize_t n_cuts, int64_t at, int64_t until) {
    if (!cut_ends) return 0;
    Py_ssize_t last = count_below(cuts, n_cuts, at, 1) - 1;
    return last >= 0 && cut_ends[last] > at && cut_ends[last] <= until;
}

/* steps(code, start, end, n, is_work, cuts, epoch_span[, after_work[, cut_ends[, pass_ends]]]): one
 * process's steps, as _steps._placed_numpy places them from its rows (one a step and name):
 * ``code`` numbers each row's (epoch, step), in their order, with the epoch's place in
 * code / epoch_span; ``is_work`` one byte a row; ``cuts`` the sorted starts of the
 * pipeline spans (``cut_ends`` their ends); ``after_work`` those of the spans that
 * end a step only once its work has ended (a checkpoint saved between steps);
 * ``pass_ends`` the sorted starts of the calls that found a loader's pass over (the
 * last step of an epoch runs until the next of them, before the next step). The
 * rows are taken in the order of their codes (nearly that of time), so each pass runs
 * through memory in order. The steps come back in time order: a row of each (its
 * epoch and step), its start and end, its event count. */
PyObject *sweeps_steps(PyObject *self, PyObject *args) {
    Py_buffer b[9];
    memset(b, 0, sizeof(b));
    int64_t epoch_span;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*L|y*y*y*:steps", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &epoch_span,
                          &b[6], &b[7], &b[8])) {
        for (int i = 0; i < 9; i++) if (b[i].obj) PyBuffer_Release(&b[i]);
        return NULL;
    }
    PyObject *result = NULL;
    Keyed *pairs = NULL, *tmp = NULL;
    /* Rows in key order: the row, its key and its step. */
    int64_t *row = NULL, *key = NULL, *target = NULL;
    int64_t **arrays[] = {&row, &key, &target};
    /* By key or by step, as many as there are keys (a few rows each): allocated once
     * the rows are sorted and the keys counted. */
    int64_t *first = NULL, *known = NULL, *rank_of = NULL, *row_of = NULL, *step_start = NULL, *work_end = NULL,
            *earliest = NULL, *last_end = NULL, *counts = NULL, *step_end = NULL, *step_row = NULL;
    int64_t **by_key[] = {&first, &known, &rank_of, &row_of, &step_start, &work_end, &earliest, &last_end,
                          &counts, &step_end, &step_row};
    uint8_t *work = NULL, *keep = NULL, *has = NULL;
    Py_ssize_t n, n_cuts = b[5].len / (Py_ssize_t)sizeof(int64_t), n_after = b[6].len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t n_passes = b[8].len / (Py_ssize_t)sizeof(int64_t);
    if (!same_length(b, 4, &n)) goto done;
    if (b[4].len != n || b[5].len != n_cuts * (Py_ssize_t)sizeof(int64_t)
        || b[6].len != n_after * (Py_ssize_t)sizeof(int64_t) || epoch_span < 1
        || (b[7].obj && b[7].len != b[5].len) || b[8].len != n_passes * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "is_work: one byte a row; cuts, after_work, pass_ends: int64; "
                                          "epoch_span: 1 or more; cut_ends: one a cut");
        goto done;
    }
    const int64_t *pass_ends = b[8].obj ? b[8].buf : NULL;
    const int64_t *code = b[0].buf, *start = b[1].buf, *end = b[2].buf, *count = b[3].buf, *cuts = b[5].buf;
    const int64_t *cut_ends = b[7].obj ? b[7].buf : NULL;
    const int64_t *after_work = b[6].buf;
    const uint8_t *is_work = b[4].buf;
#define ST(j) start[row[j]]
#define EN(j) end[row[j]]
    if (!keyed_rows(code, n, &pairs, &tmp, arrays, sizeof(arrays) / sizeof(arrays[0]))) goto done;
    Py_ssize_t size = n ? n : 1;
    int ok = (work = malloc(size)) != NULL;
    ok &= (keep = malloc(size)) != NULL;
    if (!ok) { PyErr_NoMemory(); goto done; }
    Py_ssize_t n_keys = 0, n_steps = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) pairs[i] = (Keyed){(uint64_t)code[i], (int64_t)i};
    radix_sort(pairs, tmp, n);
    for (Py_ssize_t j = 0; j < n; j++) n_keys += !j || pairs[j].key != pairs[j - 1].key;
    Py_END_ALLOW_THREADS
    size = n_keys ? n_keys : 1;
    ok = (has = malloc(size)) != NULL;
    for (size_t i = 0; i < sizeof(by_key) / sizeof(by_key[0]); i++) ok &= (*by_key[i] = malloc(size * 8)) != NULL;
    if (!ok) { PyErr_NoMemory(); goto done; }
    n_keys = 0;
    Py_BEGIN_ALLOW_THREADS
    /* Each row's key, the place of its code among the distinct ones; row_of holds the
     * first row of each key (its epoch and step). */
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t i = pairs[j].idx;
        if (!j || pairs[j].key != pairs[j - 1].key) row_of[n_keys++] = i;
        key[j] = n_keys - 1;
        row[j] = i;
        work[j] = is_work[i] != 0;
    }
    /* From here the pairs and their work space sort keys, not rows: the rest of
     * them goes back to the heap while the steps are placed. */
    pairs = shrunk(pairs, size * sizeof(Keyed));
    tmp = shrunk(tmp, size * sizeof(Keyed));
    /* Each key's first start of work; then the spans that hold the starts of two or
     * more other steps are left out, and again. */
    memset(keep, 1, n);
    for (int pass = 0; pass < 2; pass++) {
        memset(has, 0, n_keys);
        for (Py_ssize_t j = 0; j < n; j++) {
            int64_t k = key[j];
            if (!work[j] || !keep[j]) continue;
            if (!has[k] || ST(j) < first[k]) first[k] = ST(j);
            has[k] = 1;
        }
        if (pass) break;
        Py_ssize_t m = 0;
        for (Py_ssize_t k = 0; k < n_keys; k++) if (has[k]) pairs[m++] = (Keyed){0, k};
        sort_by_value(pairs, tmp, first, m);
        for (Py_ssize_t j = 0; j < m; j++) known[j] = first[pairs[j].idx];
        Py_ssize_t below_end = 0, below_start = 0;  /* each search starts where the last ended */
        for (Py_ssize_t j = 0; j < n; j++) {
            int64_t k = key[j];
            below_end = count_below_near(known, m, EN(j), 0, below_end);
            below_start = count_below_near(known, m, ST(j), 1, below_start);
            int own = has[k] && first[k] > ST(j) && first[k] < EN(j);
            keep[j] = below_end - below_start - own < 2;
        }
    }
    /* The steps found, by their first start (ties by key). */
    for (Py_ssize_t k = 0; k < n_keys; k++) if (has[k]) pairs[n_steps++] = (Keyed){0, k};
    sort_by_value(pairs, tmp, first, n_steps);
    for (Py_ssize_t k = 0; k < n_keys; k++) rank_of[k] = -1;
    for (Py_ssize_t s = 0; s < n_steps; s++) {
        rank_of[pairs[s].idx] = s;
        step_start[s] = first[pairs[s].idx];
        step_row[s] = row_of[pairs[s].idx];
        work_end[s] = INT64_MIN;
        earliest[s] = INT64_MAX;
        last_end[s] = 0;
        counts[s] = 0;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t r = rank_of[key[j]];
        if (work[j] && keep[j] && r >= 0 && EN(j) > work_end[r]) work_end[r] = EN(j);
    }
    /* The least step forward from one step to the next of its epoch: a step further on
     * than that skips untraced ones (see _steps._skipped). */
    int64_t least_forward = INT64_MAX;
    for (Py_ssize_t s = 0; s + 1 < n_steps; s++) {
        int64_t a = code[step_row[s]], c = code[step_row[s + 1]];
        if (a / epoch_span == c / epoch_span && c > a && c - a < least_forward) least_forward = c - a;
    }
#define SAME_EPOCH(s) ((s) + 1 < n_steps && code[step_row[s]] / epoch_span == code[step_row[(s) + 1]] / epoch_span)
#define SKIPS(s) (SAME_EPOCH(s) && code[step_row[(s) + 1]] - code[step_row[s]] > least_forward)
    /* The step each data-loading row belongs to (see _steps._data_targets): none where
     * a loader's pass ends between the row and the step. */
#define PASS_BETWEEN(j, s) (count_below(pass_ends, n_passes, ST(j), 1) < count_below(pass_ends, n_passes, step_start[s], 0))
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t r = rank_of[key[j]];
        target[j] = -1;
        if (work[j] || !keep[j] || r < 0) continue;
        if (ST(j) > (r ? step_start[r - 1] : INT64_MIN) && ST(j) < work_end[r]) {
            if (!PASS_BETWEEN(j, r)) target[j] = r;
        } else if (ST(j) >= work_end[r] && r + 1 < n_steps && !SKIPS(r)
                   && count_below(cuts, n_cuts, step_start[r + 1], 0) == count_below(cuts, n_cuts, ST(j), 1)
                   && !inside_ended(cuts, cut_ends, n_cuts, ST(j), step_start[r + 1]) && !PASS_BETWEEN(j, r + 1)) {
            target[j] = r + 1;
        }
    }
#undef PASS_BETWEEN
    for (Py_ssize_t j = 0; j < n; j++)
        if (target[j] >= 0 && ST(j) < earliest[target[j]]) earliest[target[j]] = ST(j);
    for (Py_ssize_t s = 0; s < n_steps; s++) if (earliest[s] < step_start[s]) step_start[s] = earliest[s];
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t owner = work[j] ? rank_of[key[j]] : target[j];
        if (!keep[j] || owner < 0) continue;
        if (EN(j) > last_end[owner]) last_end[owner] = EN(j);
        counts[owner] += count[row[j]];
    }
    /* A step ends where the next of its epoch starts (unless that one skips untraced
     * steps), else with its last span, or, the last of its epoch, at the end of its
     * loader's pass found after its start (before the next step: spans after the loop
     * that still carry its number are not its); a pipeline span starting
     * inside it ends it there, and one of after_work starting once its work has ended. */
    for (Py_ssize_t s = 0; s < n_steps; s++) {
        int64_t e = SAME_EPOCH(s) && !SKIPS(s) ? step_start[s + 1] : last_end[s];
        if (!SAME_EPOCH(s) && n_passes) {
            Py_ssize_t p = count_below(pass_ends, n_passes, step_start[s], 1);
            if (p < n_passes && (s + 1 == n_steps || pass_ends[p] < step_start[s + 1])) e = pass_ends[p];
        }
        Py_ssize_t next_cut = count_below(cuts, n_cuts, step_start[s], 1);
        if (next_cut < n_cuts && cuts[next_cut] < e) e = cuts[next_cut];
        int64_t worked = work_end[s] > step_start[s] ? work_end[s] : step_start[s];
        Py_ssize_t next_after = count_below(after_work, n_after, worked, 0);
        if (next_after < n_after && after_work[next_after] < e) e = after_work[next_after];
        step_end[s] = e > step_start[s] ? e : step_start[s];
    }
    Py_END_ALLOW_THREADS
#undef ST
#undef EN
#undef SAME_EPOCH
#undef SKIPS
    result = Py_BuildValue("(NNNN)", bytes_of(step_row, n_steps * 8), bytes_of(step_start, n_steps * 8),
                           bytes_of(step_end, n_steps * 8), bytes_of(counts, n_steps * 8));
done:
    free(pairs);
    free(tmp);
    for (size_t i = 0; i < sizeof(arrays) / sizeof(arrays[0]); i++) free(*arrays[i]);
    for (size_t i = 0; i < sizeof(by_key) / sizeof(by_key[0]); i++) free(*by_key[i]);
    free(work);
    free(keep);
    free(has);
    for (int i = 0; i < 9; i++) if (b[i].obj) PyBuffer_Release(&b[i]);
    return result;
}

/* across(code, start, dur, order): each step's ranks compared, as answers.steps.steps_across_units'
 * query compares them: ``code`` numbers each row's (epoch, step) (one row a rank and
 * step), ``order`` is the rank's place. For each step, in the order of the codes: a
 * row of it, its rows, the least start, the least, median (the lower middle) and
 * greatest duration, and the row of the slowest rank (the longest; ties to the
 * least order, then to the first row). */
PyObject *sweeps_across(PyObject *self, PyObject *args) {
    Py_buffer b[4];
    memset(b, 0, sizeof(b));
    if (!PyArg_ParseTuple(args, "y*y*y*y*:across", &b[0], &b[1], &b[2], &b[3])) {
        for (int i = 0; i < 4; i++) if (b[i].obj) PyBuffer_Release(&b[i]);
        return NULL;
    }
    PyObject *result = NULL;
    int64_t *order = NULL, *spare = NULL;
    int64_t *row = NULL, *count = NULL, *first = NULL, *low = NULL, *middle = NULL, *high = NULL, *slowest = NULL,
            *durs = NULL, *scratch = NULL;
    int64_t **per_step[] = {&row, &count, &first, &low, &middle, &high, &slowest};
    Py_ssize_t n, n_steps = 0, widest = 1;
    if (!same_length(b, 4, &n)) goto done;
    const int64_t *code = b[0].buf, *start = b[1].buf, *dur = b[2].buf, *order_of = b[3].buf;
    int64_t top = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (code[i] < 0) { PyErr_SetString(PyExc_ValueError, "code: 0 or more"); goto done; }
        if (code[i] > top) top = code[i];
    }
    /* The rows in the order of their codes, each code's in the order given: a radix
     * sort of the rows' numbers by their codes, 16 bytes a row (pairs of code and row
     * took 32); where the codes are fewer than the rows (a step's ranks a code, the
     * epochs numbering their steps from 0), counted into place in one pass. */
    Py_ssize_t size = n ? n : 1;
    int dense = top + 2 <= (int64_t)size;
    int ok = (order = malloc(size * sizeof(int64_t))) != NULL && (spare = malloc(size * sizeof(int64_t))) != NULL;
    if (!ok) { PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    if (dense) {
        int64_t *ends = spare;  /* each code's place, then the end of its rows */
        memset(ends, 0, (size_t)(top + 2) * sizeof(int64_t));
        for (Py_ssize_t i = 0; i < n; i++) ends[code[i] + 1]++;
        for (int64_t c = 0; c <= top; c++) ends[c + 1] += ends[c];
        for (Py_ssize_t i = 0; i < n; i++) order[ends[code[i]]++] = i;
    } else {
        Py_ssize_t digits[2049];
        int64_t *from = order, *to = spare;  /* each pass from one array into the other */
        for (Py_ssize_t i = 0; i < n; i++) from[i] = i;
        for (int shift = 0; shift < 64 && ((uint64_t)top >> shift); shift += 11) {
            memset(digits, 0, sizeof(digits));
            for (Py_ssize_t i = 0; i < n; i++) digits[(((uint64_t)code[from[i]] >> shift) & 2047) + 1]++;
            for (int d = 0; d < 2048; d++) digits[d + 1] += digits[d];
            for (Py_ssize_t i = 0; i < n; i++) to[digits[((uint64_t)code[from[i]] >> shift) & 2047]++] = from[i];
            int64_t *swap = from;
            from = to;
            to = swap;
        }
        if (from != order) memcpy(order, from, n * sizeof(int64_t));
    }
    /* The steps and the most ranks of one: each array is sized by what it holds. */
    for (Py_ssize_t j = 0; j < n;) {
        Py_ssize_t end = j + 1;
        while (end < n && code[order[end]] == code[order[j]]) end++;
        if (end - j > widest) widest = end - j;
        n_steps++;
        j = end;
    }
    Py_END_ALLOW_THREADS
    free(spare);
    spare = NULL;
    Py_ssize_t steps_size = n_steps ? n_steps : 1;
    ok = (durs = malloc(widest * sizeof(int64_t))) != NULL && (scratch = malloc(widest * sizeof(int64_t))) != NULL;
    for (size_t i = 0; i < sizeof(per_step) / sizeof(per_step[0]); i++)
        ok &= (*per_step[i] = malloc(steps_size * sizeof(int64_t))) != NULL;
    if (!ok) { PyErr_NoMemory(); goto done; }
    n_steps = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n;) {
        Py_ssize_t end = j + 1;
        while (end < n && code[order[end]] == code[order[j]]) end++;
        int64_t i = order[j], best = i, least = start[i];
        for (Py_ssize_t k = j; k < end; k++) {
            int64_t r = order[k];
            durs[k - j] = dur[r];
            if (start[r] < least) least = start[r];
            if (dur[r] > dur[best] || (dur[r] == dur[best] && order_of[r] < order_of[best])) best = r;
        }
        Py_ssize_t m = end - j;
        sort_keys(durs, scratch, m);
        row[n_steps] = i;
        count[n_steps] = m;
        first[n_steps] = least;
        low[n_steps] = durs[0];
        middle[n_steps] = durs[(m - 1) / 2];
        high[n_steps] = durs[m - 1];
        slowest[n_steps] = best;
        n_steps++;
        j = end;
    }
    Py_END_ALLOW_THREADS
    free(order);
    order = NULL;
    result = Py_BuildValue("(NNNNNNN)", bytes_of(row, n_steps * 8), bytes_of(count, n_steps * 8),
                           bytes_of(first, n_steps * 8), bytes_of(low, n_steps * 8), bytes_of(middle, n_steps * 8),
                           bytes_of(high, n_steps * 8), bytes_of(slowest, n_steps * 8));
done:
    free(order);
    free(spare);
    free(durs);
    free(scratch);
    for (size_t i = 0; i < sizeof(per_step) / sizeof(per_step[0]); i++) free(*per_step[i]);
    for (int i = 0; i < 4; i++) PyBuffer_Release(&b[i]);
    return result;
}

/* A hash of the k keys at p: trace keys are small integers and codes. */
static uint64_t hash_keys(const int64_t *p, Py_ssize_t k) {
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    for (Py_ssize_t j = 0; j < k; j++) {
        h = (h ^ (uint64_t)p[j]) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
    }
    return h;
}

/* extents(keys, k, start, end, values, taken): the extent of each group of rows with
 * the same k keys (``keys`` row by row, k int64 a row), of the rows ``taken`` marks
 * (one byte a row), as a group_by of min(start), max(end), len() and sum(values) gives
 * them (``values`` may be empty: no sums). Groups come back in the order they first
 * appear: a row of each, its least start, greatest end, rows and sum. */
PyObject *sweeps_extents(PyObject *self, PyObject *args) {
    Py_buffer b[5];
    Py_ssize_t k;
    memset(b, 0, sizeof(b));
    if (!PyArg_ParseTuple(args, "y*ny*y*y*y*:extents", &b[0], &k, &b[1], &b[2], &b[3], &b[4])) {
        for (int i = 0; i < 5; i++) if (b[i].obj) PyBuffer_Release(&b[i]);
        return NULL;
    }
    PyObject *result = NULL;
    int64_t *row = NULL, *low = NULL, *high = NULL, *count = NULL, *sum = NULL;
    int32_t *slots = NULL;
    Py_ssize_t n;
    if (!same_length(b + 1, 2, &n)) goto done;
    if (k < 1 || b[0].len != n * k * (Py_ssize_t)sizeof(int64_t) || b[4].len != n
        || (b[3].len && b[3].len != n * (Py_ssize_t)sizeof(int64_t))) {
        PyErr_SetString(PyExc_ValueError,
                        "keys: k int64 a row, one key at least; values: none or one int64 a row; taken: one byte a row");
        goto done;
    }
    if (n >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "too many rows");
        goto done;
    }
    const int64_t *keys = b[0].buf, *start = b[1].buf, *end = b[2].buf, *values = b[3].len ? b[3].buf : NULL;
    const uint8_t *taken = b[4].buf;
    Py_ssize_t size = n ? n : 1, n_slots = 64;
    while (n_slots < 2 * size) n_slots *= 2;
    row = malloc(size * sizeof(int64_t));
    low = malloc(size * sizeof(int64_t));
    high = malloc(size * sizeof(int64_t));
    count = malloc(size * sizeof(int64_t));
    sum = malloc(size * sizeof(int64_t));
    slots = malloc(n_slots * sizeof(int32_t));
    if (!row || !low || !high || !count || !sum || !slots) { PyErr_NoMemory(); goto done; }
    Py_ssize_t n_groups = 0;
    Py_BEGIN_ALLOW_THREADS
    memset(slots, 0xff, n_slots * sizeof(int32_t));
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!taken[i]) continue;
        const int64_t *key = keys + i * k;
        Py_ssize_t s = (Py_ssize_t)(hash_keys(key, k) & (uint64_t)(n_slots - 1));
        int32_t g;
        while ((g = slots[s]) >= 0 && memcmp(keys + row[g] * k, key, k * sizeof(int64_t)) != 0)
            s = (s + 1) & (n_slots - 1);
        if (g < 0) {
            g = (int32_t)n_groups++;
            slots[s] = g;
            row[g] = i;
            low[g] = start[i];
            high[g] = end[i];
            count[g] = 1;
            sum[g] = values ? values[i] : 0;
        } else {
            if (start[i] < low[g]) low[g] = start[i];
            if (end[i] > high[g]) high[g] = end[i];
            count[g]++;
            if (values) sum[g] = (int64_t)((uint64_t)sum[g] + (uint64_t)values[i]);
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(NNNNN)", bytes_of(row, n_groups * 8), bytes_of(low, n_groups * 8),
                           bytes_of(high, n_groups * 8), bytes_of(count, n_groups * 8),
                           bytes_of(sum, values ? n_groups * 8 : 0));
done:
    free(row);
    free(low);
    free(high);
    free(count);
    free(sum);
    free(slots);
    for (int i = 0; i < 5; i++) PyBuffer_Release(&b[i]);
    return result;
}
