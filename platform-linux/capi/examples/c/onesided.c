/* One-sided put/get between every pair of ranks, every byte checked.
 *
 *   btl run -n 4 -- ./onesided
 *
 * 1. Each rank registers its own memory (CHUNK bytes per rank) and sends
 *    its packed key to every other rank.
 * 2. Each rank puts its pattern into every peer's region at offset
 *    rank*CHUNK (an absolute address: key.base + offset), waits for the
 *    completions, then a barrier; its own region then holds every peer's
 *    pattern.
 * 3. Each rank gets back what it put, and checks it.
 * 4. Refusals: a get past the end of a peer's region and one with a forged
 *    key complete with BTL_ERR_REFUSED.
 * 5. Inside the event callback (as Open MPI's ob1 does on a rendezvous):
 *    on a "read me" message carrying a key, the receiver registers a
 *    fresh buffer and posts a get from within the callback; its
 *    completion callback checks the data and deregisters the buffer. */
#include "common.h"
#include <stdint.h>
#include <string.h>

#define CHUNK 65536
#define TAG_KEY 1
#define TAG_READ_ME 2
#define MAXR 64

struct state {
  btl_t *h;
  uint32_t me, n;
  btl_key_t keys[MAXR];
  int nkeys;
  int done, refused, bad;
  /* Phase 5: the buffer registered inside the callback. */
  uint8_t *rbuf;
  btl_key_t rkey;
  int read_done;
};

static uint8_t pat(uint32_t writer, uint32_t owner, size_t i) {
  return (uint8_t)(writer * 13 + owner * 5 + i);
}

static void on_event(void *ctx, const btl_event_t *ev) {
  struct state *st = ctx;
  switch (ev->kind) {
  case BTL_EVENT_MESSAGE:
    if (ev->tag == TAG_KEY) {
      btl_key_t k;
      CHECK(btl_key_unpack(ev->data, ev->len, &k));
      if (k.rank != ev->rank || k.rank >= MAXR) { st->bad++; return; }
      st->keys[k.rank] = k;
      st->nkeys++;
    } else if (ev->tag == TAG_READ_ME) {
      btl_key_t k;
      CHECK(btl_key_unpack(ev->data, ev->len, &k));
      st->rbuf = malloc(CHUNK);
      if (!st->rbuf) exit(1);
      memset(st->rbuf, 0, CHUNK);
      /* Both calls from inside the callback: registration at once, the
       * get posted when the callback returns. */
      CHECK(btl_register(st->h, st->rbuf, CHUNK, &st->rkey));
      CHECK(btl_iget(st->h, &st->rkey, st->rbuf, &k, k.base + (uint64_t)st->me * CHUNK, CHUNK,
                     &st->read_done));
    } else {
      st->bad++;
    }
    break;
  case BTL_EVENT_DONE:
    if (ev->context == &st->read_done) {
      uint32_t from = (st->me + st->n - 1) % st->n;
      if (ev->status != BTL_OK) { fprintf(stderr, "read-me get: %s\n", ev->text); st->bad++; }
      /* Phase 2: we (me) wrote pat(me, from) at offset me*CHUNK of
       * from's region. */
      for (size_t i = 0; i < CHUNK; i++)
        if (st->rbuf[i] != pat(st->me, from, i)) { st->bad++; break; }
      CHECK(btl_deregister(st->h, &st->rkey));
      free(st->rbuf);
      st->rbuf = NULL;
      st->read_done = 1;
    } else if (ev->status == BTL_ERR_REFUSED) {
      st->refused++;
    } else if (ev->status != BTL_OK) {
      fprintf(stderr, "operation failed: %s (%s)\n", btl_strerror(ev->status), ev->text);
      st->bad++;
    } else {
      st->done++;
    }
    break;
  case BTL_EVENT_PEER_FAILED:
    fprintf(stderr, "rank %u failed: %s\n", ev->rank, ev->text);
    exit(1);
  }
}

/* Puts chunk p of `scratch` into (put != 0), or gets it from, our chunk
 * of rank p's region, for every rank p. Returns how many were posted
 * (BTL_OK: a completion event follows) rather than done at once. */
static int post_all(struct state *st, const btl_key_t *local, uint8_t *scratch, int put) {
  int posted = 0;
  for (uint32_t p = 0; p < st->n; p++) {
    uint8_t *mine = scratch + (size_t)p * CHUNK;
    uint64_t theirs = st->keys[p].base + (uint64_t)st->me * CHUNK;
    int rc = put ? btl_iput(st->h, local, mine, &st->keys[p], theirs, CHUNK, NULL)
                 : btl_iget(st->h, local, mine, &st->keys[p], theirs, CHUNK, NULL);
    CHECK(rc);
    if (rc == BTL_OK) posted++;
  }
  return posted;
}

int main(void) {
  struct state st = {0};
  CHECK(btl_init(NULL, &st.h));
  btl_t *h = st.h;
  CHECK(btl_rank(h, &st.me));
  CHECK(btl_size(h, &st.n));
  uint32_t me = st.me, n = st.n;
  if (n > MAXR) { fprintf(stderr, "at most %d ranks\n", MAXR); return 1; }
  uint8_t *region = calloc(n, CHUNK), *scratch = calloc(n, CHUNK);
  if (!region || !scratch) return 1;
  btl_key_t mine, local;
  CHECK(btl_register(h, region, (size_t)n * CHUNK, &mine));
  CHECK(btl_register(h, scratch, (size_t)n * CHUNK, &local));
  st.keys[me] = mine;

  /* 1. Keys to everyone. */
  uint8_t packed[BTL_KEY_BYTES];
  CHECK(btl_key_pack(&mine, packed));
  for (uint32_t p = 0; p < n; p++) {
    if (p == me) continue;
    btl_iovec_t iov = {packed, sizeof packed};
    int rc;
    while ((rc = btl_sendi(h, p, TAG_KEY, &iov, 1)) == BTL_ERR_WOULD_BLOCK)
      CHECK(btl_progress(h, on_event, &st));
    CHECK(rc);
  }
  WAIT_UNTIL(h, on_event, &st, st.nkeys == (int)n - 1, "every peer's key");

  /* 2. Put into every rank's region (ourselves included). */
  for (size_t i = 0; i < (size_t)n * CHUNK; i++) scratch[i] = pat(me, (uint32_t)(i / CHUNK), i % CHUNK);
  int posted = post_all(&st, &local, scratch, 1);
  WAIT_UNTIL(h, on_event, &st, st.done == posted, "the puts");
  CHECK(btl_barrier(h));
  for (uint32_t w = 0; w < n; w++)
    for (size_t i = 0; i < CHUNK; i++)
      if (region[(size_t)w * CHUNK + i] != pat(w, me, i)) {
        fprintf(stderr, "rank %u: byte %zu of rank %u's chunk is wrong\n", me, i, w);
        return 1;
      }

  /* 3. Get back what we put. */
  memset(scratch, 0, (size_t)n * CHUNK);
  st.done = 0;
  posted = post_all(&st, &local, scratch, 0);
  WAIT_UNTIL(h, on_event, &st, st.done == posted, "the gets");
  for (uint32_t p = 0; p < n; p++)
    for (size_t i = 0; i < CHUNK; i++)
      if (scratch[(size_t)p * CHUNK + i] != pat(me, p, i)) {
        fprintf(stderr, "rank %u: get from rank %u: byte %zu is wrong\n", me, p, i);
        return 1;
      }

  /* 4. Refusals by the target. */
  uint32_t next = (me + 1) % n;
  if (n > 1) {
    btl_key_t forged = st.keys[next];
    forged.id += 1000;
    CHECK(btl_iget(h, &local, scratch, &st.keys[next], st.keys[next].base + st.keys[next].len - 8,
                   16, NULL));
    CHECK(btl_iget(h, &local, scratch, &forged, forged.base, 16, NULL));
    WAIT_UNTIL(h, on_event, &st, st.refused == 2, "the refusals");
  }
  CHECK(btl_barrier(h));

  /* 5. A get posted from inside the callback. */
  if (n > 1) {
    btl_iovec_t iov = {packed, sizeof packed};
    int rc;
    while ((rc = btl_sendi(h, next, TAG_READ_ME, &iov, 1)) == BTL_ERR_WOULD_BLOCK)
      CHECK(btl_progress(h, on_event, &st));
    CHECK(rc);
    WAIT_UNTIL(h, on_event, &st, st.read_done == 1, "the get posted by the callback");
  }
  CHECK(btl_barrier(h));
  CHECK(btl_deregister(h, &local));
  CHECK(btl_deregister(h, &mine));
  CHECK(btl_finalize(&h));
  free(region);
  free(scratch);
  if (st.bad) { fprintf(stderr, "rank %u: %d problems\n", me, st.bad); return 1; }
  printf("OK onesided rank %u of %u\n", me, n);
  return 0;
}
