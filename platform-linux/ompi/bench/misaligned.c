/* Ping-pong of N bytes between buffers at chosen offsets into a page: how
 * a BTL copes with misaligned user buffers (the kernel's single copy runs
 * 4.5x slower when the destination lies 1-15 bytes after the source modulo
 * a page; README, "Single copy and alignment"). Rank 0 prints
 *   N soff=S roff=R: X us, Y GB/s
 * (half round trip). Usage: misaligned N SEND_OFFSET RECV_OFFSET ITERS, e.g.
 *   mpicc -O2 -o /tmp/misaligned platform-linux/ompi/bench/misaligned.c
 *   mpirun -n 2 --bind-to core --mca pml ob1 --mca btl self,rsm \
 *       /tmp/misaligned 4194304 0 8 200 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (argc != 5) {
    if (r == 0) fprintf(stderr, "usage: %s N SEND_OFFSET RECV_OFFSET ITERS\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  size_t n = strtoull(argv[1], NULL, 10);
  long soff = atol(argv[2]), roff = atol(argv[3]);
  int iters = atoi(argv[4]);
  if (n == 0 || n > (1u << 30) || soff < 0 || soff > 4095 || roff < 0 || roff > 4095 ||
      iters < 1) {
    if (r == 0) fprintf(stderr, "N 1..2^30, offsets 0..4095, ITERS >= 1\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  char *sb = aligned_alloc(4096, n + 8192), *rb = aligned_alloc(4096, n + 8192);
  if (!sb || !rb) MPI_Abort(MPI_COMM_WORLD, 1);
  memset(sb, r + 1, n + 8192);
  memset(rb, 0, n + 8192);
  double t = 0;
  for (int i = -5; i < iters; i++) {
    if (i == 0) {
      MPI_Barrier(MPI_COMM_WORLD);
      t = MPI_Wtime();
    }
    if (r == 0) {
      MPI_Send(sb + soff, (int)n, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(rb + roff, (int)n, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (r == 1) {
      MPI_Recv(rb + roff, (int)n, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(sb + soff, (int)n, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
  }
  t = MPI_Wtime() - t;
  if (r == 0)
    printf("%zu soff=%ld roff=%ld: %.1f us, %.2f GB/s\n", n, soff, roff, t / iters / 2 * 1e6,
           n / (t / iters / 2) / 1e9);
  free(sb);
  free(rb);
  MPI_Finalize();
  return 0;
}
