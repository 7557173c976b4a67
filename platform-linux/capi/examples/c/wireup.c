/* An external runtime's wire-up, as Open MPI's rsm and rtcp components
 * will do it: two handles in one process, opened with an identity the
 * "runtime" gives (btl_open), their address blobs exchanged by the
 * runtime (here: over a btl_init handle standing in for Open MPI's
 * modex), a fence (its barrier), then btl_connect with a callback that
 * hands back each peer's blob.
 *
 *   btl run -n 4 -- ./wireup [--split]
 *
 * Handle "local" uses transport sm-local, handle "net" transport tcp
 * (over loopback: tcp.if_include=lo). With --split, odd and even ranks
 * claim different node names: "local" then reaches only the ranks of its
 * own "node" (the others are unreachable, not an error) while "net"
 * reaches everyone. Each handle then runs a checked ring exchange over
 * the ranks it reaches. */
#include "common.h"
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define MAXR 64
#define TAG_BLOB_LOCAL 10
#define TAG_BLOB_NET 11
#define TAG_RING 3

struct blobs {
  uint8_t data[MAXR][1024];
  size_t len[MAXR];
  int count;
};

struct runtime {
  struct blobs local, net;
};

static void on_runtime(void *ctx, const btl_event_t *ev) {
  struct runtime *rt = ctx;
  if (ev->kind != BTL_EVENT_MESSAGE) return;
  struct blobs *b = ev->tag == TAG_BLOB_LOCAL ? &rt->local : &rt->net;
  if (ev->rank >= MAXR || ev->len > sizeof b->data[0]) { fprintf(stderr, "bad blob\n"); exit(1); }
  memcpy(b->data[ev->rank], ev->data, ev->len);
  b->len[ev->rank] = ev->len;
  b->count++;
}

/* btl_fetch_fn: the peer's blob from what the runtime gathered. */
static int fetch(void *ctx, uint32_t rank, void *buf, size_t cap, size_t *len) {
  struct blobs *b = ctx;
  if (rank >= MAXR || b->len[rank] == 0 || b->len[rank] > cap) return -1;
  memcpy(buf, b->data[rank], b->len[rank]);
  *len = b->len[rank];
  return 0;
}

/* The runtime's publish: `h`'s blob into `b` (our own entry) and, over
 * `modex` with tag `tag`, to every other rank. */
static void publish(btl_t *modex, btl_t *h, struct blobs *b, uint8_t tag, uint32_t me, uint32_t n) {
  const void *blob;
  size_t len;
  CHECK(btl_address(h, &blob, &len));
  memcpy(b->data[me], blob, len);
  b->len[me] = len;
  for (uint32_t p = 0; p < n; p++) {
    if (p == me) continue;
    btl_iovec_t iov = {blob, len};
    CHECK(btl_sendi(modex, p, tag, &iov, 1));
  }
}

struct ring {
  int got;
  uint32_t from;
  int bad;
};

static void on_ring(void *ctx, const btl_event_t *ev) {
  struct ring *r = ctx;
  if (ev->kind == BTL_EVENT_PEER_FAILED) { fprintf(stderr, "peer failed: %s\n", ev->text); exit(1); }
  if (ev->kind != BTL_EVENT_MESSAGE || ev->tag != TAG_RING) return;
  uint32_t v;
  if (ev->len != 4) { r->bad++; return; }
  memcpy(&v, ev->data, 4);
  if (v != ev->rank * 1000 + 7) r->bad++;
  r->from = ev->rank;
  r->got++;
}

/* Each rank sends to the next rank it reaches and waits for one message. */
static int ring(btl_t *h, const char *name, uint32_t me, uint32_t n) {
  int reach = 0;
  for (uint32_t p = 0; p < n; p++) {
    int rc = btl_reachable(h, p);
    CHECK(rc);
    reach += rc;
  }
  if (reach < 2) return reach;
  uint32_t next = me;
  do next = (next + 1) % n; while (btl_reachable(h, next) != 1);
  uint32_t v = me * 1000 + 7;
  btl_iovec_t iov = {&v, 4};
  int rc;
  while ((rc = btl_sendi(h, next, TAG_RING, &iov, 1)) == BTL_ERR_WOULD_BLOCK)
    CHECK(btl_progress(h, on_ring, NULL));
  CHECK(rc);
  struct ring r = {0};
  WAIT_UNTIL(h, on_ring, &r, r.got == 1, name);
  if (r.bad) { fprintf(stderr, "%s: bad ring message\n", name); exit(1); }
  CHECK(btl_barrier(h));
  return reach;
}

int main(int argc, char **argv) {
  int split = argc > 1 && !strcmp(argv[1], "--split");
  struct runtime rt;
  memset(&rt, 0, sizeof rt);
  btl_t *modex = NULL;
  CHECK(btl_init(NULL, &modex));
  uint32_t me, n;
  CHECK(btl_rank(modex, &me));
  CHECK(btl_size(modex, &n));
  if (n > MAXR) return 1;

  /* Phase 1: open both handles with the runtime's identity. */
  char job_local[80], job_net[80], node[32];
  const char *job = getenv("BTL_JOB") ? getenv("BTL_JOB") : "wireup";
  snprintf(job_local, sizeof job_local, "%s.local", job);
  snprintf(job_net, sizeof job_net, "%s.net", job);
  snprintf(node, sizeof node, split ? "node%u" : "node", split ? me % 2 : 0);
  btl_config_t *cl, *cn;
  CHECK(btl_config_new(&cl));
  CHECK(btl_config_set(cl, "btl", "transport", "sm-local"));
  CHECK(btl_config_new(&cn));
  CHECK(btl_config_set(cn, "btl", "transport", "tcp"));
  CHECK(btl_config_set(cn, "tcp", "if_include", "lo"));
  btl_identity_t idl = {job_local, me, n, node}, idn = {job_net, me, n, node};
  btl_t *local = NULL, *net = NULL;
  CHECK(btl_open(cl, &idl, &local));
  CHECK(btl_open(cn, &idn, &net));
  btl_config_free(cl);
  btl_config_free(cn);
  /* Not connected yet. */
  if (btl_reachable(local, me) != BTL_ERR_STATE) { fprintf(stderr, "reachable before connect\n"); return 1; }

  /* The runtime's modex: publish both blobs, fence. */
  publish(modex, local, &rt.local, TAG_BLOB_LOCAL, me, n);
  publish(modex, net, &rt.net, TAG_BLOB_NET, me, n);
  WAIT_UNTIL(modex, on_runtime, &rt, rt.local.count == (int)n - 1 && rt.net.count == (int)n - 1,
             "every peer's blobs");
  CHECK(btl_barrier(modex));

  /* Phase 2: connect each handle through its own blobs. */
  CHECK(btl_connect(net, fetch, &rt.net));
  CHECK(btl_connect(local, fetch, &rt.local));
  if (btl_connect(local, fetch, &rt.local) != BTL_ERR_STATE) { fprintf(stderr, "connected twice\n"); return 1; }

  int rl = ring(local, "the sm-local ring", me, n);
  int rn = ring(net, "the tcp ring", me, n);
  uint32_t expect_local = split ? (n / 2 + ((n % 2) && me % 2 == 0)) : n;
  if ((uint32_t)rl != expect_local || (uint32_t)rn != n) {
    fprintf(stderr, "rank %u: sm-local reaches %d (expected %u), tcp %d (expected %u)\n", me, rl,
            expect_local, rn, n);
    return 1;
  }
  if (split && n > 1) {
    uint32_t other = (me + 1) % n; /* the other parity: another "node" */
    uint32_t v = 1;
    btl_iovec_t iov = {&v, 4};
    if (btl_sendi(local, other, TAG_RING, &iov, 1) != BTL_ERR_UNREACHABLE) {
      fprintf(stderr, "send to another node over sm-local was not refused\n");
      return 1;
    }
  }
  CHECK(btl_finalize(&local));
  CHECK(btl_finalize(&net));
  CHECK(btl_barrier(modex));
  CHECK(btl_finalize(&modex));
  printf("OK wireup rank %u of %u: sm-local reaches %d, tcp %d\n", me, n, rl, rn);
  return 0;
}
