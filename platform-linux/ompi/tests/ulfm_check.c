/* A ULFM program (Open MPI 5, `mpirun --with-ft ulfm`): every rank joins an
 * MPI_Allreduce, then the victim rank SIGKILLs itself mid-exchange; the
 * survivors must see MPI_ERR_PROC_FAILED (or MPI_ERR_REVOKED) from their
 * next collective, revoke and shrink the communicator, and finish an
 * MPI_Allreduce over the survivors with the right sum. Prints
 * "ulfm_check: rank R survived, sum S of N" per survivor; exits 1 on a
 * wrong outcome.
 *
 *   ulfm_check [VICTIM]     (default: the last rank) */
#include <mpi.h>
#include <mpi-ext.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int victim = argc > 1 ? atoi(argv[1]) : size - 1;
    if (size < 3 || victim < 0 || victim >= size) {
        if (0 == rank) fprintf(stderr, "ulfm_check: needs 3 or more ranks and a victim below them\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Comm world;
    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);

    int one = 1, n = 0;
    if (MPI_SUCCESS != MPI_Allreduce(&one, &n, 1, MPI_INT, MPI_SUM, world) || n != size) {
        fprintf(stderr, "ulfm_check: rank %d: the first allreduce failed (%d)\n", rank, n);
        return 1;
    }
    /* an exchange in flight: a ring of messages, the victim dies within it */
    static char buf[2][1 << 16];
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    int rc = MPI_SUCCESS;
    for (int round = 0; round < 200 && MPI_SUCCESS == rc; round++) {
        if (rank == victim && round == 20) raise(SIGKILL);
        MPI_Request r[2];
        rc = MPI_Irecv(buf[0], sizeof buf[0], MPI_BYTE, left, 7, world, &r[0]);
        if (MPI_SUCCESS == rc) rc = MPI_Isend(buf[1], sizeof buf[1], MPI_BYTE, right, 7, world, &r[1]);
        /* one at a time: a failed peer's request ends in MPI_ERR_PROC_FAILED,
         * one waiting on a live peer that stopped ends when the first rank
         * to notice revokes the communicator (MPI_ERR_REVOKED) */
        for (int i = 0; i < 2 && MPI_SUCCESS == rc; i++) rc = MPI_Wait(&r[i], MPI_STATUS_IGNORE);
    }
    if (MPI_SUCCESS == rc) rc = MPI_Allreduce(&one, &n, 1, MPI_INT, MPI_SUM, world);
    int cls = MPI_SUCCESS;
    MPI_Error_class(rc, &cls);
    if (MPI_ERR_PROC_FAILED != cls && MPIX_ERR_REVOKED != cls) {
        fprintf(stderr, "ulfm_check: rank %d: expected MPI_ERR_PROC_FAILED or MPI_ERR_REVOKED, got class %d\n",
                rank, cls);
        return 1;
    }
    MPIX_Comm_revoke(world);
    MPI_Comm shrunk;
    if (MPI_SUCCESS != MPIX_Comm_shrink(world, &shrunk)) {
        fprintf(stderr, "ulfm_check: rank %d: MPIX_Comm_shrink failed\n", rank);
        return 1;
    }
    int ssize;
    MPI_Comm_size(shrunk, &ssize);
    MPI_Comm_set_errhandler(shrunk, MPI_ERRORS_RETURN);
    int sum = 0, mine = rank + 1, want = size * (size + 1) / 2 - (victim + 1);
    rc = MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, shrunk);
    if (MPI_SUCCESS != rc || ssize != size - 1 || sum != want) {
        fprintf(stderr, "ulfm_check: rank %d: allreduce over the survivors: rc %d, %d ranks, sum %d (want %d)\n",
                rank, rc, ssize, sum, want);
        return 1;
    }
    printf("ulfm_check: rank %d survived, sum %d of %d\n", rank, sum, ssize);
    fflush(stdout);
    MPI_Comm_free(&shrunk);
    MPI_Comm_free(&world);
    MPI_Finalize();
    return 0;
}
