/* shm_consumer.h: shm_consumer.c's side, ShmReader, the drainer's reader of a
 * producer's ring (the ring's layout is in common.h). */
#ifndef DFTRACE_SHM_CONSUMER_H
#define DFTRACE_SHM_CONSUMER_H

#include "common.h"

DFT_HIDDEN_BEGIN

/* ShmReader and RingError added to the module `m`: 0, or -1 with an error. */
int dft_shm_consumer_add(PyObject *m);

DFT_HIDDEN_END
#endif /* DFTRACE_SHM_CONSUMER_H */
