/* The C ABI misused on purpose: every call must answer with the right
 * error code (and a message), never crash. Run under btl run -n 2 (also
 * under AddressSanitizer). Prints "misuse: N passed, 0 failed". */
#include "common.h"
#include <stdint.h>
#include <string.h>

static int passed, failed;

#define EXPECT(call, want)                                                       \
  do {                                                                           \
    int rc_ = (call);                                                            \
    if (rc_ == (want)) passed++;                                                 \
    else {                                                                       \
      failed++;                                                                  \
      fprintf(stderr, "%s:%d: %s returned %d (%s), expected %s; last error: %s\n", \
              __FILE__, __LINE__, #call, rc_, btl_strerror(rc_), #want,          \
              btl_last_error());                                                 \
    }                                                                            \
  } while (0)

#define EXPECT_MSG(needle)                                                       \
  do {                                                                           \
    if (strstr(btl_last_error(), (needle))) passed++;                            \
    else {                                                                       \
      failed++;                                                                  \
      fprintf(stderr, "%s:%d: last error \"%s\" does not mention \"%s\"\n",      \
              __FILE__, __LINE__, btl_last_error(), (needle));                   \
    }                                                                            \
  } while (0)

struct cbstate {
  btl_t *h;
  int empty_msgs, refused, done, nested_checked;
  int copied_reply, zero_copy_reply, zero_copy_done, bad_reply;
  int numbered, bad_numbered; /* tag 4: "#", its number, the number again */
};

/* The zero-copy reply's bytes: valid until its completion (static). */
static const char zero_copy[6] = "fghij";

static void on_event(void *ctx, const btl_event_t *ev) {
  struct cbstate *s = ctx;
  if (ev->kind == BTL_EVENT_MESSAGE && ev->len == 0) {
    s->empty_msgs++;
    if (!s->nested_checked) {
      /* Handle-wide and blocking calls are refused inside a callback. */
      s->nested_checked = 1;
      EXPECT(btl_progress(s->h, on_event, s), BTL_ERR_STATE);
      EXPECT(btl_barrier(s->h), BTL_ERR_STATE);
      btl_t *copy = s->h;
      EXPECT(btl_finalize(&copy), BTL_ERR_STATE);
      /* Posts are queued and go when the callback returns: a copied one of
       * two pieces (copied now: the array and the bytes may go) and a
       * zero-copy one (its completion follows as an event). */
      char head[2] = {'a', 'b'}, body[3] = {'c', 'd', 'e'};
      btl_iovec_t two[2] = {{head, 2}, {body, 3}}, one = {zero_copy, 5};
      EXPECT(btl_sendi(s->h, ev->rank, 2, two, 2), BTL_DONE);
      EXPECT(btl_isend(s->h, ev->rank, 3, &one, 1, &s->zero_copy_done), BTL_OK);
      btl_iovec_t bad[2] = {{head, 2}, {NULL, 3}};
      EXPECT(btl_sendi(s->h, ev->rank, 2, bad, 2), BTL_ERR_ARG);
      EXPECT_MSG("iov[1].base is NULL");
      memset(head, 0, sizeof head);
      memset(body, 0, sizeof body);
    }
  } else if (ev->kind == BTL_EVENT_MESSAGE && (ev->tag == 2 || ev->tag == 3)) {
    const char *want = ev->tag == 2 ? "abcde" : zero_copy;
    if (ev->len != 5 || memcmp(ev->data, want, 5)) s->bad_reply++;
    else if (ev->tag == 2) s->copied_reply++;
    else s->zero_copy_reply++;
  } else if (ev->kind == BTL_EVENT_MESSAGE && ev->tag == 4) {
    /* In order, whether they came by the ring or by the fast box. */
    unsigned char want[6] = {'#', (unsigned char)s->numbered};
    int k = s->numbered;
    memcpy(want + 2, &k, sizeof k);
    if (ev->len == 6 && !memcmp(ev->data, want, 6)) s->numbered++;
    else s->bad_numbered++;
  } else if (ev->kind == BTL_EVENT_DONE && ev->context == &s->zero_copy_done) {
    if (ev->status == BTL_OK) s->zero_copy_done++;
    else s->bad_reply++;
  } else if (ev->kind == BTL_EVENT_DONE) {
    if (ev->status == BTL_ERR_REFUSED && ev->text && ev->text[0]) s->refused++;
    else s->done++;
  }
}

/* Numbered messages [from, to) to `peer` with tag 4, alternately in one
 * piece and in two (a header and a payload, as Open MPI's sendi). */
static void send_numbered(btl_t *h, uint32_t peer, int from, int to, struct cbstate *s) {
  for (int k = from; k < to; k++) {
    unsigned char whole[6] = {'#', (unsigned char)k};
    memcpy(whole + 2, &k, sizeof k);
    btl_iovec_t one = {whole, 6}, two[2] = {{whole, 2}, {whole + 2, 4}};
    int rc;
    while ((rc = (k & 1) ? btl_sendi(h, peer, 4, two, 2) : btl_sendi(h, peer, 4, &one, 1)) ==
           BTL_ERR_WOULD_BLOCK)
      EXPECT(btl_progress(h, on_event, s) >= 0, 1);
    EXPECT(rc, BTL_DONE);
  }
}

int main(void) {
  /* Codes and messages. */
  for (int c = -19; c <= 1; c++)
    if (!btl_strerror(c) || !strncmp(btl_strerror(c), "unknown", 7)) failed++; else passed++;
  EXPECT(strcmp(btl_strerror(-1000), "unknown btl return code"), 0);

  /* Configuration. */
  btl_config_t *cfg = NULL;
  EXPECT(btl_config_new(NULL), BTL_ERR_ARG);
  EXPECT(btl_config_new(&cfg), BTL_OK);
  EXPECT(btl_config_set(cfg, "sm", "fifo_size", "lots"), BTL_ERR_PARAM);
  EXPECT_MSG("fifo_size");
  EXPECT(btl_config_set(cfg, "sm", "no_such_parameter", "1"), BTL_ERR_PARAM);
  EXPECT(btl_config_set(cfg, "gpu", "x", "1"), BTL_ERR_PARAM);
  EXPECT_MSG("unknown component");
  EXPECT(btl_config_set(cfg, "btl", "transport", "carrier-pigeon"), BTL_ERR_PARAM);
  EXPECT_MSG("sm-local");
  EXPECT(btl_config_set(cfg, NULL, "x", "1"), BTL_ERR_ARG);
  EXPECT(btl_config_set(NULL, "sm", "fifo_size", "8192"), BTL_ERR_ARG);
  EXPECT(btl_config_set(cfg, "sm", "fifo_size", "8192"), BTL_OK);
  EXPECT(btl_config_set(cfg, "btl", "timeout", "30"), BTL_OK);
  EXPECT(btl_config_set(cfg, "btl", "nodes", "0"), BTL_ERR_PARAM);
  EXPECT_MSG("nodes");
  EXPECT(btl_config_set(cfg, "btl", "nodes", "1"), BTL_OK);

  /* Effective values, as a runtime takes its module's attributes. */
  int64_t num = -1;
  EXPECT(btl_config_number(cfg, "sm", "fifo_size", &num), BTL_OK);
  EXPECT(num == 8192, 1);
  EXPECT(btl_config_number(NULL, "sm", "eager_limit", &num), BTL_OK);
  EXPECT(num == 4096, 1);
  EXPECT(btl_config_number(cfg, "sm", "use_cma", &num), BTL_OK);
  EXPECT(num == 0 || num == 1, 1);
  EXPECT(btl_config_number(cfg, "tcp", "if_include", &num), BTL_ERR_PARAM);
  EXPECT_MSG("text parameter");
  EXPECT(btl_config_number(cfg, "sm", "no_such_parameter", &num), BTL_ERR_PARAM);
  EXPECT(btl_config_number(cfg, "sm", "fifo_size", NULL), BTL_ERR_ARG);
  {
    /* a rule between parameters: the error btl_open would give */
    btl_config_t *c2 = NULL;
    EXPECT(btl_config_new(&c2), BTL_OK);
    EXPECT(btl_config_set(c2, "sm", "free_list_max", "2"), BTL_OK);
    EXPECT(btl_config_number(c2, "sm", "fifo_size", &num), BTL_ERR_PARAM);
    EXPECT_MSG("free_list");
    btl_config_free(c2);
  }

  /* Parameters as Open MPI would register them. */
  size_t count = 0;
  btl_param_info_t info;
  EXPECT(btl_param_count("sm", &count), BTL_OK);
  EXPECT(count > 5, 1);
  int found = 0;
  for (size_t i = 0; i < count; i++) {
    EXPECT(btl_param_info("sm", i, &info), BTL_OK);
    if (!info.name[0] || !info.help[0] || info.level < 1 || info.level > 9) failed++;
    if (!strcmp(info.name, "fifo_size")) {
      found = 1;
      EXPECT(strcmp(info.env_name, "BTL_SM_FIFO_SIZE"), 0);
      EXPECT(strcmp(info.ompi_env_name, "OMPI_MCA_btl_sm_fifo_size"), 0);
    }
  }
  EXPECT(found, 1);
  EXPECT(btl_param_count("tcp", &count), BTL_OK);
  EXPECT(btl_param_info("tcp", count, &info), BTL_ERR_ARG);
  EXPECT(btl_param_count("gpu", &count), BTL_ERR_PARAM);
  EXPECT(btl_param_info("sm", 0, NULL), BTL_ERR_ARG);

  /* Bad identities for btl_open. */
  btl_t *ext = NULL;
  btl_identity_t id = {"job1", 0, 2, "node1"};
  EXPECT(btl_open(NULL, NULL, &ext), BTL_ERR_ARG);
  btl_identity_t bad = id;
  bad.rank = 2;
  EXPECT(btl_open(NULL, &bad, &ext), BTL_ERR_ARG);
  bad = id;
  bad.job = "a job";
  EXPECT(btl_open(NULL, &bad, &ext), BTL_ERR_ARG);
  bad = id;
  bad.node = NULL;
  EXPECT(btl_open(NULL, &bad, &ext), BTL_ERR_ARG);
  EXPECT(btl_connect(NULL, NULL, NULL), BTL_ERR_ARG);

  /* Before a handle exists. */
  uint32_t me = 99, n = 0;
  EXPECT(btl_init(cfg, NULL), BTL_ERR_ARG);
  EXPECT(btl_rank(NULL, &me), BTL_ERR_ARG);

  btl_t *h = NULL;
  EXPECT(btl_init(cfg, &h), BTL_OK);
  btl_config_free(cfg);
  if (!h) return 1;
  EXPECT(btl_rank(h, NULL), BTL_ERR_ARG);
  EXPECT(btl_rank(h, &me), BTL_OK);
  EXPECT(btl_size(h, &n), BTL_OK);
  uint32_t peer = (me + 1) % n;
  EXPECT(btl_reachable(h, me), 1);
  EXPECT(btl_reachable(h, n), BTL_ERR_RANK);
  btl_limits_t lim;
  EXPECT(btl_limits(h, peer, &lim), BTL_OK);
  EXPECT(lim.eager > 0 && lim.max_send >= lim.eager, 1);
  EXPECT(btl_limits(h, n + 3, &lim), BTL_ERR_RANK);
  const void *blob;
  size_t blen;
  EXPECT(btl_address(h, &blob, &blen), BTL_ERR_STATE);
  EXPECT(btl_connect(h, NULL, NULL), BTL_ERR_ARG);

  /* Sends. */
  char msg[16] = "hello";
  btl_iovec_t iov = {msg, 5}, nul = {NULL, 5};
  EXPECT(btl_sendi(h, n + 5, 1, &iov, 1), BTL_ERR_RANK);
  EXPECT_MSG("no rank");
  EXPECT(btl_sendi(h, peer, 250, &iov, 1), BTL_ERR_TAG);
  EXPECT(btl_sendi(h, peer, 1, NULL, 1), BTL_ERR_ARG);
  EXPECT(btl_sendi(h, peer, 1, &nul, 1), BTL_ERR_ARG);
  btl_iovec_t second_nul[2] = {{msg, 5}, {NULL, 3}};
  EXPECT(btl_sendi(h, peer, 1, second_nul, 2), BTL_ERR_ARG);
  EXPECT_MSG("iov[1].base is NULL with len 3");
  EXPECT(btl_isend(h, peer, 1, second_nul, 2, NULL), BTL_ERR_ARG);
  EXPECT_MSG("iov[1].base is NULL");
  /* Lengths whose total passes SIZE_MAX / 2 (never read: refused first). */
  btl_iovec_t huge[2] = {{msg, SIZE_MAX / 2 + 1}, {msg, SIZE_MAX / 2 + 1}};
  EXPECT(btl_sendi(h, peer, 1, huge, 1), BTL_ERR_TOO_LARGE);
  EXPECT(btl_sendi(h, peer, 1, huge, 2), BTL_ERR_TOO_LARGE);
  EXPECT_MSG("overflows");
  EXPECT(btl_isend(h, peer, 1, huge, 2, NULL), BTL_ERR_TOO_LARGE);
  EXPECT(btl_sendi(h, peer, 1, &iov, 1025), BTL_ERR_ARG);
  EXPECT_MSG("above 1024");
  EXPECT(btl_isend(h, peer, 240, &iov, 1, NULL), BTL_ERR_TAG);
  EXPECT(btl_isend(h, n, 1, &iov, 1, NULL), BTL_ERR_RANK);
  /* An empty message is a message (a tag alone). */
  EXPECT(btl_sendi(h, peer, 1, NULL, 0), BTL_DONE);

  /* Registration and keys. */
  static uint8_t mem[4096], mem2[4096];
  btl_key_t k, k2, forged;
  EXPECT(btl_register(h, NULL, 10, &k), BTL_ERR_ARG);
  EXPECT(btl_register(h, mem, 0, &k), BTL_ERR_ARG);
  EXPECT(btl_register(h, mem, sizeof mem, NULL), BTL_ERR_ARG);
  EXPECT(btl_register(h, mem, sizeof mem, &k), BTL_OK);
  EXPECT(btl_register(h, mem2, sizeof mem2, &k2), BTL_OK);
  EXPECT(k.rank == me && k.len == sizeof mem && k.base == (uint64_t)(uintptr_t)mem, 1);
  uint8_t packed[BTL_KEY_BYTES];
  btl_key_t back;
  EXPECT(btl_key_pack(&k, packed), BTL_OK);
  EXPECT(btl_key_unpack(packed, sizeof packed, &back), BTL_OK);
  EXPECT(memcmp(&back, &k, sizeof k), 0);
  EXPECT(btl_key_unpack(packed, 10, &back), BTL_ERR_KEY);
  EXPECT(btl_key_unpack(NULL, BTL_KEY_BYTES, &back), BTL_ERR_ARG);
  forged = k;
  forged.id = 9999;
  EXPECT(btl_deregister(h, &forged), BTL_ERR_KEY);
  forged = k;
  forged.rank = peer;
  EXPECT(btl_deregister(h, &forged), BTL_ERR_KEY);
  EXPECT(btl_deregister(h, NULL), BTL_ERR_ARG);

  /* One-sided: local checks at once. The peer's key is forged (id 777):
   * its owner refuses it, as the completion says. */
  btl_key_t theirs = {peer, 777, 4096, 0x10000};
  EXPECT(btl_iput(h, &k, mem, &theirs, theirs.base, 0, NULL), BTL_ERR_ARG);
  EXPECT(btl_iput(h, &theirs, mem, &theirs, theirs.base, 8, NULL), BTL_ERR_KEY);
  EXPECT(btl_iput(h, &k, mem + 4090, &theirs, theirs.base, 8, NULL), BTL_ERR_RANGE);
  EXPECT(btl_iput(h, &k, mem, &theirs, theirs.base - 1, 8, NULL), BTL_ERR_RANGE);
  btl_key_t nobody = theirs;
  nobody.rank = n + 1;
  EXPECT(btl_iget(h, &k, mem, &nobody, nobody.base, 8, NULL), BTL_ERR_RANK);
  EXPECT(btl_iget(h, &k, mem, NULL, 0, 8, NULL), BTL_ERR_ARG);
  struct cbstate s = {.h = h};
  int rc = btl_iget(h, &k, mem, &theirs, theirs.base, 8, &s);
  EXPECT(rc, BTL_OK);
  /* In use by the get until its answer: deregistering is refused. */
  EXPECT(btl_deregister(h, &k), BTL_ERR_BUSY);
  WAIT_UNTIL(h, on_event, &s, s.refused == 1 && s.empty_msgs == 1, "the refusal and the empty message");
  EXPECT(s.nested_checked, 1);
  /* The peer's replies posted from its callback, and our own one's
   * completion. */
  WAIT_UNTIL(h, on_event, &s,
             s.bad_reply || (s.copied_reply == 1 && s.zero_copy_reply == 1 && s.zero_copy_done == 1),
             "the replies posted from the callbacks");
  EXPECT(s.bad_reply, 0);
  EXPECT(btl_deregister(h, &k), BTL_OK);
  EXPECT(btl_deregister(h, &k), BTL_ERR_KEY); /* twice: gone */
  EXPECT(btl_deregister(h, &k2), BTL_OK);

  /* Again with a fast box to the peer: over shared memory a receiver hands
   * its sender one after fbox_threshold small messages (16 by default), and
   * after the barrier both sides hold theirs. btl_sendi's fast path into
   * the box must refuse what the checked path refuses, with the same codes,
   * and carry one piece or two, in order with what went by the ring. (The
   * rank that reaches the barrier first sends through its box; the other's
   * barrier arrival, not yet acknowledged when it returns, keeps its
   * messages on the ring: the box's hand-off rule. Checked once with a
   * counter: 31 of the 32 through the box, in 6 of 6 runs.) */
  send_numbered(h, peer, 0, 32, &s);
  WAIT_UNTIL(h, on_event, &s, s.bad_numbered || s.numbered == 32, "32 numbered messages");
  EXPECT(btl_barrier(h), BTL_OK);
  EXPECT(btl_sendi(h, n + 5, 1, &iov, 1), BTL_ERR_RANK);
  EXPECT(btl_sendi(h, peer, 250, &iov, 1), BTL_ERR_TAG);
  EXPECT(btl_sendi(h, peer, 1, NULL, 1), BTL_ERR_ARG);
  EXPECT(btl_sendi(h, peer, 1, &nul, 1), BTL_ERR_ARG);
  EXPECT(btl_sendi(h, peer, 1, second_nul, 2), BTL_ERR_ARG);
  EXPECT_MSG("iov[1].base is NULL with len 3");
  EXPECT(btl_sendi(h, peer, 1, huge, 1), BTL_ERR_TOO_LARGE);
  EXPECT(btl_sendi(h, peer, 1, huge, 2), BTL_ERR_TOO_LARGE);
  EXPECT_MSG("overflows");
  send_numbered(h, peer, 32, 64, &s);
  WAIT_UNTIL(h, on_event, &s, s.bad_numbered || s.numbered == 64, "64 numbered messages");
  EXPECT(s.bad_numbered, 0);

  /* Finalize; then the handle is gone. */
  EXPECT(btl_barrier(h), BTL_OK);
  btl_t *stale = h;
  EXPECT(btl_finalize(&h), BTL_OK);
  EXPECT(h == NULL, 1);
  EXPECT(btl_rank(h, &me), BTL_ERR_ARG);
  EXPECT(btl_sendi(stale, peer, 1, &iov, 1), BTL_ERR_FINALIZED);
  EXPECT_MSG("finalized");
  EXPECT(btl_progress(stale, on_event, &s), BTL_ERR_FINALIZED);
  EXPECT(btl_finalize(&stale), BTL_ERR_FINALIZED);
  EXPECT(btl_finalize(NULL), BTL_ERR_ARG);
  printf("misuse: %d passed, %d failed\n", passed, failed);
  return failed != 0;
}
