/* Shared-memory latency inside a host while TCP links the job to another
 * host: ranks 0 and 1 (one host) ping-pong 8 bytes in batches, as ppmin.c,
 * after each exchanged a message with rank 2 (another host), so both hold a
 * TCP connection that nobody uses afterwards; rank 2 sleeps meanwhile
 * (MPI_Test every 2 ms), so the two cores stay with ranks 0 and 1. Rank 0
 * prints
 *   mix size=8 min_us=X mean_us=Y
 * Used by scripts/ompi-mixbench.sh. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n != 3) {
    if (r == 0) fprintf(stderr, "mixpp: needs 3 ranks (2 on one host, 1 on another)\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  char b[8] = {1}, c[8];
  /* the TCP connections: rank 2 with 0 and with 1 */
  if (r == 2) {
    for (int p = 0; p < 2; p++) {
      MPI_Send(b, 8, MPI_CHAR, p, 7, MPI_COMM_WORLD);
      MPI_Recv(c, 8, MPI_CHAR, p, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    int done = 0, x;
    MPI_Request q;
    MPI_Irecv(&x, 1, MPI_INT, 0, 9, MPI_COMM_WORLD, &q);
    while (!done) {
      usleep(2000);
      MPI_Test(&q, &done, MPI_STATUS_IGNORE);
    }
  } else {
    MPI_Recv(c, 8, MPI_CHAR, 2, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Send(b, 8, MPI_CHAR, 2, 7, MPI_COMM_WORLD);
    int other = 1 - r;
    /* both ranks ready before timing */
    MPI_Sendrecv(b, 8, MPI_CHAR, other, 8, c, 8, MPI_CHAR, other, 8, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    double best = 1e30, sum = 0;
    int per = 200, batches = 300;
    for (int k = 0; k < batches; k++) {
      MPI_Sendrecv(b, 1, MPI_CHAR, other, 8, c, 1, MPI_CHAR, other, 8, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
      double t0 = MPI_Wtime();
      for (int i = 0; i < per; i++) {
        if (r == 0) {
          MPI_Send(b, 8, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
          MPI_Recv(c, 8, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
          MPI_Recv(c, 8, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          MPI_Send(b, 8, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
        }
      }
      double d = (MPI_Wtime() - t0) / per / 2 * 1e6;
      sum += d;
      if (d < best) best = d;
    }
    if (r == 0) {
      int x = 1;
      printf("mix size=8 min_us=%.3f mean_us=%.3f\n", best, sum / batches);
      fflush(stdout);
      MPI_Send(&x, 1, MPI_INT, 2, 9, MPI_COMM_WORLD);
    }
  }
  MPI_Finalize();
  return 0;
}
