/* got.c: binding the wrappers. Each loaded object calls libc through its GOT; the
 * entries of the calls interpose.c wraps are pointed at the wrappers (the old value
 * kept, so that unbinding puts it back). Objects loaded later are bound as they load:
 * dlopen is wrapped in the interpreter's own objects and in every object whose
 * library search path is this module's (none, or the same: the interpreter's
 * extension modules, ctypes, most libraries), for the wrapper calls dlopen in their
 * stead and the loader searches the caller's path. A library loaded by an object with
 * a search path of its own (a $ORIGIN-relative RUNPATH) is bound at the next
 * io_bind() call (the reader calls it as it drains). Objects never bound: the dynamic loader, libc
 * (its calls to itself do not go through a GOT), the vDSO, and dftrace's own
 * modules (this one, and the engine that writes the trace). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "io.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#define R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define R_GLOB_DAT R_X86_64_GLOB_DAT
#define R_ABS64 R_X86_64_64
#elif defined(__aarch64__)
#define R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define R_GLOB_DAT R_AARCH64_GLOB_DAT
#define R_ABS64 R_AARCH64_ABS64
#else
#define NO_BINDING 1 /* another architecture: nothing is bound, nothing is traced */
#define R_JUMP_SLOT 0xFFFFFFFEul
#define R_GLOB_DAT 0xFFFFFFFEul
#define R_ABS64 0xFFFFFFFEul
#endif

typedef struct {
    void **slot;
    void *old;
    int relro; /* its page is read-only but while it is written */
} bound_t;

static pthread_mutex_t bind_lock = PTHREAD_MUTEX_INITIALIZER;
static bound_t *bound = NULL;
static size_t nbound = 0, capbound = 0;
static ElfW(Addr) *seen = NULL; /* the objects bound, by their load address */
static size_t nseen = 0, capseen = 0;
static int reals_found = 0;
static char own_paths[2][4096]; /* this module's file, and the engine's */
/* This module's library search path (its DT_RPATH and DT_RUNPATH); own_search_ok: it
   was found and holds no $ORIGIN (which would name this module's directory). */
static char own_search[4096];
static int own_search_ok = 0;

/* -- the hook names, hashed for the look-up of each relocation -- */
#define NAME_BUCKETS 512
static short name_table[NAME_BUCKETS]; /* hook index + 1; 0: empty */

static uint32_t name_hash(const char *s) {
    uint32_t h = 2166136261u;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 16777619u;
    return h;
}

static void *real_dlopen_fn = NULL;
static void *w_dlopen(const char *file, int mode);

static const io_hook_t dlopen_hook = {"dlopen", (void *)w_dlopen, &real_dlopen_fn};

static const io_hook_t *find_hook(const char *name, int dlopen_too) {
    if (strcmp(name, "dlopen") == 0)
        return dlopen_too && real_dlopen_fn ? &dlopen_hook : NULL;
    for (uint32_t i = name_hash(name) % NAME_BUCKETS, n = 0; n < NAME_BUCKETS;
         i = (i + 1) % NAME_BUCKETS, n++) {
        short k = name_table[i];
        if (!k)
            return NULL;
        if (strcmp(io_hooks[k - 1].name, name) == 0)
            return *io_hooks[k - 1].real ? &io_hooks[k - 1] : NULL;
    }
    return NULL;
}

/* An object's dynamic section, or NULL. */
static const ElfW(Dyn) *dynamic_of(const struct dl_phdr_info *info) {
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            return (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    return NULL;
}

/* "rpath|runpath" of an object into out (empty parts where it has none); 0 when its
   string table cannot be found. */
static int search_of(const struct dl_phdr_info *info, char *out, size_t n) {
    const ElfW(Dyn) *dyn = dynamic_of(info);
    if (!dyn)
        return 0;
    ElfW(Addr) base = info->dlpi_addr;
    const char *strtab = NULL;
    long rpath = -1, runpath = -1;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_STRTAB)
            strtab = (const char *)(d->d_un.d_ptr < base ? d->d_un.d_ptr + base : d->d_un.d_ptr);
        else if (d->d_tag == DT_RPATH)
            rpath = (long)d->d_un.d_val;
        else if (d->d_tag == DT_RUNPATH)
            runpath = (long)d->d_un.d_val;
    }
    if (!strtab)
        return 0;
    snprintf(out, n, "%s|%s", rpath >= 0 ? strtab + rpath : "", runpath >= 0 ? strtab + runpath : "");
    return 1;
}

static int own_search_of(struct dl_phdr_info *info, size_t size, void *data) {
    if (!info->dlpi_name || strcmp(info->dlpi_name, own_paths[0]) != 0)
        return 0;
    own_search_ok = search_of(info, own_search, sizeof(own_search)) && !strchr(own_search, '$');
    return 1;
}

/* Whether dlopen called by this object may be called by the wrapper in its stead: the
   loader would search the same places for it (its search path is this module's, or
   it has none: this module's is at most the one the interpreter was built with). */
static int searches_as_we_do(const struct dl_phdr_info *info) {
    char search[sizeof(own_search)];
    if (!own_search_ok || !search_of(info, search, sizeof(search)))
        return 0;
    return strcmp(search, own_search) == 0 || strcmp(search, "|") == 0;
}

static void find_reals(void) {
    if (reals_found)
        return;
    for (size_t i = 0; i < io_nhooks; i++) {
        void *f = dlsym(RTLD_DEFAULT, io_hooks[i].name);
#if defined(__x86_64__)
        if (!f) /* a compatibility-only symbol (__xstat ... on newer glibc) */
            f = dlvsym(RTLD_DEFAULT, io_hooks[i].name, "GLIBC_2.2.5");
#endif
        *io_hooks[i].real = f;
        uint32_t b = name_hash(io_hooks[i].name) % NAME_BUCKETS;
        while (name_table[b])
            b = (b + 1) % NAME_BUCKETS;
        name_table[b] = (short)(i + 1);
    }
    real_dlopen_fn = dlsym(RTLD_DEFAULT, "dlopen");
    Dl_info info;
    if (dladdr((void *)find_reals, &info) && info.dli_fname)
        strncpy(own_paths[0], info.dli_fname, sizeof(own_paths[0]) - 1);
    dl_iterate_phdr(own_search_of, NULL);
    reals_found = 1;
}

static int skipped(const char *name) {
    if (strstr(name, "linux-vdso") || strstr(name, "linux-gate") || strstr(name, "/ld-linux") ||
        strstr(name, "/libc.so") || strstr(name, "/libc-") || strstr(name, "/libpthread") ||
        strstr(name, "/libdl.") || strstr(name, "dftrace/_core/_speedups") ||
        strstr(name, "dftrace/_core/_io"))
        return 1;
    for (int i = 0; i < 2; i++)
        if (own_paths[i][0] && strcmp(name, own_paths[i]) == 0)
            return 1;
    return 0;
}

static int remember(void **slot, void *old, int relro) {
    if (nbound == capbound) {
        size_t cap = capbound ? capbound * 2 : 256;
        bound_t *b = realloc(bound, cap * sizeof(bound_t));
        if (!b)
            return -1;
        bound = b;
        capbound = cap;
    }
    bound[nbound].slot = slot;
    bound[nbound].old = old;
    bound[nbound].relro = relro;
    nbound++;
    return 0;
}

/* Write `value` into a GOT entry, the page made writable for it when it is not (a
   RELRO page: made read-only again after). */
static int write_entry(void **slot, void *value, int relro) {
    uintptr_t page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t page = (uintptr_t)slot & ~(page_size - 1);
    if (relro && mprotect((void *)page, page_size, PROT_READ | PROT_WRITE) != 0)
        return -1;
    __atomic_store_n(slot, value, __ATOMIC_RELEASE);
    if (relro)
        mprotect((void *)page, page_size, PROT_READ);
    return 0;
}

typedef struct {
    int count;
} bind_state_t;

static void bind_relocs(const ElfW(Rela) *rel, size_t n, const ElfW(Sym) *symtab,
                        const char *strtab, ElfW(Addr) base, int dlopen_too, uintptr_t lo,
                        uintptr_t hi, bind_state_t *st) {
    for (size_t i = 0; i < n; i++) {
        unsigned long type = ELF64_R_TYPE(rel[i].r_info);
        if (type != R_JUMP_SLOT && type != R_GLOB_DAT && !(type == R_ABS64 && !rel[i].r_addend))
            continue;
        size_t s = ELF64_R_SYM(rel[i].r_info);
        if (!s || symtab[s].st_shndx != SHN_UNDEF)
            continue;
        const io_hook_t *h = find_hook(strtab + symtab[s].st_name, dlopen_too);
        if (!h)
            continue;
        void **slot = (void **)(base + rel[i].r_offset);
        void *old = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
        uintptr_t page = (uintptr_t)slot & ~((uintptr_t)sysconf(_SC_PAGESIZE) - 1);
        int relro = page >= lo && page < hi;
        if (old == h->wrapper || remember(slot, old, relro) < 0)
            continue;
        if (write_entry(slot, h->wrapper, relro) == 0)
            st->count++;
        else
            nbound--;
    }
}

static int bind_object(struct dl_phdr_info *info, size_t size, void *data) {
    bind_state_t *st = data;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    ElfW(Addr) base = info->dlpi_addr;
    for (size_t i = 0; i < nseen; i++)
        if (seen[i] == base)
            return 0;
    if (nseen == capseen) {
        size_t cap = capseen ? capseen * 2 : 128;
        ElfW(Addr) *g = realloc(seen, cap * sizeof(ElfW(Addr)));
        if (!g)
            return 0;
        seen = g;
        capseen = cap;
    }
    seen[nseen++] = base;
    if (skipped(name))
        return 0;
    /* dlopen is wrapped in the interpreter's objects (the program itself, no name, and
       libpython) and in those that search for libraries as this module does */
    int dlopen_too = name[0] == '\0' || strstr(name, "libpython") != NULL || searches_as_we_do(info);
    const ElfW(Dyn) *dyn = dynamic_of(info);
    uintptr_t relro_lo = 0, relro_hi = 0, page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_GNU_RELRO) {
            relro_lo = (base + ph->p_vaddr) & ~(page_size - 1);
            relro_hi = (base + ph->p_vaddr + ph->p_memsz) & ~(page_size - 1);
        }
    }
    if (!dyn)
        return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t njmprel = 0, nrela = 0;
    int pltrel_rela = 1;
#define ADDR(d) ((d) < base ? (d) + base : (d))
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)ADDR(d->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const char *)ADDR(d->d_un.d_ptr); break;
        case DT_JMPREL: jmprel = (const ElfW(Rela) *)ADDR(d->d_un.d_ptr); break;
        case DT_PLTRELSZ: njmprel = d->d_un.d_val / sizeof(ElfW(Rela)); break;
        case DT_RELA: rela = (const ElfW(Rela) *)ADDR(d->d_un.d_ptr); break;
        case DT_RELASZ: nrela = d->d_un.d_val / sizeof(ElfW(Rela)); break;
        case DT_PLTREL: pltrel_rela = d->d_un.d_val == DT_RELA; break;
        }
    }
#undef ADDR
    if (!symtab || !strtab)
        return 0;
    if (jmprel && pltrel_rela)
        bind_relocs(jmprel, njmprel, symtab, strtab, base, dlopen_too, relro_lo, relro_hi, st);
    if (rela)
        bind_relocs(rela, nrela, symtab, strtab, base, dlopen_too, relro_lo, relro_hi, st);
    return 0;
}

/* The count of objects the loader has loaded so far (a new one: bind again). */
static int loads_of(struct dl_phdr_info *info, size_t size, void *data) {
    *(unsigned long long *)data = info->dlpi_adds;
    return 1;
}

static unsigned long long bound_loads = 0;

int io_bind(void) {
    bind_state_t st = {0};
#ifndef NO_BINDING
    pthread_mutex_lock(&bind_lock);
    unsigned long long loads = 0;
    dl_iterate_phdr(loads_of, &loads);
    if (!loads || loads != bound_loads) {
        find_reals();
        dl_iterate_phdr(bind_object, &st);
        bound_loads = loads;
    }
    pthread_mutex_unlock(&bind_lock);
#endif
    return st.count;
}

/* In a forked child: a thread of the parent may have held the lock at the fork. */
void io_got_after_fork_child(void) { pthread_mutex_init(&bind_lock, NULL); }

/* The engine's file, never bound (its writes are the trace's). */
void io_skip_object(const char *path) {
    pthread_mutex_lock(&bind_lock);
    strncpy(own_paths[1], path, sizeof(own_paths[1]) - 1);
    pthread_mutex_unlock(&bind_lock);
}

void io_unbind(void) {
    pthread_mutex_lock(&bind_lock);
    for (size_t i = nbound; i-- > 0;)
        write_entry(bound[i].slot, bound[i].old, bound[i].relro);
    nbound = 0;
    nseen = 0;
    bound_loads = 0;
    pthread_mutex_unlock(&bind_lock);
}

static void *w_dlopen(const char *file, int mode) {
    void *h = ((void *(*)(const char *, int))real_dlopen_fn)(file, mode);
    if (h && io_active)
        io_bind();
    return h;
}
