/* The cost of one idle progress pass: MPI_Test on a receive that never
 * completes runs opal_progress once, i.e. every BTL's progress function
 * once. Each rank prints the fastest batch's time per call:
 *   rank R: idle pass X ns
 * Used by scripts/ompi-bench.sh with MIN=1. */
#include <mpi.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int x = 0, flag = 0;
  MPI_Request q;
  /* a tag nobody sends: the request stays incomplete */
  MPI_Irecv(&x, 1, MPI_INT, (r + 1) % n, 99, MPI_COMM_WORLD, &q);
  double best = 1e30;
  for (int b = 0; b < 400; b++) {
    double t0 = now();
    for (int i = 0; i < 2000; i++) MPI_Test(&q, &flag, MPI_STATUS_IGNORE);
    double d = (now() - t0) / 2000;
    if (d < best) best = d;
  }
  MPI_Cancel(&q);
  MPI_Wait(&q, MPI_STATUS_IGNORE);
  MPI_Barrier(MPI_COMM_WORLD);
  printf("rank %d: idle pass %.1f ns\n", r, best * 1e9);
  MPI_Finalize();
  return 0;
}
