/* signal_sender.h: signal_sender.c's side, who sent a signal that Python handles. */
#ifndef DFTRACE_SIGNAL_SENDER_H
#define DFTRACE_SIGNAL_SENDER_H

#include "common.h"

DFT_HIDDEN_BEGIN

/* The module's functions of signal_sender.c (note_signal_sender, signal_sender). */
extern PyMethodDef dft_signal_sender_methods[];

DFT_HIDDEN_END
#endif /* DFTRACE_SIGNAL_SENDER_H */
