/* Helpers the examples share: checked calls and a bounded wait. */
#ifndef BTL_EXAMPLE_COMMON_H
#define BTL_EXAMPLE_COMMON_H
#include <btl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <time.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Exits naming the call, the code and btl's message with its context. */
#define CHECK(call)                                                          \
  do {                                                                       \
    int rc_ = (call);                                                        \
    if (rc_ < 0) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,     \
              btl_strerror(rc_), btl_last_error());                          \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

/* A busy-wait hint for idle polls (x86 `pause`, Arm `yield`), as
 * btl's own wait loop gives (Rust's spin_loop): the core does not
 * speculate far into the next poll, and leaves the loop without a
 * pipeline flush when the awaited line changes. */
#if defined(__x86_64__) || defined(__i386__)
#define SPIN_HINT() __builtin_ia32_pause()
#elif defined(__aarch64__) || defined(__arm__)
#define SPIN_HINT() __asm__ __volatile__("yield")
#else
#define SPIN_HINT() ((void)0)
#endif

/* Progresses `h` until `cond` holds; gives up after 60 s. The clock is
 * read once every 4096 polls (the 60 s count from the first read), as
 * btl's own wait loop does: a wait that ends within a few polls — every
 * wait of a ping-pong — never reads it. */
#define WAIT_UNTIL(h, cb, ctx, cond, what)                                   \
  do {                                                                       \
    double t0_ = -1.0;                                                       \
    unsigned long spins_ = 0, idle_ = 0;                                     \
    while (!(cond)) {                                                        \
      int n_ = btl_progress((h), (cb), (ctx));                               \
      CHECK(n_);                                                             \
      /* Spin on a hint, then (oversubscribed machines) let the peer run  \
       * when nothing comes, as btl's wait loop does. */                     \
      if (n_ > 0) idle_ = 0;                                                 \
      else if (++idle_ > 2000) sched_yield();                                \
      else SPIN_HINT();                                                      \
      if ((++spins_ & 4095) == 0) {                                          \
        double now_ = now_s();                                               \
        if (t0_ < 0) t0_ = now_;                                             \
        else if (now_ - t0_ > 60.0) {                                        \
          fprintf(stderr, "timed out after 60 s waiting for %s\n", (what));  \
          exit(1);                                                           \
        }                                                                    \
      }                                                                      \
    }                                                                        \
  } while (0)

#endif
