/* The cost of one idle progress pass of the C ABI (a btl_progress that
 * finds nothing), for scripts/capi-bench.sh --idle:
 *   idle PASSES [CALLBACK]
 * Both ranks first send each other 64 small messages (so each has handed
 * the other a fast box, as in a ping-pong), then meet in a barrier; rank
 * 0 calls btl_progress PASSES times (with an event callback unless
 * CALLBACK is 0) while rank 1 waits in the next barrier. Under callgrind,
 * a run with PASSES less one with 0, over PASSES, is one pass's
 * instructions. */
#include <btl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long got;

static void on_event(void *ctx, const struct btl_event_t *ev) {
  (void)ctx;
  if (ev->kind == BTL_EVENT_MESSAGE) got++;
  if (ev->kind == BTL_EVENT_PEER_FAILED) {
    fprintf(stderr, "idle: rank %u failed: %s\n", ev->rank, ev->text ? ev->text : "?");
    exit(1);
  }
}

static void check(int rc, const char *what) {
  if (rc < 0) {
    fprintf(stderr, "%s: %s (%s)\n", what, btl_strerror(rc), btl_last_error());
    exit(1);
  }
}

int main(int argc, char **argv) {
  long passes = argc > 1 ? atol(argv[1]) : 0;
  int with_cb = argc > 2 ? atoi(argv[2]) : 1;
  struct btl_t *h;
  uint32_t rank, size;
  check(btl_init(NULL, &h), "btl_init");
  check(btl_rank(h, &rank), "btl_rank");
  check(btl_size(h, &size), "btl_size");
  if (size != 2) {
    fprintf(stderr, "idle: run with 2 ranks\n");
    return 1;
  }
  uint64_t x = 0;
  struct btl_iovec_t v = {&x, sizeof x};
  for (int i = 0; i < 64; i++) {
    int rc;
    while ((rc = btl_sendi(h, 1 - rank, 1, &v, 1)) == BTL_ERR_WOULD_BLOCK)
      check(btl_progress(h, on_event, NULL), "btl_progress");
    check(rc, "btl_sendi");
  }
  time_t t0 = time(NULL);
  for (unsigned long i = 0; got < 64; i++) {
    check(btl_progress(h, on_event, NULL), "btl_progress");
    if ((i & 4095) == 0 && time(NULL) - t0 > 60) {
      fprintf(stderr, "idle: timed out waiting for the warm-up messages\n");
      return 1;
    }
  }
  check(btl_barrier(h), "btl_barrier");
  long events = 0;
  if (rank == 0)
    for (long i = 0; i < passes; i++) {
      int n = btl_progress(h, with_cb ? on_event : NULL, NULL);
      check(n, "btl_progress");
      events += n;
    }
  check(btl_barrier(h), "btl_barrier");
  if (rank == 0) printf("events %ld\n", events);
  check(btl_finalize(&h), "btl_finalize");
  return 0;
}
