/*
 * mtexchange.c -- a threaded exchange under MPI_THREAD_MULTIPLE, every
 * byte checked (scripts/ompi-mtbench.sh times it; scripts/ompi-test.sh
 * loops it as a test).
 *
 *   mpirun -n 2 ./mtexchange [THREADS] [MESSAGES] [MAX_SIZE] [SEED]   (4 2000 262144 1)
 *
 * Thread t of rank 0 and thread t of rank 1 share their own duplicated
 * communicator and exchange MESSAGES messages each way: per message a
 * receive and a send posted at once, then MPI_Waitall. Message `seq` of
 * pair `t` has the same length on both sides (drawn from SEED, t and seq:
 * half up to 64 B, a third up to 4 KiB, a tenth up to 64 KiB, the rest up
 * to MAX_SIZE) and content that names the sender, the pair, seq and the
 * byte's offset, so a byte from the wrong message, thread or offset is
 * caught. Rank 0 prints one line with the exchange's wall time (from a
 * barrier to the last thread's end); the exit status is 0 only if every
 * message arrived intact.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int me;
static long messages, max_size;
static uint64_t seed;

struct pair {
    int id;
    MPI_Comm comm;
    long wrong; /* messages that arrived wrong */
};

/* A small deterministic mixer (splitmix64's finaliser). */
static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static long length_of(int pair, long seq)
{
    uint64_t r = mix(seed * 1000003u + (uint64_t) pair * 65537u + (uint64_t) seq);
    uint64_t class = r % 30, v = r >> 8;
    long cap = class < 15 ? 64 : class < 25 ? 4096 : class < 28 ? 65536 : max_size;
    if (cap > max_size) cap = max_size;
    return (long) (v % (uint64_t) (cap + 1));
}

static unsigned char byte_of(int from, int pair, long seq, long i)
{
    return (unsigned char) (from * 151 + pair * 31 + seq * 7 + i + (i >> 8));
}

static void *exchanger(void *p)
{
    struct pair *a = p;
    int peer = 1 - me;
    unsigned char *out = malloc((size_t) max_size + 1), *in = malloc((size_t) max_size + 1);
    if (NULL == out || NULL == in) {
        fprintf(stderr, "mtexchange: rank %d thread %d: out of memory\n", me, a->id);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (long seq = 0; seq < messages; seq++) {
        long len = length_of(a->id, seq);
        for (long i = 0; i < len; i++) out[i] = byte_of(me, a->id, seq, i);
        MPI_Request r[2];
        MPI_Status st[2];
        MPI_Irecv(in, (int) max_size + 1, MPI_BYTE, peer, (int) (seq & 0x7fff), a->comm, &r[0]);
        MPI_Isend(out, (int) len, MPI_BYTE, peer, (int) (seq & 0x7fff), a->comm, &r[1]);
        MPI_Waitall(2, r, st);
        int got;
        MPI_Get_count(&st[0], MPI_BYTE, &got);
        long bad = got != len ? 0 : -1;
        for (long i = 0; bad < 0 && i < len; i++)
            if (in[i] != byte_of(peer, a->id, seq, i)) bad = i;
        if (bad >= 0) {
            if (a->wrong++ < 5)
                fprintf(stderr,
                        "mtexchange: rank %d thread %d: message %ld wrong (length %d of %ld, "
                        "first bad byte %ld)\n",
                        me, a->id, seq, got, len, got != len ? -1 : bad);
        }
    }
    free(out);
    free(in);
    return NULL;
}

int main(int argc, char **argv)
{
    int provided, n;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long threads = argc > 1 ? atol(argv[1]) : 4;
    messages = argc > 2 ? atol(argv[2]) : 2000;
    max_size = argc > 3 ? atol(argv[3]) : 262144;
    seed = argc > 4 ? strtoull(argv[4], NULL, 10) : 1;
    if (2 != n || MPI_THREAD_MULTIPLE != provided || threads < 1 || threads > 64 ||
        messages < 1 || max_size < 0 || max_size > (1L << 28)) {
        if (0 == me)
            fprintf(stderr,
                    "mtexchange: needs 2 ranks (has %d), MPI_THREAD_MULTIPLE (has %d), "
                    "1-64 threads, MESSAGES >= 1 and 0 <= MAX_SIZE <= 2^28\n",
                    n, provided);
        MPI_Finalize();
        return 2;
    }
    struct pair a[64];
    pthread_t t[64];
    for (int i = 0; i < threads; i++) {
        a[i].id = i;
        a[i].wrong = 0;
        MPI_Comm_dup(MPI_COMM_WORLD, &a[i].comm);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, exchanger, &a[i]);
    long wrong = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        wrong += a[i].wrong;
    }
    double secs = MPI_Wtime() - t0;
    long all;
    MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < threads; i++) MPI_Comm_free(&a[i].comm);
    if (0 == me)
        printf("mtexchange threads %ld messages %ld max %ld seconds %.4f wrong %ld\n", threads,
               messages, max_size, secs, all);
    MPI_Finalize();
    return all ? 1 : 0;
}
