/* Instructions per small message inside Open MPI, for callgrind
 * (scripts/ompi-msgcost.sh). 2 ranks. Each of ROUNDS rounds: rank 0 sends
 * BATCH messages of SIZE bytes to rank 1 (MPI_Send, tags 0..BATCH-1) and
 * then waits for a 1-byte answer; rank 1 first sleeps (outside MPI) for
 * SLEEP_MS, long enough for the whole batch to have arrived even under
 * valgrind, then receives it (MPI_Recv) and answers. So rank 1's receives
 * find every message there: their instructions are the receive path
 * (progress, the BTL handing the fragment up, ob1's matching and copy)
 * without any wait loop; rank 0's sends are the send path from MPI_Send
 * into the BTL. Every received message is checked (length and content);
 * rank 1 prints "msgcost: N messages checked" and the exit status is 0
 * only if all were intact.
 *
 * With a fifth argument `multiple` it initialises MPI_THREAD_MULTIPLE
 * (one thread still does all the work): what the thread-safe paths cost.
 *
 *   msgcost [ROUNDS] [BATCH] [SIZE] [SLEEP_MS] [single|multiple]   (200 16 8 20 single)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void pause_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0) {
  }
}

int main(int argc, char **argv) {
  int multiple = argc > 5 && 0 == strcmp(argv[5], "multiple"), provided = MPI_THREAD_SINGLE;
  if (multiple)
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  else
    MPI_Init(&argc, &argv);
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  long rounds = argc > 1 ? atol(argv[1]) : 200;
  long batch = argc > 2 ? atol(argv[2]) : 16;
  long size = argc > 3 ? atol(argv[3]) : 8;
  long sleep_ms = argc > 4 ? atol(argv[4]) : 20;
  if (n != 2 || (multiple && provided != MPI_THREAD_MULTIPLE) || rounds < 1 || batch < 1 || batch > 1024 || size < 1 || size > 4096 ||
      sleep_ms < 0) {
    if (r == 0)
      fprintf(stderr, "msgcost: 2 ranks (and MPI_THREAD_MULTIPLE if asked); ROUNDS >= 1, BATCH 1..1024, SIZE 1..4096, SLEEP_MS >= 0\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  unsigned char buf[4096], ack = 0;
  long bad = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  for (long i = 0; i < rounds; i++) {
    if (r == 0) {
      for (long k = 0; k < batch; k++) {
        memset(buf, (int)((i * batch + k) & 0xff), (size_t)size);
        MPI_Send(buf, (int)size, MPI_BYTE, 1, (int)k, MPI_COMM_WORLD);
      }
      MPI_Recv(&ack, 1, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      pause_ms(sleep_ms);
      for (long k = 0; k < batch; k++) {
        MPI_Status st;
        int got = -1;
        MPI_Recv(buf, (int)size, MPI_BYTE, 0, (int)k, MPI_COMM_WORLD, &st);
        MPI_Get_count(&st, MPI_BYTE, &got);
        unsigned char want = (unsigned char)((i * batch + k) & 0xff);
        int ok = got == (int)size;
        for (long b = 0; ok && b < size; b++) ok = buf[b] == want;
        bad += !ok;
      }
      MPI_Send(&ack, 1, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
  }
  if (r == 1) printf("msgcost: %ld messages checked, %ld wrong\n", rounds * batch, bad);
  MPI_Finalize();
  return bad == 0 ? 0 : 1;
}
