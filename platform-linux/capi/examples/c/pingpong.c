/* Ping-pong between rank pairs (0-1, 2-3, ...).
 *
 *   btl run -n 2 -- ./pingpong [--sizes 8,4096,...] [--iters N] [--bench]
 *
 * The transport is BTL_TRANSPORT's (auto, sm, tcp). Small messages go by
 * btl_sendi (copied at once), larger ones by btl_isend (zero copy; the
 * buffer is reused only after its completion event). Rank 0 prints
 * `size=8 latency_us=...` lines (half round trip), as `btl bench --format
 * osu` does.
 *
 * Test mode (the default; what scripts/capi-test.sh runs): every message
 * is a sequence number and a payload (two pieces, 8 + size bytes), and
 * every one is checked (tag, length, order, contents).
 *
 * --bench: what `btl bench` measures, so the two compare: one piece of
 * `size` bytes (0xa5) per message, the receiver counting messages of the
 * tag and nothing else in the timed loop, btl bench's iteration counts
 * and warm-up (a tenth, at least 2, untimed) after a barrier. The count is
 * checked after the loop. */
#include "common.h"
#include <stdint.h>
#include <string.h>

#define TAG 7

struct state {
  uint64_t expect; /* sequence number of the next message */
  size_t size;
  int got;         /* messages received and checked */
  int sends_done;  /* completion events of our zero-copy sends */
  int bad;
  int bench;       /* --bench: count messages of TAG, check nothing else */
};

static uint8_t pattern(uint64_t seq, size_t i) { return (uint8_t)(seq * 31 + i * 7); }

static void on_event(void *ctx, const btl_event_t *ev) {
  struct state *st = ctx;
  if (st->bench && ev->kind == BTL_EVENT_MESSAGE && ev->tag == TAG) {
    st->got++; /* as btl bench's consumer: the tag only */
    return;
  }
  if (ev->kind == BTL_EVENT_DONE) {
    if (ev->status != BTL_OK) {
      fprintf(stderr, "a send failed: %s\n", ev->text ? ev->text : "?");
      st->bad++;
    }
    st->sends_done++;
    return;
  }
  if (ev->kind == BTL_EVENT_PEER_FAILED) {
    fprintf(stderr, "rank %u failed: %s\n", ev->rank, ev->text);
    exit(1);
  }
  if (st->bench || ev->tag != TAG || ev->len != 8 + st->size) {
    fprintf(stderr, "unexpected message: tag %u, %zu bytes\n", ev->tag, ev->len);
    st->bad++;
    return;
  }
  const uint8_t *d = ev->data;
  uint64_t seq;
  memcpy(&seq, d, 8);
  if (seq != st->expect) {
    fprintf(stderr, "message %llu arrived, expected %llu\n", (unsigned long long)seq,
            (unsigned long long)st->expect);
    st->bad++;
  }
  /* Check the first, last and a few inner bytes of large ones, all of small. */
  size_t step = st->size > 4096 ? 4093 : 1;
  for (size_t i = 0; i < st->size; i += step)
    if (d[8 + i] != pattern(seq, i)) { st->bad++; break; }
  if (st->size && d[8 + st->size - 1] != pattern(seq, st->size - 1)) st->bad++;
  st->expect++;
  st->got++;
}

/* Sends `iovcnt` pieces of `len` bytes in all: copied at once up to the
 * eager limit, else zero copy and waited for. */
static inline void post(btl_t *h, uint32_t peer, struct state *st, const btl_iovec_t *iov, size_t iovcnt,
                 size_t len, uint8_t *buf, uint64_t eager) {
  if (len <= eager) {
    int rc;
    while ((rc = btl_sendi(h, peer, TAG, iov, iovcnt)) == BTL_ERR_WOULD_BLOCK)
      CHECK(btl_progress(h, on_event, st));
    CHECK(rc);
  } else {
    int before = st->sends_done;
    int rc = btl_isend(h, peer, TAG, iov, iovcnt, buf);
    CHECK(rc);
    if (rc == BTL_OK) /* in flight: the buffer is ours again after the event */
      WAIT_UNTIL(h, on_event, st, st->sends_done > before, "a send's completion");
  }
}

static inline void send_one(btl_t *h, uint32_t peer, struct state *st, uint8_t *buf, uint64_t seq,
                     uint64_t eager) {
  if (st->bench) { /* the payload alone, in one piece, as btl bench sends */
    btl_iovec_t iov = {buf, st->size};
    post(h, peer, st, &iov, 1, st->size, buf, eager);
    return;
  }
  size_t step = st->size > 4096 ? 4093 : 1;
  for (size_t i = 0; i < st->size; i += step) buf[8 + i] = pattern(seq, i);
  if (st->size) buf[8 + st->size - 1] = pattern(seq, st->size - 1);
  memcpy(buf, &seq, 8);
  /* Copied ones as a header and a payload (two pieces), zero-copy ones
   * as one. */
  btl_iovec_t two[2] = {{buf, 8}, {buf + 8, st->size}}, one = {buf, 8 + st->size};
  int copied = st->size + 8 <= eager;
  post(h, peer, st, copied ? two : &one, copied ? 2 : 1, 8 + st->size, buf, eager);
}

int main(int argc, char **argv) {
  const char *sizes = "8,4096,65536,1048576";
  long iters_arg = 0;
  int bench = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--sizes") && i + 1 < argc) sizes = argv[++i];
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters_arg = atol(argv[++i]);
    else if (!strcmp(argv[i], "--bench")) bench = 1;
    else { fprintf(stderr, "usage: %s [--sizes A,B] [--iters N] [--bench]\n", argv[0]); return 2; }
  }
  btl_t *h = NULL;
  CHECK(btl_init(NULL, &h));
  uint32_t me, n;
  CHECK(btl_rank(h, &me));
  CHECK(btl_size(h, &n));
  uint32_t peer = me ^ 1;
  int active = peer < n;
  btl_limits_t lim = {0};
  if (active) CHECK(btl_limits(h, peer, &lim));
  struct state st = {0};
  st.bench = bench;
  char list[256];
  snprintf(list, sizeof list, "%s", sizes);
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    size_t size = strtoull(tok, NULL, 0);
    long iters = iters_arg ? iters_arg
               : bench ? (size <= 4096 ? 20000 : size <= 65536 ? 4000 : size <= 1048576 ? 400 : 100)
                       : (size <= 4096 ? 2000 : size <= 65536 ? 500 : 50);
    long warm = iters / 10 > 2 ? iters / 10 : 2;
    uint8_t *buf = calloc(1, 8 + size);
    if (!buf) { perror("calloc"); return 1; }
    if (bench) memset(buf, 0xa5, size);
    st.size = size;
    st.expect = 0;
    st.got = 0;
    uint64_t seq = 0;
    CHECK(btl_barrier(h));
    double t0 = now_s();
    for (long i = 0; active && i < warm + iters; i++) {
      if (i == warm) t0 = now_s();
      /* Count by round, not from st.got: a message can arrive while we
       * wait for our own send's completion (the peer may have it, and
       * answer, before the completion event reaches us). */
      int want = (int)i + 1;
      if (me < peer) {
        send_one(h, peer, &st, buf, seq++, lim.eager);
        WAIT_UNTIL(h, on_event, &st, st.got >= want, "the pong");
      } else {
        WAIT_UNTIL(h, on_event, &st, st.got >= want, "the ping");
        send_one(h, peer, &st, buf, seq++, lim.eager);
      }
    }
    double lat = (now_s() - t0) * 1e6 / (double)iters / 2.0;
    if (active && st.got != warm + iters) {
      fprintf(stderr, "rank %u: %d messages of size %zu arrived, %ld expected\n", me, st.got, size,
              warm + iters);
      st.bad++;
    }
    if (me == 0) printf("size=%zu latency_us=%.3f\n", size, lat);
    fflush(stdout);
    free(buf);
  }
  CHECK(btl_barrier(h));
  CHECK(btl_finalize(&h));
  if (st.bad) { fprintf(stderr, "rank %u: %d bad messages\n", me, st.bad); return 1; }
  printf("OK pingpong rank %u of %u\n", me, n);
  return 0;
}
