/* encoder.h: encoder.c's side, records to JSON lines (without the GIL), and args
 * (plain dicts) to JSON fragments. */
#ifndef DFTRACE_ENCODER_H
#define DFTRACE_ENCODER_H

#include "common.h"

DFT_HIDDEN_BEGIN

char *dft_encode_recs(char *o, const rec_t *recs, uint32_t from, uint32_t to, const char *arena,
                      const kind_t *ks, Py_ssize_t nk, const char *pidp, Py_ssize_t npid,
                      const char *hhp, Py_ssize_t nhh, long long off, long long min_id);
char *dft_encode_chunks(chunk_t *c, char *o, const kind_t *ks, Py_ssize_t nk, const char *pidp,
                        Py_ssize_t npid, const char *hhp, Py_ssize_t nhh, long long off,
                        long long min_id);
PyObject *dft_plain_extra(PyObject *d, int fresh);
/* Serve the registered Extra class from a freelist (register() calls it). */
void dft_extra_serve(void);
extern int dft_off_for_good;
/* The most a line takes beyond its kind's piece, the pid and hostname pieces and its
   args' bytes: literals and seven numbers of at most 20 digits, or a file-I/O call's
   line (its 24 raw bytes of args become at most IO_ARGS_TEXT_MAX bytes of text). */
#define REC_FIXED 256
#define IO_ARGS_TEXT_MAX 142

/* The module's functions of the encoder (set_options, plain_fragment). */
extern PyMethodDef dft_encoder_methods[];

DFT_HIDDEN_END
#endif /* DFTRACE_ENCODER_H */
