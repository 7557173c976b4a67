/*
 * btl_ompi.c — Open MPI BTL components over btl's C ABI (btl.h).
 *
 * One source, compiled twice by scripts/ompi-components.sh:
 *   -DBTL_OMPI_RSM   → mca_btl_rsm.so  (btl's shared memory, peers of this node)
 *   -DBTL_OMPI_RTCP  → mca_btl_rtcp.so (btl's TCP, every peer)
 * Each .so carries its own copy of libbtl.a; a version script exports only
 * the component structure, so the two copies never see each other.
 *
 * What lives here is what Open MPI's object system and macros force into
 * C: the component and module structures, descriptor objects and free
 * lists, convertors, the modex macros, the MCA variable calls, the active
 * message table, proc locality flags. The transport — rings, fragments,
 * single copy, TCP framing, validation of peers' bytes and of get/put
 * ranges, failure detection, parameter parsing and rules — is btl's,
 * reached through btl.h.
 *
 * Decisions (also in the README, "Using btl from Open MPI"):
 * - Every btl parameter of the component's table (btl_param_info) is an
 *   MCA variable btl_<name>_<param>, registered as a string so that btl's
 *   own parser and rules judge the value (btl_config_set); a malformed
 *   value is reported naming the variable and the component declines.
 *   Open MPI's base BTL parameters (exclusivity, eager_limit, ...) are in
 *   btl's tables, so mca_btl_base_param_register is not called; the
 *   module's attributes are btl's effective values (btl_config_number).
 * - Threads: a btl handle is not thread-safe. When Open MPI runs with
 *   threads (MPI_THREAD_MULTIPLE), every entry point takes the module's
 *   recursive mutex (recursive: receive callbacks post sends).
 * - Sends: btl_isend (copied at once when small: the send completes
 *   inline and btl_send returns 1; otherwise zero copy from the
 *   descriptor or the user's buffer, completion through an event). A full
 *   peer queue (BTL_ERR_WOULD_BLOCK) parks the descriptor on the
 *   endpoint's list, retried in order by the progress function.
 * - Eager limit (rsm): ob1's eager_limit is twice btl's eager_limit plus
 *   64 bytes for ob1's header (8256 by default), capped at btl's
 *   max_send_size. btl sends any message up to a max-size fragment as one
 *   fragment (its eager_limit is only the size of its small fragments),
 *   so a message above btl's eager_limit need not take ob1's rendezvous
 *   (two more messages and a get): measured (README), 4 KiB and 8 KiB
 *   messages take half the time eagerly and stream as fast or faster; at
 *   16 KiB the eager path still halves the latency but a window of
 *   sends streams at half the rendezvous' bandwidth, so ob1's limit stops
 *   below it. Measured again after the rendezvous got faster (2026-12-05,
 *   ob1's limit at 4 x eager_limit + 64 against this one, `ppmin 16384`
 *   and the anchors' windowed bandwidth): with the two ranks on one core's
 *   two threads, eager 2.36 us and 7.4 GB/s against 3.63 us and 5.1 GB/s;
 *   with them on two CCXs, 8.26 us and 1.9 GB/s against 4.14 us and 5.2
 *   GB/s (vader's copy in and out fares the same there: 10.7 us). The
 *   copy through a fragment pays only while the caches are shared; the
 *   single copy holds either way, so the limit stays. The component's
 *   small descriptors keep btl's eager_limit.
 * - Eager limit (rtcp): ob1's eager_limit is btl's max_send_size (128 KiB
 *   by default; btl's eager_limit if that is larger). Over TCP each of
 *   the rendezvous' extra messages costs a few microseconds, more than
 *   the receiver's copy out of the frame up to a max-size frame: measured
 *   (README), 64 KiB latency 25-26 -> 17-19 us (tcp 23-25) and windowed
 *   bandwidth 1.10-1.16x tcp's; 96 KiB 28-30 -> 22-23 us. A larger
 *   btl_rtcp_max_send_size raises it too (and the receiver's buffers).
 * - RDMA: register_mem packs btl's key (BTL_KEY_BYTES, with the base
 *   address) as the registration handle; put/get are btl_iput/btl_iget
 *   with absolute remote addresses, validated by the target (rsm's
 *   single-copy gets against the target's region table in the segment,
 *   without a round trip; README, "Gets without asking").
 * - Two BTL interfaces from one source, chosen by BTL_VERSION of the
 *   btl.h it is compiled against: 310 (Open MPI 4.1: scripts/ompi-components.sh)
 *   and 330 (Open MPI 5.0: scripts/ompi5-env.sh components). What differs
 *   is kept behind BTL_OMPI_IFACE_33 below: the receive callback's
 *   descriptor (3.2+), the PMIx-native modex keys and types of Open MPI 5
 *   (PMIX_GLOBAL, PMIX_JOB_SIZE, PMIX_UINT32, from pmix-internal.h), and
 *   device memory: Open MPI 5 asks its accelerator framework, and a
 *   registration of device memory is declined (the component sets no
 *   MCA_BTL_FLAGS_ACCELERATOR_* flag, so ob1 stages device buffers
 *   through host memory for sends). btl_ft_event (gone in 3.3) was never
 *   set, so it needs nothing.
 */
#include "opal_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opal/class/opal_bitmap.h"
#include "opal/class/opal_free_list.h"
#include "opal/class/opal_list.h"
#include "opal/datatype/opal_convertor.h"
#include "opal/mca/base/mca_base_var.h"
#include "opal/mca/btl/base/base.h"
#include "opal/mca/btl/btl.h"
#include "opal/mca/hwloc/base/base.h"

/* The BTL interface of the headers we compile against (see the top). */
#if !defined(BTL_VERSION)
#error "Open MPI's opal/mca/btl/btl.h defines no BTL_VERSION: not a BTL 3.x header"
#elif BTL_VERSION == 310
#define BTL_OMPI_IFACE_33 0
#include "opal/mca/pmix/pmix.h"
#include "opal/threads/mutex.h"
/* modex keys, scopes and types of Open MPI 4.1's opal_pmix layer */
#define MODEX_GLOBAL OPAL_PMIX_GLOBAL
#define MODEX_JOB_SIZE OPAL_PMIX_JOB_SIZE
#define MODEX_UINT32 OPAL_UINT32
#elif BTL_VERSION == 330
#define BTL_OMPI_IFACE_33 1
#include "opal/mca/accelerator/accelerator.h"
#include "opal/mca/pmix/pmix-internal.h"
#include "opal/mca/threads/mutex.h"
/* Open MPI 5's modex is PMIx's own: its keys, scopes and types */
#define MODEX_GLOBAL PMIX_GLOBAL
#define MODEX_JOB_SIZE PMIX_JOB_SIZE
#define MODEX_UINT32 PMIX_UINT32
/* ob1's CID header type, its BTL tag (MCA_PML_OB1_HDR_TYPE_CID in
 * ompi/mca/pml/ob1/pml_ob1_hdr.h, not installed), and how far past such a
 * fragment's end ob1 writes at most (into the match header after its
 * 32-byte CID header: a 2-byte field 2 bytes in). */
#define OB1_TAG_CID (MCA_BTL_TAG_PML + 10)
#define OB1_CID_SLACK 64
#else
#error "unsupported BTL interface (BTL_VERSION in btl.h): this component builds for 310 (Open MPI 4.1) and 330 (Open MPI 5.0)"
#endif
#include "opal/runtime/opal_progress.h"
#include "opal/util/output.h"
#include "opal/util/proc.h"

#include <btl.h>

#if defined(BTL_OMPI_RSM)
#define NAME "rsm"
/* prepare_src leaves contiguous data in place above btl's eager_limit
 * (below it, btl's shared memory copies anyway: one copy into our buffer) */
#define INPLACE_MIN module.small_cap
#define BTL_COMP "sm"
#define TRANSPORT "sm-local"
#define WHAT "shared memory"
#define COMPONENT mca_btl_rsm_component
#elif defined(BTL_OMPI_RTCP)
#define NAME "rtcp"
#define BTL_COMP "tcp"
#define TRANSPORT "tcp"
#define WHAT "TCP"
#define COMPONENT mca_btl_rtcp_component
/* prepare_src leaves contiguous data in place above this many bytes:
 * btl's TCP writes a header and a payload straight from the caller's
 * memory (btl_isend), and only copies a frame of at most 256 bytes */
#define INPLACE_MIN 256
#else
#error "define BTL_OMPI_RSM or BTL_OMPI_RTCP"
#endif

/* ------------------------------------------------------------------ types */

struct mca_btl_base_endpoint_t {
    opal_proc_t *proc;
    uint32_t rank;
    int failed;
    int announced;
    /* descriptors waiting for room in btl's queue to this peer, in order */
    opal_list_t pending;
};

/* btl's key: the first BTL_KEY_BYTES go to peers (btl_registration_handle_size) */
struct mca_btl_base_registration_handle_t {
    uint8_t packed[BTL_KEY_BYTES];
    btl_key_t key;
    /* on module.retired: given back while btl still used the region */
    struct mca_btl_base_registration_handle_t *next_retired;
    /* rsm's registration cache (see REG_CACHE): the range, the uses
     * Open MPI has not given back, whether the cache holds it, and when
     * it was last handed out */
    uintptr_t base;
    size_t size;
    int refs;
    int cached;
    uint64_t last;
};

/* rsm keeps the last REG_CACHE registrations after Open MPI gives them
 * back and hands them out again for ranges inside them. ob1 registers the
 * user's buffer on both sides of every rendezvous message and gives it
 * back when the message completes; each registration and deregistration
 * cost ~375 instructions through the C ABI (callgrind of `ppmin 16384`),
 * four of each per round trip, where vader, needing no registration for
 * single copy, spends none. Safe because a btl registration over shared
 * memory is an address range and nothing more: nothing is pinned, a get
 * reads whatever the range holds when it runs (ob1 registers live
 * buffers), and the peers that could use a kept registration's key are
 * the node's ranks, which can read and write this process by single copy
 * anyway (the same user, the same ptrace rights; README, "Gets without
 * asking"). Not for rtcp: a TCP peer on another host has no such access,
 * and a put into a kept range of freed memory would land in whatever
 * the range now holds. */
#ifdef BTL_OMPI_RSM
#define REG_CACHE 16
#else
#define REG_CACHE 0
#endif

typedef struct {
    mca_btl_base_descriptor_t base;
    mca_btl_base_segment_t segments[2];
    struct mca_btl_base_endpoint_t *endpoint;
    opal_free_list_t *home;
    uint8_t *buf; /* the free list's payload buffer */
    size_t cap;
    uint8_t tag;
} frag_t;
static OBJ_CLASS_INSTANCE(frag_t, mca_btl_base_descriptor_t, NULL, NULL);

typedef struct {
    opal_free_list_item_t super;
    struct mca_btl_base_endpoint_t *endpoint;
    void *local_address;
    struct mca_btl_base_registration_handle_t *local_handle;
    struct mca_btl_base_registration_handle_t *temp; /* registered for this op */
    mca_btl_base_rdma_completion_fn_t cbfunc;
    void *cbcontext;
    void *cbdata;
} rdma_t;
static OBJ_CLASS_INSTANCE(rdma_t, opal_free_list_item_t, NULL, NULL);

typedef struct {
    mca_btl_base_module_t super;
    btl_t *h;
    int connected;
    int connect_failed;
    int finalizing;
    int in_progress;
    uint32_t rank, size;
    struct mca_btl_base_endpoint_t **eps; /* by rank, made in add_procs */
    size_t npending;
    /* registrations Open MPI gave back while btl still used them (a
     * peer's get being answered from them): deregistered by the first
     * progress call after btl lets go, since Open MPI never asks twice */
    struct mca_btl_base_registration_handle_t *retired;
    opal_free_list_t eager, max, rdma;
    size_t small_cap; /* btl's eager_limit: the eager list's buffers */
    opal_recursive_mutex_t lock;
    mca_btl_base_module_error_cb_fn_t error_cb;
    /* what receive callbacks get */
#if !BTL_OMPI_IFACE_33
    mca_btl_base_descriptor_t rdes;
#endif
    mca_btl_base_segment_t rseg;
    uint8_t *scratch; /* aligned copy of a misaligned message */
    size_t scratch_len;
#if REG_CACHE
    struct mca_btl_base_registration_handle_t *regs[REG_CACHE];
    uint64_t reg_clock;
#endif
} module_t;

static module_t module;
mca_btl_base_component_3_0_0_t COMPONENT;

/* MCA variables: one string per btl parameter */
#define MAX_PARAMS 64
static size_t nparams;
static char *param_values[MAX_PARAMS];
static int param_index[MAX_PARAMS];
static int verbose_stream = -1;

#define VERBOSE(level, ...)                                                             \
    opal_output_verbose((level), opal_btl_base_framework.framework_output, "btl " NAME \
                        ": " __VA_ARGS__)

static inline void lock(void) { OPAL_THREAD_LOCK(&module.lock); }
static inline void unlock(void) { OPAL_THREAD_UNLOCK(&module.lock); }

/* Measurement only (scripts/ompi-sensitivity.sh): BTL_OMPI_PAD_SEND=N adds
 * N rounds of register-only work (a dependent chain of 6 instructions a
 * round, no memory) to the send path (m_sendi, before btl_sendi), and
 * BTL_OMPI_PAD_RECV=N to the receive path (on_event, before ob1's
 * callback): what instructions on either path cost in 8 B latency. The
 * build's default, 0, compiles to nothing. */
#ifndef BTL_OMPI_PAD_SEND
#define BTL_OMPI_PAD_SEND 0
#endif
#ifndef BTL_OMPI_PAD_RECV
#define BTL_OMPI_PAD_RECV 0
#endif
static inline __attribute__((always_inline)) void pad(int rounds)
{
    uint64_t a = 1, b = 2, c = 3, d = 4;
    for (int i = 0; i < rounds; i++) {
        a += b;
        b ^= c;
        c += d;
        d ^= a;
        __asm__ volatile("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d));
    }
    __asm__ volatile("" ::"r"(a ^ b ^ c ^ d));
}

/* ------------------------------------------------------------------ status */

static int to_opal(int rc)
{
    switch (rc) {
    case BTL_OK:
    case BTL_DONE:
        return OPAL_SUCCESS;
    case BTL_ERR_WOULD_BLOCK:
        return OPAL_ERR_OUT_OF_RESOURCE;
    case BTL_ERR_UNREACHABLE:
    case BTL_ERR_PEER_FAILED:
        return OPAL_ERR_UNREACH;
    case BTL_ERR_ARG:
    case BTL_ERR_RANGE:
    case BTL_ERR_KEY:
    case BTL_ERR_TAG:
    case BTL_ERR_RANK:
    case BTL_ERR_TOO_LARGE:
        return OPAL_ERR_BAD_PARAM;
    default:
        return OPAL_ERROR;
    }
}

static void report(const char *what, int rc)
{
    opal_output(0, "btl " NAME ": %s: %s (%s)", what, btl_last_error(), btl_strerror(rc));
}

/* ------------------------------------------------------------------ parameters */

static const char *kind_name(int kind)
{
    switch (kind) {
    case BTL_PARAM_INT: return "an integer";
    case BTL_PARAM_UINT: return "an unsigned integer";
    case BTL_PARAM_SIZE: return "a size in bytes";
    case BTL_PARAM_BOOL: return "a boolean";
    default: return "a string";
    }
}

static int component_register(void)
{
    size_t n = 0;
    if (BTL_OK != btl_param_count(BTL_COMP, &n)) {
        report("listing btl's parameters", BTL_ERR_PARAM);
        return OPAL_ERROR;
    }
    nparams = n < MAX_PARAMS ? n : MAX_PARAMS;
    for (size_t i = 0; i < nparams; i++) {
        btl_param_info_t info;
        char *help = NULL;
        if (BTL_OK != btl_param_info(BTL_COMP, i, &info)) {
            report("reading a parameter definition", BTL_ERR_PARAM);
            return OPAL_ERROR;
        }
        if (asprintf(&help, "%s [btl's %s.%s, %s: %s; default %s]", info.help,
                     info.component, info.name, kind_name(info.kind), info.accepts,
                     info.default_value) < 0) {
            return OPAL_ERR_OUT_OF_RESOURCE;
        }
        param_values[i] = (char *) info.default_value;
        param_index[i] = mca_base_component_var_register(
            &COMPONENT.btl_version, info.name, help, MCA_BASE_VAR_TYPE_STRING, NULL, 0,
            MCA_BASE_VAR_FLAG_SETTABLE,
            (mca_base_var_info_lvl_t)(OPAL_INFO_LVL_1 + (info.level ? info.level - 1 : 0)),
            MCA_BASE_VAR_SCOPE_READONLY, &param_values[i]);
        free(help);
    }
    return OPAL_SUCCESS;
}

static int component_open(void) { return OPAL_SUCCESS; }

static const char *source_name(mca_base_var_source_t s)
{
    switch (s) {
    case MCA_BASE_VAR_SOURCE_COMMAND_LINE: return "the command line";
    case MCA_BASE_VAR_SOURCE_ENV: return "the environment";
    case MCA_BASE_VAR_SOURCE_FILE: return "a parameter file";
    case MCA_BASE_VAR_SOURCE_SET: return "the program";
    case MCA_BASE_VAR_SOURCE_OVERRIDE: return "an override file";
    default: return "the default";
    }
}

/* Open MPI's values into btl's configuration; the variables the user did
 * not set keep btl's defaults (and btl's own BTL_* environment). */
static int configure(btl_config_t *cfg)
{
    for (size_t i = 0; i < nparams; i++) {
        btl_param_info_t info;
        mca_base_var_source_t source = MCA_BASE_VAR_SOURCE_DEFAULT;
        if (param_index[i] < 0 || BTL_OK != btl_param_info(BTL_COMP, i, &info)) continue;
        (void) mca_base_var_get_value(param_index[i], NULL, &source, NULL);
        if (MCA_BASE_VAR_SOURCE_DEFAULT == source) continue;
        const char *v = param_values[i] ? param_values[i] : "";
        VERBOSE(10, "btl_" NAME "_%s = %s (from %s) goes to btl as %s.%s", info.name, v,
                source_name(source), BTL_COMP, info.name);
        int rc = btl_config_set(cfg, BTL_COMP, info.name, v);
        if (BTL_OK != rc) {
            opal_output(0,
                        "btl " NAME ": MCA parameter btl_" NAME "_%s = \"%s\" is refused: %s; "
                        "the " NAME " component will not be used",
                        info.name, v, btl_last_error());
            return OPAL_ERR_BAD_PARAM;
        }
    }
    return OPAL_SUCCESS;
}

static int number(btl_config_t *cfg, const char *name, int64_t *out)
{
    int rc = btl_config_number(cfg, BTL_COMP, name, out);
    if (BTL_OK != rc) {
        opal_output(0, "btl " NAME ": parameters refused: %s; the " NAME
                    " component will not be used", btl_last_error());
    }
    return rc;
}

/* ------------------------------------------------------------------ endpoints */

static struct mca_btl_base_endpoint_t *endpoint_of(uint32_t rank)
{
    return (module.eps && rank < module.size) ? module.eps[rank] : NULL;
}

static void peer_failed(uint32_t rank, const char *why)
{
    struct mca_btl_base_endpoint_t *ep = endpoint_of(rank);
    if (ep) {
        if (ep->failed) return;
        ep->failed = 1;
    }
    if (module.finalizing) return;
    char *text = NULL;
    if (asprintf(&text, "btl " NAME ": rank %u failed: %s", rank, why ? why : "?") < 0) {
        text = NULL;
    }
    opal_output(0, "%s", text ? text : "btl " NAME ": a peer failed");
    if (module.error_cb) {
        /* Open MPI 5's ob1 hands a failed peer to ULFM when fault tolerance
         * is on (`mpirun --with-ft ulfm`), and aborts otherwise, so the
         * failure is reported as non-fatal there, as its own tcp does;
         * 4.1's ob1 aborts either way. */
        module.error_cb(&module.super, BTL_OMPI_IFACE_33 ? MCA_BTL_ERROR_FLAGS_NONFATAL : MCA_BTL_ERROR_FLAGS_FATAL,
                        ep ? ep->proc : NULL, text);
    }
    free(text);
}

/* ------------------------------------------------------------------ descriptors */

static void frag_release(frag_t *f)
{
    opal_free_list_return(f->home, &f->base.super);
}

static frag_t *frag_get(struct mca_btl_base_endpoint_t *ep, size_t size, uint32_t flags,
                        uint8_t order)
{
    opal_free_list_t *fl;
    if (size <= module.small_cap) {
        fl = &module.eager;
    } else if (size <= module.super.btl_max_send_size) {
        fl = &module.max;
    } else {
        return NULL;
    }
    frag_t *f = (frag_t *) opal_free_list_get(fl);
    if (OPAL_UNLIKELY(NULL == f)) return NULL;
    f->home = fl;
    f->buf = f->base.super.ptr;
    f->cap = fl == &module.eager ? module.small_cap : module.super.btl_max_send_size;
    f->endpoint = ep;
    f->segments[0].seg_addr.pval = f->buf;
    f->segments[0].seg_len = size;
    f->base.des_segments = f->segments;
    f->base.des_segment_count = 1;
    f->base.des_flags = flags;
    f->base.order = order;
    f->base.des_cbfunc = NULL;
    f->base.des_cbdata = NULL;
    f->base.des_context = NULL;
    return f;
}

static mca_btl_base_descriptor_t *m_alloc(struct mca_btl_base_module_t *btl,
                                            struct mca_btl_base_endpoint_t *ep, uint8_t order,
                                            size_t size, uint32_t flags)
{
    (void) btl;
    lock();
    frag_t *f = frag_get(ep, size, flags, order);
    unlock();
    return f ? &f->base : NULL;
}

static int m_free(struct mca_btl_base_module_t *btl, mca_btl_base_descriptor_t *des)
{
    (void) btl;
    lock();
    frag_release((frag_t *) des);
    unlock();
    return OPAL_SUCCESS;
}

static mca_btl_base_descriptor_t *m_prepare_src(struct mca_btl_base_module_t *btl,
                                                  struct mca_btl_base_endpoint_t *ep,
                                                  struct opal_convertor_t *conv, uint8_t order,
                                                  size_t reserve, size_t *size, uint32_t flags)
{
    (void) btl;
    struct iovec iov;
    uint32_t iov_count = 1;
    size_t max_data = *size;
    frag_t *f;
    lock();
    if (!opal_convertor_need_buffers(conv) && max_data > 0 &&
        reserve + max_data > INPLACE_MIN) {
        /* contiguous: the header in our buffer, the data in place */
        f = frag_get(ep, reserve, flags, order);
        if (OPAL_UNLIKELY(NULL == f)) goto busy;
        iov.iov_len = max_data;
        iov.iov_base = NULL;
        if (opal_convertor_pack(conv, &iov, &iov_count, &max_data) < 0) goto fail;
        f->segments[0].seg_len = reserve;
        f->segments[1].seg_addr.pval = iov.iov_base;
        f->segments[1].seg_len = max_data;
        f->base.des_segment_count = 2;
    } else {
        /* copied into our buffer (packed when not contiguous) */
        if (reserve + max_data > module.super.btl_max_send_size) {
            max_data = module.super.btl_max_send_size - reserve;
        }
        f = frag_get(ep, reserve + max_data, flags, order);
        if (OPAL_UNLIKELY(NULL == f)) goto busy;
        iov.iov_len = max_data;
        iov.iov_base = (IOVBASE_TYPE *) (f->buf + reserve);
        if (max_data > 0 && opal_convertor_pack(conv, &iov, &iov_count, &max_data) < 0) goto fail;
        f->segments[0].seg_len = reserve + max_data;
    }
    unlock();
    *size = max_data;
    return &f->base;
fail:
    frag_release(f);
busy:
    unlock();
    return NULL;
}

/* ------------------------------------------------------------------ sends */

/* A peer's host name for messages: Open MPI 5's opal_proc_t has no
 * proc_hostname; both versions answer opal_get_proc_hostname. */
static const char *host_of(const opal_proc_t *p)
{
    const char *h = p ? opal_get_proc_hostname(p) : NULL;
    return h ? h : "?";
}

static void announce(struct mca_btl_base_endpoint_t *ep)
{
    ep->announced = 1;
    VERBOSE(10, "first message to rank %u (%s) goes over btl's %s", ep->rank,
            host_of(ep->proc), WHAT);
}

/* A send that completed inline: the callback if asked for, the descriptor
 * back to its list if ours. */
static void complete_inline(frag_t *f)
{
    uint32_t flags = f->base.des_flags;
    if ((flags & MCA_BTL_DES_SEND_ALWAYS_CALLBACK) && f->base.des_cbfunc) {
        f->base.des_cbfunc(&module.super, f->endpoint, &f->base, OPAL_SUCCESS);
    }
    if (flags & MCA_BTL_DES_FLAGS_BTL_OWNERSHIP) frag_release(f);
}

/* Posts a descriptor: BTL_DONE, BTL_OK (an event follows) or an error. */
static int post(frag_t *f)
{
    btl_iovec_t iov[2];
    size_t n = f->base.des_segment_count;
    for (size_t i = 0; i < n; i++) {
        iov[i].base = f->segments[i].seg_addr.pval;
        iov[i].len = f->segments[i].seg_len;
    }
    return btl_isend(module.h, f->endpoint->rank, f->tag, iov, n, f);
}

static int m_send(struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *ep,
                    mca_btl_base_descriptor_t *des, mca_btl_base_tag_t tag)
{
    (void) btl;
    frag_t *f = (frag_t *) des;
    int rc, ret;
    lock();
    if (OPAL_UNLIKELY(ep->failed)) {
        unlock();
        return OPAL_ERR_UNREACH;
    }
    if (OPAL_UNLIKELY(!ep->announced)) announce(ep);
    f->endpoint = ep;
    f->tag = tag;
    if (OPAL_UNLIKELY(!opal_list_is_empty(&ep->pending))) {
        rc = BTL_ERR_WOULD_BLOCK;
    } else {
        rc = post(f);
    }
    if (BTL_DONE == rc) {
        complete_inline(f);
        ret = 1;
    } else if (BTL_OK == rc) {
        ret = OPAL_SUCCESS;
    } else if (BTL_ERR_WOULD_BLOCK == rc) {
        /* kept in order; completes through the callback */
        f->base.des_flags |= MCA_BTL_DES_SEND_ALWAYS_CALLBACK;
        opal_list_append(&ep->pending, (opal_list_item_t *) f);
        module.npending++;
        ret = OPAL_SUCCESS;
    } else {
        report("send", rc);
        ret = to_opal(rc);
    }
    unlock();
    return ret;
}

static int m_sendi(struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *ep,
                     struct opal_convertor_t *conv, void *header, size_t header_size,
                     size_t payload_size, uint8_t order, uint32_t flags, mca_btl_base_tag_t tag,
                     mca_btl_base_descriptor_t **descriptor)
{
    (void) btl;
    btl_iovec_t iov[2];
    size_t n = 1;
    uint8_t packed[4096];
    int rc;
    lock();
    if (OPAL_UNLIKELY(ep->failed)) {
        unlock();
        if (descriptor) *descriptor = NULL;
        return OPAL_ERR_UNREACH;
    }
    if (OPAL_UNLIKELY(!ep->announced)) announce(ep);
    if (OPAL_UNLIKELY(!opal_list_is_empty(&ep->pending) ||
                      header_size + payload_size > module.super.btl_eager_limit)) {
        goto busy;
    }
    iov[0].base = header;
    iov[0].len = header_size;
    if (payload_size > 0) {
        if (!opal_convertor_need_buffers(conv)) {
            /* contiguous: read in place, the convertor not advanced (as
             * vader's sendi): a sendi that succeeds ends the message, and
             * ob1 resets the convertor after one that fails */
            void *p;
            opal_convertor_get_current_pointer(conv, &p);
            iov[1].base = p;
            iov[1].len = payload_size;
        } else {
            struct iovec v;
            uint32_t cnt = 1;
            size_t max_data = payload_size;
            if (payload_size > sizeof(packed)) goto busy;
            v.iov_base = (IOVBASE_TYPE *) packed;
            v.iov_len = payload_size;
            if (opal_convertor_pack(conv, &v, &cnt, &max_data) < 0) goto busy;
            iov[1].base = v.iov_base;
            iov[1].len = max_data;
        }
        n = 2;
    }
    if (BTL_OMPI_PAD_SEND) pad(BTL_OMPI_PAD_SEND);
    rc = btl_sendi(module.h, ep->rank, tag, iov, n);
    if (BTL_DONE == rc) {
        unlock();
        return OPAL_SUCCESS;
    }
    if (BTL_ERR_WOULD_BLOCK != rc) {
        report("sendi", rc);
        unlock();
        if (descriptor) *descriptor = NULL;
        return to_opal(rc);
    }
busy:
    if (descriptor) {
        frag_t *f = frag_get(ep, header_size + payload_size, flags, order);
        *descriptor = f ? &f->base : NULL;
    }
    unlock();
    return OPAL_ERR_OUT_OF_RESOURCE;
}

/* Retries parked descriptors, in order per endpoint. */
static int retry_pending(void)
{
    int n = 0;
    for (uint32_t r = 0; r < module.size && module.npending; r++) {
        struct mca_btl_base_endpoint_t *ep = module.eps[r];
        if (!ep) continue;
        while (!opal_list_is_empty(&ep->pending)) {
            frag_t *f = (frag_t *) opal_list_get_first(&ep->pending);
            int rc = ep->failed ? BTL_ERR_PEER_FAILED : post(f);
            if (BTL_ERR_WOULD_BLOCK == rc) break;
            opal_list_remove_first(&ep->pending);
            module.npending--;
            n++;
            if (BTL_DONE == rc) {
                complete_inline(f);
            } else if (BTL_OK != rc) {
                uint32_t flags = f->base.des_flags;
                if (f->base.des_cbfunc) {
                    f->base.des_cbfunc(&module.super, ep, &f->base, to_opal(rc));
                }
                if (flags & MCA_BTL_DES_FLAGS_BTL_OWNERSHIP) frag_release(f);
            }
        }
    }
    return n;
}

/* ------------------------------------------------------------------ memory, RDMA */

static void retire(struct mca_btl_base_registration_handle_t *r);

#if REG_CACHE
/* A kept registration whose range holds [base, base + size), taken for
 * one more use; NULL if none. Called locked. */
static struct mca_btl_base_registration_handle_t *reg_hit(uintptr_t base, size_t size)
{
    for (int i = 0; i < REG_CACHE; i++) {
        struct mca_btl_base_registration_handle_t *h = module.regs[i];
        if (h && base >= h->base && size <= h->size && base - h->base <= h->size - size) {
            h->refs++;
            h->last = ++module.reg_clock;
            return h;
        }
    }
    return NULL;
}

/* Keeps `r` (one use, just registered) in the cache: in a free slot, or
 * in place of the least recently used registration nobody uses, which is
 * deregistered. With every slot in use, `r` is not kept. Called locked. */
static void reg_keep(struct mca_btl_base_registration_handle_t *r)
{
    int slot = -1;
    for (int i = 0; i < REG_CACHE; i++) {
        struct mca_btl_base_registration_handle_t *h = module.regs[i];
        if (NULL == h) {
            slot = i;
            break;
        }
        if (0 == h->refs && (slot < 0 || h->last < module.regs[slot]->last)) slot = i;
    }
    if (slot < 0) return;
    if (module.regs[slot]) {
        module.regs[slot]->cached = 0;
        retire(module.regs[slot]);
    }
    module.regs[slot] = r;
    r->cached = 1;
}

/* Deregisters every kept registration nobody uses (finalize). Called
 * locked. */
static void reg_drop_all(void)
{
    for (int i = 0; i < REG_CACHE; i++) {
        struct mca_btl_base_registration_handle_t *h = module.regs[i];
        if (h && 0 == h->refs) {
            h->cached = 0;
            retire(h);
        }
        module.regs[i] = NULL;
    }
}
#endif

static struct mca_btl_base_registration_handle_t *
m_register_mem(struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *ep,
                 void *base, size_t size, uint32_t flags)
{
    (void) btl;
    (void) ep;
    (void) flags;
#if BTL_OMPI_IFACE_33
    {
        /* btl moves host memory only: device memory is declined, and the
         * caller (ob1, osc) falls back to a protocol through host memory */
        int dev_id = 0;
        uint64_t aflags = 0;
        int on_device = opal_accelerator.check_addr(base, &dev_id, &aflags);
        if (OPAL_UNLIKELY(on_device != 0)) {
            VERBOSE(10, "register_mem: %zu bytes at %p %s: declined (btl moves host memory only)",
                    size, base,
                    on_device > 0 ? "are device memory" : "could not be told apart from device memory");
            return NULL;
        }
    }
#endif
    lock();
#if REG_CACHE
    struct mca_btl_base_registration_handle_t *hit = reg_hit((uintptr_t) base, size);
    if (hit) {
        unlock();
        return hit;
    }
#endif
    struct mca_btl_base_registration_handle_t *r = calloc(1, sizeof(*r));
    if (NULL == r) {
        unlock();
        return NULL;
    }
    int rc = btl_register(module.h, base, size, &r->key);
    if (BTL_OK == rc) rc = btl_key_pack(&r->key, r->packed);
    if (BTL_OK != rc) {
        unlock();
        report("register_mem", rc);
        free(r);
        return NULL;
    }
    r->base = (uintptr_t) base;
    r->size = size;
    r->refs = 1;
#if REG_CACHE
    r->last = ++module.reg_clock;
    reg_keep(r);
#endif
    unlock();
    return r;
}

/* Deregisters `r` and frees it, or, while btl still uses the region,
 * keeps it on the retired list (said once, loudly: in Open MPI's protocols
 * the region is free by the time it is given back). Called locked. */
static void retire(struct mca_btl_base_registration_handle_t *r)
{
    int rc = btl_deregister(module.h, &r->key);
    if (OPAL_UNLIKELY(BTL_ERR_BUSY == rc)) {
        opal_output(0, "btl " NAME ": deregister_mem: %s: deregistered when that ends",
                    btl_last_error());
        r->next_retired = module.retired;
        module.retired = r;
        return;
    }
    if (OPAL_UNLIKELY(BTL_OK != rc)) report("deregister_mem", rc);
    free(r);
}

/* Deregisters the retired registrations btl has let go of. Called locked. */
static int retry_retired(void)
{
    int n = 0;
    struct mca_btl_base_registration_handle_t **p = &module.retired;
    while (*p) {
        struct mca_btl_base_registration_handle_t *r = *p;
        int rc = btl_deregister(module.h, &r->key);
        if (BTL_ERR_BUSY == rc) {
            p = &r->next_retired;
            continue;
        }
        if (BTL_OK != rc) report("deregister_mem (retired)", rc);
        *p = r->next_retired;
        free(r);
        n++;
    }
    return n;
}

static int m_deregister_mem(struct mca_btl_base_module_t *btl,
                            struct mca_btl_base_registration_handle_t *r)
{
    (void) btl;
    lock();
    if (r->refs > 0) r->refs--;
    /* a kept registration stays registered for the next use of its range
     * (REG_CACHE) */
    if (!r->cached) retire(r);
    unlock();
    return OPAL_SUCCESS;
}

static void rdma_done(rdma_t *op, int status)
{
    struct mca_btl_base_endpoint_t *ep = op->endpoint;
    void *addr = op->local_address;
    struct mca_btl_base_registration_handle_t *lh = op->local_handle;
    mca_btl_base_rdma_completion_fn_t cb = op->cbfunc;
    void *cbcontext = op->cbcontext, *cbdata = op->cbdata;
    if (op->temp) {
        retire(op->temp);
        op->temp = NULL;
        lh = NULL;
    }
    opal_free_list_return(&module.rdma, &op->super);
    if (cb) cb(&module.super, ep, addr, lh, cbcontext, cbdata, status);
}

static int rdma(int put, struct mca_btl_base_endpoint_t *ep, void *local_address,
                uint64_t remote_address, struct mca_btl_base_registration_handle_t *local_handle,
                struct mca_btl_base_registration_handle_t *remote_handle, size_t size,
                mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext, void *cbdata)
{
    btl_key_t remote;
    int rc;
    if (NULL == remote_handle) return OPAL_ERR_BAD_PARAM;
    lock();
    if (OPAL_UNLIKELY(ep->failed)) {
        unlock();
        return OPAL_ERR_UNREACH;
    }
    if (OPAL_UNLIKELY(!ep->announced)) announce(ep);
    rc = btl_key_unpack(remote_handle->packed, BTL_KEY_BYTES, &remote);
    if (BTL_OK != rc) {
        report(put ? "put" : "get", rc);
        unlock();
        return OPAL_ERR_BAD_PARAM;
    }
    rdma_t *op = (rdma_t *) opal_free_list_get(&module.rdma);
    if (NULL == op) {
        unlock();
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    op->endpoint = ep;
    op->local_address = local_address;
    op->local_handle = local_handle;
    op->temp = NULL;
    op->cbfunc = cbfunc;
    op->cbcontext = cbcontext;
    op->cbdata = cbdata;
    const btl_key_t *local;
    if (local_handle) {
        local = &local_handle->key;
    } else {
        /* the caller's memory was not registered: register it for this op */
        op->temp = calloc(1, sizeof(*op->temp));
        if (NULL == op->temp ||
            BTL_OK != (rc = btl_register(module.h, local_address, size, &op->temp->key))) {
            free(op->temp);
            op->temp = NULL;
            opal_free_list_return(&module.rdma, &op->super);
            unlock();
            return OPAL_ERR_OUT_OF_RESOURCE;
        }
        local = &op->temp->key;
    }
    void *ctx = (void *) ((uintptr_t) op | 1);
    rc = put ? btl_iput(module.h, local, local_address, &remote, remote_address, size, ctx)
             : btl_iget(module.h, local, local_address, &remote, remote_address, size, ctx);
    int ret = OPAL_SUCCESS;
    if (BTL_DONE == rc) {
        rdma_done(op, OPAL_SUCCESS);
    } else if (BTL_OK != rc) {
        if (BTL_ERR_WOULD_BLOCK != rc) report(put ? "put" : "get", rc);
        if (op->temp && BTL_OK == btl_deregister(module.h, &op->temp->key)) free(op->temp);
        opal_free_list_return(&module.rdma, &op->super);
        ret = to_opal(rc);
    }
    unlock();
    return ret;
}

/* btl_put and btl_get: one signature, the direction apart */
#define RDMA_FN(fn, put)                                                                       \
    static int fn(struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *ep,       \
                  void *local_address, uint64_t remote_address,                                \
                  struct mca_btl_base_registration_handle_t *local_handle,                     \
                  struct mca_btl_base_registration_handle_t *remote_handle, size_t size,       \
                  int flags, int order, mca_btl_base_rdma_completion_fn_t cbfunc,              \
                  void *cbcontext, void *cbdata)                                               \
    {                                                                                          \
        (void) btl;                                                                            \
        (void) flags;                                                                          \
        (void) order;                                                                          \
        return rdma(put, ep, local_address, remote_address, local_handle, remote_handle, size, \
                    cbfunc, cbcontext, cbdata);                                                \
    }
RDMA_FN(m_put, 1)
RDMA_FN(m_get, 0)

/* ------------------------------------------------------------------ progress */

static void on_event(void *ctx, const btl_event_t *ev)
{
    (void) ctx;
    if (BTL_EVENT_MESSAGE == ev->kind) {
        mca_btl_active_message_callback_t *t = &mca_btl_base_active_message_trigger[ev->tag];
        if (OPAL_UNLIKELY(NULL == t->cbfunc)) {
            opal_output(0, "btl " NAME ": a message from rank %u with tag %u, which nobody "
                        "registered, was dropped", ev->rank, (unsigned) ev->tag);
            return;
        }
        void *data = (void *) ev->data;
        /* Open MPI's headers are read through struct pointers: an unaligned
         * message is handed over from an aligned copy. */
        int copy = ((uintptr_t) data & 7) && ev->len;
        size_t need = ev->len;
#if BTL_OMPI_IFACE_33
        /* Open MPI 5's ob1 writes the communicator index into the match
         * header that would follow a CID response, past the end of that
         * fragment ("all BTLs create a dummy segment", pml_ob1_recvfrag.c).
         * A fast-box record is followed at once by the next record, which
         * that write would corrupt, so such a fragment is handed over from
         * a copy with room after it. */
        if (OPAL_UNLIKELY(OB1_TAG_CID == ev->tag)) {
            copy = 1;
            need = ev->len + OB1_CID_SLACK;
        }
#endif
        if (OPAL_UNLIKELY(copy)) {
            if (module.scratch_len < need) {
                void *p = realloc(module.scratch, need);
                if (NULL == p) {
                    opal_output(0, "btl " NAME ": out of memory for a %zu-byte message",
                                ev->len);
                    return;
                }
                module.scratch = p;
                module.scratch_len = need;
            }
            memcpy(module.scratch, data, ev->len);
            data = module.scratch;
        }
        module.rseg.seg_addr.pval = data;
        module.rseg.seg_len = ev->len;
        if (BTL_OMPI_PAD_RECV) pad(BTL_OMPI_PAD_RECV);
#if BTL_OMPI_IFACE_33
        const mca_btl_base_receive_descriptor_t rdes = {
            .endpoint = endpoint_of(ev->rank),
            .des_segments = &module.rseg,
            .des_segment_count = 1,
            .tag = ev->tag,
            .cbdata = t->cbdata,
        };
        t->cbfunc(&module.super, &rdes);
#else
        module.rdes.des_segments = &module.rseg;
        module.rdes.des_segment_count = 1;
        t->cbfunc(&module.super, ev->tag, &module.rdes, t->cbdata);
#endif
    } else if (BTL_EVENT_DONE == ev->kind) {
        int status = BTL_OK == ev->status ? OPAL_SUCCESS : to_opal(ev->status);
        if (BTL_OK != ev->status) {
            opal_output(0, "btl " NAME ": an operation with rank %u failed: %s", ev->rank,
                        ev->text ? ev->text : btl_strerror(ev->status));
        }
        if ((uintptr_t) ev->context & 1) {
            rdma_done((rdma_t *) ((uintptr_t) ev->context & ~(uintptr_t) 1), status);
        } else if (ev->context) {
            frag_t *f = ev->context;
            uint32_t flags = f->base.des_flags;
            if (f->base.des_cbfunc) f->base.des_cbfunc(&module.super, f->endpoint, &f->base, status);
            if (flags & MCA_BTL_DES_FLAGS_BTL_OWNERSHIP) frag_release(f);
        }
    } else if (BTL_EVENT_PEER_FAILED == ev->kind) {
        peer_failed(ev->rank, ev->text);
    }
}

/* One thread progresses at a time, and the others do not wait for it: a
 * thread that finds the lock taken (another thread progressing, or one in
 * a send) returns at once, as vader's progress does, instead of queueing
 * behind it to find nothing left to do. Whatever it waits for is delivered
 * by the thread that holds the lock. */
static int component_progress(void)
{
    int n = 0;
    if (NULL == module.h || !module.connected) return 0;
    if (OPAL_THREAD_TRYLOCK(&module.lock)) return 0;
    if (!module.in_progress) {
        module.in_progress = 1;
        if (OPAL_UNLIKELY(module.npending)) n += retry_pending();
        if (OPAL_UNLIKELY(NULL != module.retired)) n += retry_retired();
        int rc = btl_progress(module.h, on_event, NULL);
        if (rc > 0) n += rc;
        module.in_progress = 0;
    }
    unlock();
    return n;
}

/* ------------------------------------------------------------------ procs */

static int fetch(void *ctx, uint32_t rank, void *buf, size_t cap, size_t *len)
{
    (void) ctx;
    opal_process_name_t name = OPAL_PROC_MY_NAME;
    uint8_t *data = NULL;
    size_t size = 0;
    int rc;
    name.vpid = rank;
    OPAL_MODEX_RECV(rc, &COMPONENT.btl_version, &name, (void **) &data, &size);
    if (OPAL_SUCCESS != rc || NULL == data) {
        opal_output(0, "btl " NAME ": no address of rank %u in the modex (%d)", rank, rc);
        free(data);
        return -1;
    }
    if (size > cap) {
        free(data);
        return -1;
    }
    memcpy(buf, data, size);
    *len = size;
    free(data);
    return 0;
}

static int connect_all(void)
{
    if (module.connected || module.connect_failed) return module.connected;
    int rc = btl_connect(module.h, fetch, NULL);
    if (BTL_OK != rc) {
        report("connecting to the job's other ranks failed; the " NAME
               " component reaches nobody", rc);
        module.connect_failed = 1;
        return 0;
    }
    module.connected = 1;
    /* the largest get/put is the transport's largest message */
    for (uint32_t r = 0; r < module.size; r++) {
        btl_limits_t l;
        if (r != module.rank && 1 == btl_reachable(module.h, r) &&
            BTL_OK == btl_limits(module.h, r, &l)) {
            module.super.btl_get_limit = l.max_message;
            module.super.btl_put_limit = l.max_message;
            break;
        }
    }
    return 1;
}

static int m_add_procs(struct mca_btl_base_module_t *btl, size_t nprocs,
                         struct opal_proc_t **procs, struct mca_btl_base_endpoint_t **peers,
                         opal_bitmap_t *reachable)
{
    (void) btl;
    opal_process_name_t me = OPAL_PROC_MY_NAME;
    lock();
    if (!connect_all()) {
        unlock();
        return OPAL_SUCCESS;
    }
    for (size_t i = 0; i < nprocs; i++) {
        opal_proc_t *p = procs[i];
        peers[i] = NULL;
        if (p->proc_name.jobid != me.jobid || p->proc_name.vpid == me.vpid) continue;
        uint32_t rank = p->proc_name.vpid;
        if (rank >= module.size) continue;
#if defined(BTL_OMPI_RSM)
        if (!OPAL_PROC_ON_LOCAL_NODE(p->proc_flags)) continue;
#endif
        if (1 != btl_reachable(module.h, rank)) {
            VERBOSE(10, "rank %u is not reached by btl's %s", rank, WHAT);
            continue;
        }
        struct mca_btl_base_endpoint_t *ep = module.eps[rank];
        if (NULL == ep) {
            ep = calloc(1, sizeof(*ep));
            if (NULL == ep) {
                unlock();
                return OPAL_ERR_OUT_OF_RESOURCE;
            }
            OBJ_CONSTRUCT(&ep->pending, opal_list_t);
            ep->rank = rank;
            module.eps[rank] = ep;
        }
        ep->proc = p;
        peers[i] = ep;
        if (reachable) opal_bitmap_set_bit(reachable, (int) i);
        VERBOSE(20, "rank %u (%s) is reachable over btl's %s", rank,
                host_of(p), WHAT);
    }
    unlock();
    return OPAL_SUCCESS;
}

static int m_del_procs(struct mca_btl_base_module_t *btl, size_t nprocs,
                         struct opal_proc_t **procs, struct mca_btl_base_endpoint_t **peers)
{
    (void) btl;
    (void) procs;
    (void) peers;
    (void) nprocs;
    /* endpoints stay (by rank) until finalize: btl may still report on them */
    return OPAL_SUCCESS;
}

static int m_register_cb(struct mca_btl_base_module_t *btl, mca_btl_base_tag_t tag,
                           mca_btl_base_module_recv_cb_fn_t cbfunc, void *cbdata)
{
    (void) btl;
    (void) cbfunc;
    (void) cbdata;
    /* the callbacks live in Open MPI's table; btl refuses its own tags */
    if (tag > BTL_MAX_TAG) {
        opal_output(0, "btl " NAME ": tag %u is reserved by btl (user tags 0..%d)",
                    (unsigned) tag, BTL_MAX_TAG);
        return OPAL_ERR_BAD_PARAM;
    }
    return OPAL_SUCCESS;
}

static int m_register_error(struct mca_btl_base_module_t *btl,
                              mca_btl_base_module_error_cb_fn_t cbfunc)
{
    (void) btl;
    module.error_cb = cbfunc;
    return OPAL_SUCCESS;
}

static void m_dump(struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *ep,
                     int verbose)
{
    (void) btl;
    (void) verbose;
    if (ep) {
        opal_output(0, "btl " NAME ": endpoint rank %u%s, %zu descriptors parked", ep->rank,
                    ep->failed ? " (failed)" : "", opal_list_get_size(&ep->pending));
    }
}

static int m_finalize_module(struct mca_btl_base_module_t *btl)
{
    (void) btl;
    lock();
    module.finalizing = 1;
#if REG_CACHE
    /* kept registrations nobody uses are deregistered; one still in use
     * stays Open MPI's (its deregistration then only drops the use: btl's
     * regions end with btl_finalize below) */
    if (module.h) reg_drop_all();
#endif
    if (module.h) {
        int rc = btl_finalize(&module.h);
        if (BTL_OK != rc) report("finalize", rc);
    }
    /* btl's regions went with it */
    while (module.retired) {
        struct mca_btl_base_registration_handle_t *r = module.retired;
        module.retired = r->next_retired;
        free(r);
    }
    if (module.eps) {
        for (uint32_t r = 0; r < module.size; r++) {
            if (module.eps[r]) {
                OBJ_DESTRUCT(&module.eps[r]->pending);
                free(module.eps[r]);
            }
        }
        free(module.eps);
        module.eps = NULL;
    }
    free(module.scratch);
    module.scratch = NULL;
    module.scratch_len = 0;
    OBJ_DESTRUCT(&module.eager);
    OBJ_DESTRUCT(&module.max);
    OBJ_DESTRUCT(&module.rdma);
    unlock();
#if !BTL_OMPI_IFACE_33
    OBJ_DESTRUCT(&module.rdes);
#endif
    OBJ_DESTRUCT(&module.lock);
    return OPAL_SUCCESS;
}

/* ------------------------------------------------------------------ init */

static char *clean_name(const char *s, char *out, size_t cap)
{
    size_t n = 0;
    for (; s && *s && n + 1 < cap; s++) {
        char c = *s;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        out[n++] = ok ? c : '_';
    }
    if (0 == n) out[n++] = 'x';
    out[n] = '\0';
    return out;
}

static int free_list(opal_free_list_t *fl, opal_class_t *cls, size_t item, size_t payload,
                     int64_t num, int64_t max, int64_t inc)
{
    OBJ_CONSTRUCT(fl, opal_free_list_t);
    return opal_free_list_init(fl, item, opal_cache_line_size, cls, payload, opal_cache_line_size,
                               (int) num, (int) max, (int) inc, NULL, 0, NULL, NULL, NULL);
}

static mca_btl_base_module_t **component_init(int *num_btls, bool enable_progress_threads,
                                              bool enable_mpi_threads)
{
    (void) enable_progress_threads;
    (void) enable_mpi_threads;
    btl_config_t *cfg = NULL;
    mca_btl_base_module_t **out = NULL;
    int64_t v[16];
    static const char *const attrs[] = {
        "eager_limit", "rndv_eager_limit", "max_send_size", "rdma_pipeline_send_length",
        "rdma_pipeline_frag_size", "min_rdma_pipeline_size", "exclusivity", "latency",
        "bandwidth", "flags", "free_list_num", "free_list_max", "free_list_inc",
    };
    enum { EAGER, RNDV, MAXSEND, PSEND, PFRAG, PMIN, EXCL, LAT, BW, FLAGS, FLN, FLM, FLI, NATTR };
    char job[64], node[64];
    uint32_t size = 0, *psize = &size;
    int rc;
    opal_process_name_t wild = OPAL_PROC_MY_NAME;

    *num_btls = 0;
    wild.vpid = OPAL_VPID_WILDCARD;
    OPAL_MODEX_RECV_VALUE(rc, MODEX_JOB_SIZE, &wild, &psize, MODEX_UINT32);
    if (OPAL_SUCCESS != rc || 0 == size) {
        opal_output(0, "btl " NAME ": the job's size is unknown (%d): declining", rc);
        return NULL;
    }

    if (BTL_OK != btl_config_new(&cfg)) return NULL;
    if (OPAL_SUCCESS != configure(cfg)) goto decline;
    if (BTL_OK != (rc = btl_config_set(cfg, "btl", "transport", TRANSPORT))) {
        report("transport", rc);
        goto decline;
    }
    if ((uint32_t) opal_process_info.num_local_peers + 1 >= size) {
        /* one node: btl keeps TCP on loopback unless if_include says otherwise */
        (void) btl_config_set(cfg, "btl", "nodes", "1");
    }
    for (int i = 0; i < NATTR; i++) {
        if (BTL_OK != number(cfg, attrs[i], &v[i])) goto decline;
    }

    memset(&module, 0, sizeof(module));
    OBJ_CONSTRUCT(&module.lock, opal_recursive_mutex_t);
#if !BTL_OMPI_IFACE_33
    OBJ_CONSTRUCT(&module.rdes, mca_btl_base_descriptor_t);
#endif
    module.rank = OPAL_PROC_MY_NAME.vpid;
    module.size = size;

    snprintf(job, sizeof(job), "ompi-%08x-" NAME, (unsigned) OPAL_PROC_MY_NAME.jobid);
    clean_name(opal_process_info.nodename, node, sizeof(node));
    btl_identity_t id = {.job = job, .rank = module.rank, .size = size, .node = node};
    rc = btl_open(cfg, &id, &module.h);
    if (BTL_OK != rc) {
        report("btl_open", rc);
        goto decline_module;
    }
    btl_config_free(cfg);
    cfg = NULL;
    {
        const void *blob;
        size_t len;
        rc = btl_address(module.h, &blob, &len);
        if (BTL_OK != rc) {
            report("btl_address", rc);
            goto decline_module;
        }
        OPAL_MODEX_SEND(rc, MODEX_GLOBAL, &COMPONENT.btl_version, blob, len);
        if (OPAL_SUCCESS != rc) {
            opal_output(0, "btl " NAME ": publishing our address failed (%d)", rc);
            goto decline_module;
        }
    }
#if defined(BTL_OMPI_RSM)
    /* Alone on this node: rsm has nobody to talk to here, but only after
     * publishing the address: the ranks of the other nodes read every
     * rank's address in btl_connect (to learn its node), and one missing
     * fails their connect — their rsm would reach nobody and the traffic
     * inside their node fall to TCP (8 B between two ranks of a host: 4.6
     * us instead of 0.2, scripts/ompi-mixbench.sh). */
    if (0 == opal_process_info.num_local_peers) {
        VERBOSE(10, "no other rank on this node (our address is published for the others)");
        goto decline_module;
    }
#endif

    mca_btl_base_module_t *m = &module.super;
    m->btl_component = &COMPONENT;
    module.small_cap = (size_t) v[EAGER];
#if defined(BTL_OMPI_RSM)
    /* ob1's eager limit (see the decisions at the top) */
    m->btl_eager_limit = (size_t) v[EAGER] * 2 + 64;
    if (m->btl_eager_limit > (size_t) v[MAXSEND]) m->btl_eager_limit = (size_t) v[MAXSEND];
    if (m->btl_eager_limit < (size_t) v[EAGER]) m->btl_eager_limit = (size_t) v[EAGER];
#else
    /* ob1's eager limit (see the decisions at the top) */
    m->btl_eager_limit = (size_t) v[MAXSEND];
    if (m->btl_eager_limit < (size_t) v[EAGER]) m->btl_eager_limit = (size_t) v[EAGER];
#endif
    m->btl_rndv_eager_limit = (size_t) v[RNDV];
    m->btl_max_send_size = (size_t) v[MAXSEND];
    m->btl_rdma_pipeline_send_length = (size_t) v[PSEND];
    m->btl_rdma_pipeline_frag_size = (size_t) v[PFRAG];
    m->btl_min_rdma_pipeline_size = (size_t) v[PMIN];
    m->btl_exclusivity = (uint32_t) v[EXCL];
    m->btl_latency = (uint32_t) v[LAT];
    m->btl_bandwidth = (uint32_t) v[BW];
    m->btl_flags = ((uint32_t) v[FLAGS] & MCA_BTL_FLAGS_RDMA) | MCA_BTL_FLAGS_SEND |
                   MCA_BTL_FLAGS_SEND_INPLACE;
    m->btl_atomic_flags = 0;
    m->btl_registration_handle_size = BTL_KEY_BYTES;
    m->btl_get_limit = 1u << 30;
    m->btl_put_limit = 1u << 30;
    m->btl_get_alignment = 0;
    m->btl_put_alignment = 0;
    m->btl_get_local_registration_threshold = 0;
    m->btl_put_local_registration_threshold = 0;
    m->btl_add_procs = m_add_procs;
    m->btl_del_procs = m_del_procs;
    m->btl_register = m_register_cb;
    m->btl_finalize = m_finalize_module;
    m->btl_alloc = m_alloc;
    m->btl_free = m_free;
    m->btl_prepare_src = m_prepare_src;
    m->btl_send = m_send;
    m->btl_sendi = m_sendi;
    m->btl_put = m_put;
    m->btl_get = m_get;
    m->btl_dump = m_dump;
    m->btl_register_mem = m_register_mem;
    m->btl_deregister_mem = m_deregister_mem;
    m->btl_register_error = m_register_error;

    module.eps = calloc(size, sizeof(*module.eps));
    if (NULL == module.eps) goto decline_module;
    if (OPAL_SUCCESS != free_list(&module.eager, OBJ_CLASS(frag_t), sizeof(frag_t),
                                  module.small_cap, v[FLN], v[FLM], v[FLI]) ||
        OPAL_SUCCESS != free_list(&module.max, OBJ_CLASS(frag_t), sizeof(frag_t),
                                  m->btl_max_send_size, v[FLN], v[FLM], v[FLI]) ||
        OPAL_SUCCESS != free_list(&module.rdma, OBJ_CLASS(rdma_t), sizeof(rdma_t), 0, v[FLN],
                                  v[FLM], v[FLI])) {
        opal_output(0, "btl " NAME ": free lists could not be made");
        goto decline_module;
    }
    out = malloc(sizeof(*out));
    if (NULL == out) goto decline_module;
    out[0] = m;
    *num_btls = 1;
    VERBOSE(10, "rank %u of %u on %s: btl's %s (eager %zu, max send %zu, exclusivity %u)",
            module.rank, size, node, WHAT, m->btl_eager_limit, m->btl_max_send_size,
            m->btl_exclusivity);
    return out;

decline_module:
    if (module.h) btl_finalize(&module.h);
    free(module.eps);
    module.eps = NULL;
decline:
    btl_config_free(cfg);
    VERBOSE(10, "declining");
    return NULL;
}

static int component_close(void)
{
    if (module.h) {
        btl_finalize(&module.h);
    }
    (void) verbose_stream;
    return OPAL_SUCCESS;
}

mca_btl_base_component_3_0_0_t COMPONENT = {
    .btl_version = {
        MCA_BTL_DEFAULT_VERSION(NAME),
        .mca_open_component = component_open,
        .mca_close_component = component_close,
        .mca_register_component_params = component_register,
    },
    .btl_data = {
        .param_field = MCA_BASE_METADATA_PARAM_CHECKPOINT,
    },
    .btl_init = component_init,
    .btl_progress = component_progress,
};
