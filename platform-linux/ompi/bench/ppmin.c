/* Ping-pong for a loaded machine: the half round trip of the fastest batch
 * (and the mean of all batches), where the anchors' ping-pong gives one
 * average that the other processes' time slices dominate. Rank 0 prints
 *   size=N min_us=X mean_us=Y
 * per size given on the command line (each <= 4 MiB). Used by
 * scripts/ompi-bench.sh with MIN=1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  size_t max = 4u << 20;
  char *b = malloc(max), *c = malloc(max);
  if (!b || !c) MPI_Abort(MPI_COMM_WORLD, 1);
  memset(b, 1, max);
  memset(c, 2, max);
  for (int a = 1; a < argc; a++) {
    size_t n = strtoull(argv[a], NULL, 10);
    if (n > max) continue;
    int per = n < 65536 ? 200 : n < (1u << 20) ? 20 : 4;
    int batches = n < 65536 ? 300 : 60;
    double best = 1e30, sum = 0;
    for (int k = 0; k < batches; k++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < per; i++) {
        if (r == 0) {
          MPI_Send(b, (int)n, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
          MPI_Recv(c, (int)n, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (r == 1) {
          MPI_Recv(c, (int)n, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          MPI_Send(b, (int)n, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
        }
      }
      double d = (MPI_Wtime() - t0) / per / 2 * 1e6;
      sum += d;
      if (d < best) best = d;
    }
    if (r == 0) printf("size=%zu min_us=%.3f mean_us=%.3f\n", n, best, sum / batches);
  }
  free(b);
  free(c);
  MPI_Finalize();
  return 0;
}
