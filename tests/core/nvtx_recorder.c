/* An NVTX tool, as Nsight Systems is one: NVTX loads it from NVTX_INJECTION64_PATH
 * and calls InitializeInjectionNvtx2, which replaces the range functions of NVTX's
 * core modules with recorders. Each call becomes one line of the file named by
 * NVTX_RECORDER_OUT:
 *
 *     PUSH <tid> <name>      POP <tid>      START <tid> <range> <name>      END <tid> <range>
 *
 * The constants and layouts below are those of NVTX's tool interface
 * (nvtx3/nvtxDetail/nvtxTypes.h and nvtx3/nvToolsExt.h, NVTX version 3).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { ETID_CALLBACKS = 1 };                 /* NvtxExportTableID */
enum { MODULE_CORE = 1, MODULE_CORE2 = 5 };  /* NvtxCallbackModule */
enum {                                       /* NvtxCallbackIdCore */
    CORE_RangeStartEx = 4, CORE_RangeStartA = 5, CORE_RangeEnd = 7,
    CORE_RangePushEx = 8, CORE_RangePushA = 9, CORE_RangePop = 11
};
enum {                                       /* NvtxCallbackIdCore2 */
    CORE2_DomainRangeStartEx = 2, CORE2_DomainRangeEnd = 3, CORE2_DomainRangePushEx = 4,
    CORE2_DomainRangePop = 5, CORE2_DomainRegisterStringA = 10
};
enum { MESSAGE_ASCII = 1, MESSAGE_REGISTERED = 3 }; /* nvtxMessageType_t */

typedef void (*fn_t)(void);
typedef struct {                             /* NvtxExportTableCallbacks */
    size_t struct_size;
    int (*GetModuleFunctionTable)(int module, fn_t ***table, unsigned int *size);
} callbacks_t;
typedef struct {                             /* nvtxEventAttributes_v2 */
    uint16_t version, size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type, reserved0;
    uint64_t payload;
    int32_t message_type;
    const void *message; /* ASCII: the text; REGISTERED: our handle, the text too */
} attributes_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *out;
static uint64_t last_range;

static void line(const char *what, uint64_t range, const char *name) {
    pthread_mutex_lock(&lock);
    if (out) {
        long tid = (long)syscall(SYS_gettid);
        if (!strcmp(what, "PUSH"))
            fprintf(out, "PUSH %ld %s\n", tid, name);
        else if (!strcmp(what, "POP"))
            fprintf(out, "POP %ld\n", tid);
        else if (!strcmp(what, "START"))
            fprintf(out, "START %ld %llu %s\n", tid, (unsigned long long)range, name);
        else
            fprintf(out, "END %ld %llu\n", tid, (unsigned long long)range);
        fflush(out);
    }
    pthread_mutex_unlock(&lock);
}

static const char *text(const attributes_t *a) {
    if (a && (a->message_type == MESSAGE_ASCII || a->message_type == MESSAGE_REGISTERED) && a->message)
        return (const char *)a->message;
    return "?";
}

static uint64_t new_range(void) {
    pthread_mutex_lock(&lock);
    uint64_t r = ++last_range;
    pthread_mutex_unlock(&lock);
    return r;
}

static int push_a(const char *m) { line("PUSH", 0, m ? m : "?"); return 0; }
static int push_ex(const attributes_t *a) { line("PUSH", 0, text(a)); return 0; }
static int pop(void) { line("POP", 0, NULL); return 0; }
static uint64_t start_a(const char *m) { uint64_t r = new_range(); line("START", r, m ? m : "?"); return r; }
static uint64_t start_ex(const attributes_t *a) { uint64_t r = new_range(); line("START", r, text(a)); return r; }
static void end(uint64_t r) { line("END", r, NULL); }
static int domain_push(void *d, const attributes_t *a) { return push_ex(a); }
static int domain_pop(void *d) { return pop(); }
static uint64_t domain_start(void *d, const attributes_t *a) { return start_ex(a); }
static void domain_end(void *d, uint64_t r) { end(r); }
static const void *domain_register(void *d, const char *s) { return strdup(s ? s : "?"); }

/* A recorder for each range function of a module, by its callback id. */
typedef struct {
    unsigned int id;
    fn_t f;
} slot_t;

/* The module's table entries of `slots` replaced (an id past the table: not there). */
static void put_all(unsigned int module, const slot_t *slots, size_t n, const callbacks_t *cb) {
    fn_t **table;
    unsigned int size;
    if (!cb->GetModuleFunctionTable(module, &table, &size))
        return;
    for (size_t k = 0; k < n; k++)
        if (slots[k].id <= size && table[slots[k].id])
            *table[slots[k].id] = slots[k].f;
}

/* Called once by every library that carries an NVTX client (each has its own tables). */
int InitializeInjectionNvtx2(const void *(*get_export_table)(uint32_t)) {
    const callbacks_t *cb = (const callbacks_t *)get_export_table(ETID_CALLBACKS);
    if (!cb || cb->struct_size < sizeof(callbacks_t))
        return 0;
    pthread_mutex_lock(&lock);
    if (!out) {
        const char *path = getenv("NVTX_RECORDER_OUT");
        out = path ? fopen(path, "a") : NULL;
    }
    pthread_mutex_unlock(&lock);
    const slot_t core[] = {
        {CORE_RangePushA, (fn_t)push_a}, {CORE_RangePushEx, (fn_t)push_ex}, {CORE_RangePop, (fn_t)pop},
        {CORE_RangeStartA, (fn_t)start_a}, {CORE_RangeStartEx, (fn_t)start_ex}, {CORE_RangeEnd, (fn_t)end},
    };
    const slot_t core2[] = {
        {CORE2_DomainRangePushEx, (fn_t)domain_push}, {CORE2_DomainRangePop, (fn_t)domain_pop},
        {CORE2_DomainRangeStartEx, (fn_t)domain_start}, {CORE2_DomainRangeEnd, (fn_t)domain_end},
        {CORE2_DomainRegisterStringA, (fn_t)domain_register},
    };
    put_all(MODULE_CORE, core, sizeof(core) / sizeof(core[0]), cb);
    put_all(MODULE_CORE2, core2, sizeof(core2) / sizeof(core2[0]), cb);
    return 1;
}
