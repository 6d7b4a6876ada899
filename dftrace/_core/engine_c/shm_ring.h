/* shm_ring.h: shm_producer.c's side, the shared-memory ring this process records
 * into (writer="process"): shm_append, the ring's append on the hot path (inline:
 * a span pays no call across files), and the state it reads. */
#ifndef DFTRACE_SHM_RING_H
#define DFTRACE_SHM_RING_H

#include "common.h"

DFT_HIDDEN_BEGIN

/* The ring's layout is in common.h; here the producer's side (shm_producer.c):
   the state the inline append reads, and the functions behind it. */
extern shm_hdr_t *dft_shm;        /* attached: records go to the ring */
extern shm_slot_t *dft_shm_cur;   /* the FILLING slot */
extern int dft_shm_sealed;        /* a slot was sealed since the last wake */
/* 1 while captures run beside the ring: records go to process memory, and the
   writer relays their lines to the ring (shm_append_line) as it hands them on. */
extern int dft_shm_local;
/* Spans in the ring not yet freed by the drainer, as last counted, plus those
   appended since: buffer_limit bounds the exact count (shm_held). */
extern Py_ssize_t dft_shm_est;
extern uint32_t dft_shm_cur_n, dft_shm_cur_alen; /* records and arena bytes of shm_cur */

void dft_shm_add_kind(const char *p, Py_ssize_t n);
void dft_shm_seal(void);
shm_slot_t *dft_shm_take(void);
int dft_shm_append_long(uint32_t kid, long long t0, long long t1, unsigned long long id,
                        unsigned long long p, Py_ssize_t lvl, unsigned long long tid,
                        uint32_t flags, long long count, const char *a, Py_ssize_t na,
                        const char *b, Py_ssize_t nb);
int dft_shm_at_limit(void);
Py_ssize_t dft_shm_held(void);


/* Append to the ring: 0, -1 (too long for the ring: dropped), -2 (ring full, or
   no longer this process's ring). */
static inline int shm_append(uint32_t kid, long long t0, long long t1, unsigned long long id,
                      unsigned long long p, Py_ssize_t lvl, unsigned long long tid,
                      uint32_t flags, long long count, const char *a, Py_ssize_t na,
                      const char *b, Py_ssize_t nb) {
    size_t need = (size_t)(na + nb);
    if (need > SHM_ARENA)
        return dft_shm_append_long(kid, t0, t1, id, p, lvl, tid, flags, count, a, na, b, nb);
    if (dft_shm_cur && (dft_shm_cur_n == CHUNK_RECS || dft_shm_cur_alen + need > SHM_ARENA))
        dft_shm_seal();
    if (!dft_shm_cur && !(dft_shm_cur = dft_shm_take()))
        return -2;
    shm_slot_t *c = dft_shm_cur;
    rec_t *r = &c->recs[dft_shm_cur_n];
    r->aoff = dft_shm_cur_alen;
    r->alen = (uint32_t)need;
    put_args(c->arena + dft_shm_cur_alen, a, na, b, nb);
    dft_shm_cur_alen += (uint32_t)need;
    c->alen = dft_shm_cur_alen;
    rec_fill(r, kid, t0, t1, id, p, lvl, tid, flags, count);
    if (flags & F_RAW)
        SLOT_RAW(c)++;
    else
        dft_shm_est++;
    __atomic_store_n(&c->n, ++dft_shm_cur_n, __ATOMIC_RELEASE);
    return 0;
}

/* The open-span table (common.h): a span open now is kept there so that the drainer
   writes it, incomplete, if this process dies before it ends. NULL: no ring. */
extern rec_t *dft_shm_open;

/* The slot of the table span `idv` can take (its fields then filled by the caller,
   its id stored last with shm_open_publish), or NULL: no ring, or no room (counted
   in the header: the caller marks the span OPEN_NOT_KEPT and gives it back with
   shm_open_end). */
#define OPEN_NOT_KEPT UINT32_MAX
static inline rec_t *shm_open_slot(unsigned long long idv, uint32_t *where) {
    rec_t *tab = dft_shm_open;
    *where = 0;
    if (!tab)
        return NULL;
    for (uint32_t k = 0; k < OPEN_PROBES; k++) {
        uint32_t i = (uint32_t)(idv + k) & (SHM_OPEN_SLOTS - 1);
        if (tab[i].id == 0) {
            *where = i + 1;
            return &tab[i];
        }
    }
    dft_shm->open_not_kept++;
    *where = OPEN_NOT_KEPT;
    return NULL;
}

static inline void shm_open_publish(rec_t *e, unsigned long long idv) {
    __atomic_store_n(&e->id, (uint64_t)idv, __ATOMIC_RELEASE);
}

/* Free slot `e` of span idv: 1 when a finalize wrote the span already (its end
   records nothing), else 0. */
static inline int shm_open_free(rec_t *e) {
    int written = ((e->level_flags >> LEVEL_BITS) & F_OPEN_WRITTEN) != 0;
    __atomic_store_n(&e->id, 0, __ATOMIC_RELEASE);
    return written;
}

/* Span idv, kept at `where` (shm_open_slot's), ended: its slot is free again. 1 when
   it was written already, incomplete, by a finalize (not to be recorded again). */
static inline int shm_open_end(unsigned long long idv, uint32_t where) {
    rec_t *tab = dft_shm_open;
    if (!where || !tab)
        return 0;
    if (where == OPEN_NOT_KEPT) {
        if (dft_shm->open_not_kept > 0)
            dft_shm->open_not_kept--;
    } else if (tab[where - 1].id == idv) {
        return shm_open_free(&tab[where - 1]);
    }
    return 0;
}

/* Span idv ended where its slot is not known (recorded from Python): found and
   freed, as shm_open_end. */
static inline int shm_open_end_any(unsigned long long idv) {
    rec_t *tab = dft_shm_open;
    if (!tab)
        return 0;
    for (uint32_t k = 0; k < OPEN_PROBES; k++) {
        uint32_t i = (uint32_t)(idv + k) & (SHM_OPEN_SLOTS - 1);
        if (tab[i].id == idv)
            return shm_open_free(&tab[i]);
    }
    return 0;
}

/* The module's functions of the producer's side (shm_attach, ...). */
extern PyMethodDef dft_shm_producer_methods[];

DFT_HIDDEN_END
#endif /* DFTRACE_SHM_RING_H */
