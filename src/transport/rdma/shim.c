/*
 * shoal's RDMA shim: a small C layer over the platform's own <infiniband/verbs.h> (Apple's SDK on macOS
 * 26.2+, rdma-core on Linux), so Rust never depends on the layout of verbs structs. The verbs library is
 * not linked: it is opened at run time (librdma.dylib, libibverbs.so.1) and its exported functions are
 * resolved with dlsym. ibv_post_send, ibv_post_recv and ibv_poll_cq are static inline in verbs.h (they
 * call through the context's ops table), so they are used from the header. Inline wrappers that call
 * exported functions (the ibv_query_port and ibv_reg_mr macros of rdma-core) are avoided: those
 * functions are called through the resolved pointers instead, so this object has no undefined ibv_*
 * symbol.
 *
 * Apple's rules shape the queue pair: unreliable connection (UC), SEND/RECV only, port 1, GID index 1
 * (the IPv4-mapped GID of the Thunderbolt interface), page-aligned buffers in one memory region, every
 * send and receive spanning a whole slot (equal frame counts on both sides).
 */

#include <infiniband/verbs.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHOAL_PORT 1
#define SHOAL_GID_INDEX 1
#define SHOAL_WR_SEND 1u
#define SHOAL_WR_RECV 2u

typedef struct shoal_verbs {
    void *library;
    struct ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(struct ibv_device **);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*close_device)(struct ibv_context *);
    /* The exported symbol (rdma-core's compat entry point, Apple's function) fills a prefix of the struct. */
    int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int (*dealloc_pd)(struct ibv_pd *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    int (*dereg_mr)(struct ibv_mr *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    int (*destroy_cq)(struct ibv_cq *);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*destroy_qp)(struct ibv_qp *);
} shoal_verbs;

/* What one side tells the other over the control connection. */
typedef struct shoal_rdma_endpoint {
    uint8_t gid[16];
    uint32_t qpn;
    uint32_t psn;
    uint32_t lid;
} shoal_rdma_endpoint;

typedef struct shoal_rdma_completion {
    uint32_t slot;
    uint32_t is_recv;
    uint32_t status; /* enum ibv_wc_status; 0 is success */
    uint32_t byte_len;
} shoal_rdma_completion;

typedef struct shoal_rdma_link {
    const shoal_verbs *verbs;
    struct ibv_context *context;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    uint8_t *memory; /* send slots, then receive slots */
    uint32_t slots;
    uint32_t slot_bytes;
    uint32_t psn;
} shoal_rdma_link;

static void say(char *err, size_t err_len, const char *format, ...) {
    if (err == NULL || err_len == 0) return;
    va_list args;
    va_start(args, format);
    vsnprintf(err, err_len, format, args);
    va_end(args);
}

static int fail(char *err, size_t err_len, int code, const char *what) {
    say(err, err_len, "%s failed: %s (errno %d)", what, strerror(code), code);
    return -code;
}

shoal_verbs *shoal_rdma_load(const char *path, char *err, size_t err_len) {
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        const char *why = dlerror();
        say(err, err_len, "%s", why ? why : "dlopen failed");
        return NULL;
    }
    shoal_verbs *v = calloc(1, sizeof(*v));
    if (v == NULL) {
        dlclose(library);
        say(err, err_len, "out of memory");
        return NULL;
    }
    v->library = library;
#define RESOLVE(field, symbol)                                                                    \
    do {                                                                                          \
        *(void **)(&v->field) = dlsym(library, symbol);                                           \
        if (v->field == NULL) {                                                                   \
            say(err, err_len, "%s has no function %s", path, symbol);                             \
            dlclose(library);                                                                     \
            free(v);                                                                              \
            return NULL;                                                                          \
        }                                                                                         \
    } while (0)
    RESOLVE(get_device_list, "ibv_get_device_list");
    RESOLVE(free_device_list, "ibv_free_device_list");
    RESOLVE(get_device_name, "ibv_get_device_name");
    RESOLVE(open_device, "ibv_open_device");
    RESOLVE(close_device, "ibv_close_device");
    RESOLVE(query_port, "ibv_query_port");
    RESOLVE(query_gid, "ibv_query_gid");
    RESOLVE(alloc_pd, "ibv_alloc_pd");
    RESOLVE(dealloc_pd, "ibv_dealloc_pd");
    RESOLVE(reg_mr, "ibv_reg_mr");
    RESOLVE(dereg_mr, "ibv_dereg_mr");
    RESOLVE(create_cq, "ibv_create_cq");
    RESOLVE(destroy_cq, "ibv_destroy_cq");
    RESOLVE(create_qp, "ibv_create_qp");
    RESOLVE(modify_qp, "ibv_modify_qp");
    RESOLVE(destroy_qp, "ibv_destroy_qp");
#undef RESOLVE
    return v;
}

void shoal_rdma_unload(shoal_verbs *v) {
    if (v == NULL) return;
    dlclose(v->library);
    free(v);
}

/* The devices' names, each ending in '\n', into `names`. Returns the count, or -errno when the list
 * cannot be had (Linux without RDMA support: -ENOSYS), or -ENOSPC when `names` is too small. */
int shoal_rdma_device_names(const shoal_verbs *v, char *names, size_t capacity, char *err, size_t err_len) {
    int count = 0;
    errno = 0;
    struct ibv_device **list = v->get_device_list(&count);
    if (list == NULL) {
        int code = errno ? errno : ENODEV;
        return fail(err, err_len, code, "ibv_get_device_list");
    }
    size_t used = 0;
    int result = count;
    if (capacity > 0) names[0] = '\0';
    for (int i = 0; i < count; i++) {
        const char *name = v->get_device_name(list[i]);
        size_t length = strlen(name ? name : "");
        if (used + length + 2 > capacity) {
            result = fail(err, err_len, ENOSPC, "listing the RDMA device names");
            break;
        }
        memcpy(names + used, name ? name : "", length);
        used += length;
        names[used++] = '\n';
        names[used] = '\0';
    }
    v->free_device_list(list);
    return result;
}

void shoal_rdma_link_close(shoal_rdma_link *link) {
    if (link == NULL) return;
    const shoal_verbs *v = link->verbs;
    if (link->qp) v->destroy_qp(link->qp);
    if (link->mr) v->dereg_mr(link->mr);
    if (link->cq) v->destroy_cq(link->cq);
    if (link->pd) v->dealloc_pd(link->pd);
    if (link->context) v->close_device(link->context);
    free(link->memory);
    free(link);
}

static int open_context(shoal_rdma_link *link, const char *device, char *err, size_t err_len) {
    const shoal_verbs *v = link->verbs;
    int count = 0;
    errno = 0;
    struct ibv_device **list = v->get_device_list(&count);
    if (list == NULL) return fail(err, err_len, errno ? errno : ENODEV, "ibv_get_device_list");
    for (int i = 0; i < count && link->context == NULL; i++) {
        const char *name = v->get_device_name(list[i]);
        if (name != NULL && strcmp(name, device) == 0) {
            errno = 0;
            link->context = v->open_device(list[i]);
            if (link->context == NULL) {
                int code = errno ? errno : EIO;
                v->free_device_list(list);
                return fail(err, err_len, code, "ibv_open_device");
            }
        }
    }
    v->free_device_list(list);
    if (link->context == NULL) {
        say(err, err_len, "no RDMA device named %s (%d available)", device, count);
        return -ENODEV;
    }
    return 0;
}

/* Opens `device` and makes a UC queue pair in state INIT with `slots` send and `slots` receive slots of
 * `slot_bytes` each (a multiple of 4 KiB), page-aligned, registered as one memory region. */
int shoal_rdma_link_open(const shoal_verbs *v, const char *device, uint32_t slots, uint32_t slot_bytes,
                         uint32_t psn, shoal_rdma_link **out, char *err, size_t err_len) {
    *out = NULL;
    if (slots == 0 || slot_bytes == 0 || slot_bytes % 4096 != 0) {
        say(err, err_len, "slots must be whole 4 KiB frames (got %u slots of %u bytes)", slots, slot_bytes);
        return -EINVAL;
    }
    shoal_rdma_link *link = calloc(1, sizeof(*link));
    if (link == NULL) return fail(err, err_len, ENOMEM, "allocating the link");
    link->verbs = v;
    link->slots = slots;
    link->slot_bytes = slot_bytes;
    link->psn = psn & 0xffffff;
    int rc = open_context(link, device, err, err_len);
    if (rc != 0) goto failed;
    size_t bytes = (size_t)slots * slot_bytes * 2;
    long page = sysconf(_SC_PAGESIZE);
    void *memory = NULL;
    rc = posix_memalign(&memory, page > 0 ? (size_t)page : 16384, bytes);
    if (rc != 0) {
        rc = fail(err, err_len, rc, "allocating page-aligned buffers");
        goto failed;
    }
    link->memory = memory;
    memset(link->memory, 0, bytes);
    errno = 0;
    link->pd = v->alloc_pd(link->context);
    if (link->pd == NULL) {
        rc = fail(err, err_len, errno ? errno : EIO, "ibv_alloc_pd");
        goto failed;
    }
    errno = 0;
    link->mr = v->reg_mr(link->pd, link->memory, bytes, IBV_ACCESS_LOCAL_WRITE);
    if (link->mr == NULL) {
        rc = fail(err, err_len, errno ? errno : EIO, "ibv_reg_mr");
        goto failed;
    }
    errno = 0;
    link->cq = v->create_cq(link->context, (int)(slots * 2), NULL, NULL, 0);
    if (link->cq == NULL) {
        rc = fail(err, err_len, errno ? errno : EIO, "ibv_create_cq");
        goto failed;
    }
    struct ibv_qp_init_attr init;
    memset(&init, 0, sizeof(init));
    init.send_cq = link->cq;
    init.recv_cq = link->cq;
    init.qp_type = IBV_QPT_UC;
    init.cap.max_send_wr = slots;
    init.cap.max_recv_wr = slots;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    errno = 0;
    link->qp = v->create_qp(link->pd, &init);
    if (link->qp == NULL) {
        rc = fail(err, err_len, errno ? errno : EIO, "ibv_create_qp");
        goto failed;
    }
    struct ibv_qp_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = SHOAL_PORT;
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
    rc = v->modify_qp(link->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc != 0) {
        rc = fail(err, err_len, rc, "moving the queue pair to INIT");
        goto failed;
    }
    *out = link;
    return 0;
failed:
    shoal_rdma_link_close(link);
    return rc;
}

/* This side's queue pair number, packet sequence number, LID and GID at index 1. */
int shoal_rdma_link_local(const shoal_rdma_link *link, shoal_rdma_endpoint *out, char *err, size_t err_len) {
    const shoal_verbs *v = link->verbs;
    struct ibv_port_attr port;
    memset(&port, 0, sizeof(port));
    int rc = v->query_port(link->context, SHOAL_PORT, &port);
    if (rc != 0) return fail(err, err_len, rc, "ibv_query_port");
    union ibv_gid gid;
    memset(&gid, 0, sizeof(gid));
    rc = v->query_gid(link->context, SHOAL_PORT, SHOAL_GID_INDEX, &gid);
    if (rc != 0) return fail(err, err_len, rc, "ibv_query_gid (index 1)");
    memcpy(out->gid, gid.raw, 16);
    out->qpn = link->qp->qp_num;
    out->psn = link->psn;
    out->lid = port.lid;
    return 0;
}

/* Moves the queue pair to RTR towards `remote`, then to RTS. */
int shoal_rdma_link_connect(shoal_rdma_link *link, const shoal_rdma_endpoint *remote, char *err, size_t err_len) {
    const shoal_verbs *v = link->verbs;
    struct ibv_qp_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = IBV_MTU_1024;
    attr.dest_qp_num = remote->qpn;
    attr.rq_psn = remote->psn;
    attr.ah_attr.dlid = (uint16_t)remote->lid;
    attr.ah_attr.port_num = SHOAL_PORT;
    union ibv_gid gid;
    memcpy(gid.raw, remote->gid, 16);
    if (gid.global.interface_id != 0) {
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid = gid;
        attr.ah_attr.grh.sgid_index = SHOAL_GID_INDEX;
        attr.ah_attr.grh.hop_limit = 1;
    }
    int rc = v->modify_qp(link->qp, &attr,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN);
    if (rc != 0) return fail(err, err_len, rc, "moving the queue pair to RTR");
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = link->psn;
    rc = v->modify_qp(link->qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN);
    if (rc != 0) return fail(err, err_len, rc, "moving the queue pair to RTS");
    return 0;
}

/* The start of send slot `slot` (or receive slot, with `receive`); each is `slot_bytes` long. */
uint8_t *shoal_rdma_link_slot(const shoal_rdma_link *link, int receive, uint32_t slot) {
    if (slot >= link->slots) return NULL;
    size_t index = (size_t)(receive ? link->slots + slot : slot);
    return link->memory + index * link->slot_bytes;
}

int shoal_rdma_link_post_recv(shoal_rdma_link *link, uint32_t slot, char *err, size_t err_len) {
    uint8_t *buffer = shoal_rdma_link_slot(link, 1, slot);
    if (buffer == NULL) return fail(err, err_len, EINVAL, "posting a receive");
    struct ibv_sge sge = {.addr = (uintptr_t)buffer, .length = link->slot_bytes, .lkey = link->mr->lkey};
    struct ibv_recv_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = ((uint64_t)SHOAL_WR_RECV << 32) | slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    struct ibv_recv_wr *bad = NULL;
    int rc = ibv_post_recv(link->qp, &wr, &bad);
    return rc == 0 ? 0 : fail(err, err_len, rc, "ibv_post_recv");
}

/* Sends the whole of send slot `slot` (a receiver posts whole slots too: equal frame counts). */
int shoal_rdma_link_post_send(shoal_rdma_link *link, uint32_t slot, char *err, size_t err_len) {
    uint8_t *buffer = shoal_rdma_link_slot(link, 0, slot);
    if (buffer == NULL) return fail(err, err_len, EINVAL, "posting a send");
    struct ibv_sge sge = {.addr = (uintptr_t)buffer, .length = link->slot_bytes, .lkey = link->mr->lkey};
    struct ibv_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = ((uint64_t)SHOAL_WR_SEND << 32) | slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(link->qp, &wr, &bad);
    return rc == 0 ? 0 : fail(err, err_len, rc, "ibv_post_send");
}

/* Up to `max` completions into `out`: their count, or a negative value when polling failed. */
int shoal_rdma_link_poll(shoal_rdma_link *link, shoal_rdma_completion *out, int max) {
    struct ibv_wc wc[32];
    if (max > 32) max = 32;
    int n = ibv_poll_cq(link->cq, max, wc);
    for (int i = 0; i < n; i++) {
        out[i].slot = (uint32_t)(wc[i].wr_id & 0xffffffffu);
        out[i].is_recv = (uint32_t)(wc[i].wr_id >> 32) == SHOAL_WR_RECV;
        out[i].status = (uint32_t)wc[i].status;
        out[i].byte_len = wc[i].byte_len;
    }
    return n;
}
