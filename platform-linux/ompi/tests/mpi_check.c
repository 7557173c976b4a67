/*
 * mpi_check.c — an MPI program whose every byte is checked, for the
 * rsm/rtcp tests (scripts/ompi-test.sh): point-to-point between every
 * pair at sizes across every protocol boundary (eager, send fragments,
 * rendezvous, RDMA get), non-contiguous datatypes (convertor packing),
 * many messages in flight, collectives, one-sided put/get. Prints
 * "mpi_check: rank R: N passed, M failed" and exits non-zero on a failure.
 *
 * By default it asks for MPI_THREAD_MULTIPLE and, when given it, also
 * runs two threads exchanging checked messages at once. With --rma it
 * initialises single-threaded and checks one-sided put/get instead: Open
 * MPI 4.1's osc pt2pt, the one-sided component for BTLs without atomics
 * (Open MPI's tcp, btl's rsm/rtcp), refuses MPI_THREAD_MULTIPLE; run it
 * with --mca osc pt2pt.
 *
 *   mpirun -n 4 --mca pml ob1 --mca btl self,rsm ./mpi_check [--quick]
 *   mpirun -n 4 --mca pml ob1 --mca btl self,rsm --mca osc pt2pt ./mpi_check --rma
 *   mpirun -n 3 ... ./mpi_check --seconds 60     # rounds for a minute
 */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size, passed, failed;

static uint8_t pattern(int src, int dst, size_t n, size_t i, int round)
{
    return (uint8_t) (src * 131 + dst * 31 + n * 7 + i * 13 + round * 101 + (i >> 8));
}

static void fill(uint8_t *b, size_t n, int src, int dst, int round)
{
    for (size_t i = 0; i < n; i++) b[i] = pattern(src, dst, n, i, round);
}

static int check(const char *what, const uint8_t *b, size_t n, int src, int dst, int round)
{
    for (size_t i = 0; i < n; i++) {
        if (b[i] != pattern(src, dst, n, i, round)) {
            fprintf(stderr, "mpi_check: rank %d: %s from %d, %zu bytes: byte %zu is %u, not %u\n",
                    rank, what, src, n, i, b[i], pattern(src, dst, n, i, round));
            failed++;
            return 0;
        }
    }
    passed++;
    return 1;
}

static void pairs(size_t maxsz)
{
    static const size_t sizes[] = {0, 1, 8, 100, 4000, 4095, 4096, 4097, 32768, 32769,
                                   65536, 65537, 200000, 1048589, 4194304};
    uint8_t *s = malloc(maxsz + 1), *r = malloc(maxsz + 1);
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        if (n > maxsz) continue;
        for (int peer = 0; peer < size; peer++) {
            if (peer == rank) continue;
            for (int round = 0; round < 2; round++) {
                fill(s, n, rank, peer, round);
                memset(r, 0xee, n + 1);
                MPI_Sendrecv(s, (int) n, MPI_BYTE, peer, 10 + round, r, (int) n, MPI_BYTE, peer,
                             10 + round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                check("sendrecv", r, n, peer, rank, round);
                if (r[n] != 0xee) {
                    fprintf(stderr, "mpi_check: rank %d: byte past %zu written\n", rank, n);
                    failed++;
                }
            }
        }
    }
    free(s);
    free(r);
}

/* non-contiguous: every other int of a strided vector, in both directions */
static void vectors(void)
{
    const int counts[] = {1, 100, 3000, 70000};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        int count = counts[k];
        MPI_Datatype vec;
        MPI_Type_vector(count, 1, 2, MPI_INT, &vec);
        MPI_Type_commit(&vec);
        int *s = malloc(sizeof(int) * 2 * count), *r = calloc(2 * count, sizeof(int));
        for (int peer = 0; peer < size; peer++) {
            if (peer == rank) continue;
            for (int i = 0; i < 2 * count; i++) s[i] = (i & 1) ? -1 : rank * 1000003 + i;
            memset(r, 0, sizeof(int) * 2 * count);
            MPI_Sendrecv(s, 1, vec, peer, 20, r, 1, vec, peer, 20, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
            int ok = 1;
            for (int i = 0; i < 2 * count && ok; i++) {
                int want = (i & 1) ? 0 : peer * 1000003 + i;
                if (r[i] != want) {
                    fprintf(stderr, "mpi_check: rank %d: vector of %d from %d: int %d is %d\n",
                            rank, count, peer, i, r[i]);
                    ok = 0;
                }
            }
            ok ? passed++ : failed++;
        }
        free(s);
        free(r);
        MPI_Type_free(&vec);
    }
}

/* many messages in flight to every peer at once */
static void flood(int window, size_t n)
{
    int npeers = size - 1;
    if (npeers == 0) return;
    uint8_t *s = malloc(n * window), *r = malloc(n * window * npeers);
    MPI_Request *req = malloc(sizeof(MPI_Request) * 2 * window * npeers);
    int q = 0, j = 0;
    for (int peer = 0; peer < size; peer++) {
        if (peer == rank) continue;
        for (int w = 0; w < window; w++)
            MPI_Irecv(r + (size_t) (j * window + w) * n, (int) n, MPI_BYTE, peer, 30 + w % 4,
                      MPI_COMM_WORLD, &req[q++]);
        j++;
    }
    for (int w = 0; w < window; w++) fill(s + (size_t) w * n, n, rank, w, 7);
    for (int peer = 0; peer < size; peer++) {
        if (peer == rank) continue;
        for (int w = 0; w < window; w++)
            MPI_Isend(s + (size_t) w * n, (int) n, MPI_BYTE, peer, 30 + w % 4, MPI_COMM_WORLD,
                      &req[q++]);
    }
    MPI_Waitall(q, req, MPI_STATUSES_IGNORE);
    j = 0;
    for (int peer = 0; peer < size; peer++) {
        if (peer == rank) continue;
        int ok = 1;
        for (int w = 0; w < window && ok; w++) {
            const uint8_t *b = r + (size_t) (j * window + w) * n;
            for (size_t i = 0; i < n; i++) {
                if (b[i] != pattern(peer, w, n, i, 7)) {
                    fprintf(stderr, "mpi_check: rank %d: flood message %d of %zu bytes from %d "
                            "wrong at %zu\n", rank, w, n, peer, i);
                    ok = 0;
                    break;
                }
            }
        }
        ok ? passed++ : failed++;
        j++;
    }
    free(s);
    free(r);
    free(req);
}

static void collectives(size_t big)
{
    uint8_t *b = malloc(big);
    for (int root = 0; root < size; root++) {
        if (rank == root) fill(b, big, root, 0, 3); else memset(b, 0, big);
        MPI_Bcast(b, (int) big, MPI_BYTE, root, MPI_COMM_WORLD);
        check("bcast", b, big, root, 0, 3);
    }
    free(b);
    long v[1000], sum[1000];
    for (int i = 0; i < 1000; i++) v[i] = (long) rank * i + 1;
    MPI_Allreduce(v, sum, 1000, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    int ok = 1;
    for (int i = 0; i < 1000; i++) {
        long want = (long) i * size * (size - 1) / 2 + size;
        if (sum[i] != want) ok = 0;
    }
    ok ? passed++ : failed++;
    if (!ok) fprintf(stderr, "mpi_check: rank %d: allreduce wrong\n", rank);
    int *a = malloc(sizeof(int) * size * 5000), *c = malloc(sizeof(int) * size * 5000);
    for (int p = 0; p < size; p++)
        for (int i = 0; i < 5000; i++) a[p * 5000 + i] = rank * 7919 + p * 31 + i;
    MPI_Alltoall(a, 5000, MPI_INT, c, 5000, MPI_INT, MPI_COMM_WORLD);
    ok = 1;
    for (int p = 0; p < size; p++)
        for (int i = 0; i < 5000; i++)
            if (c[p * 5000 + i] != p * 7919 + rank * 31 + i) ok = 0;
    ok ? passed++ : failed++;
    if (!ok) fprintf(stderr, "mpi_check: rank %d: alltoall wrong\n", rank);
    free(a);
    free(c);
}

static void onesided(size_t n)
{
    uint8_t *mem = calloc(n * size, 1), *src = malloc(n * size), *got = malloc(n);
    MPI_Win win;
    MPI_Win_create(mem, n * size, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    MPI_Win_fence(0, win);
    for (int t = 0; t < size; t++) {
        /* each origin buffer stays untouched until the fence */
        fill(src + n * t, n, rank, t, 5);
        MPI_Put(src + n * t, (int) n, MPI_BYTE, t, (MPI_Aint) (n * rank), (int) n, MPI_BYTE,
                win);
    }
    MPI_Win_fence(0, win);
    for (int s = 0; s < size; s++) check("put", mem + n * s, n, s, rank, 5);
    int t = (rank + 1) % size;
    MPI_Get(got, (int) n, MPI_BYTE, t, (MPI_Aint) (n * rank), (int) n, MPI_BYTE, win);
    MPI_Win_fence(0, win);
    check("get", got, n, rank, t, 5);
    MPI_Win_free(&win);
    free(mem);
    free(src);
    free(got);
}

/* two threads, each on its own communicator, checked ring exchanges */
struct thread_arg {
    MPI_Comm comm;
    int id, ok, done;
};

static void *exchanger(void *p)
{
    struct thread_arg *a = p;
    size_t n = 70000;
    /* zeroed: round 0 sends 0 bytes of a buffer fill() has not written */
    uint8_t *s = calloc(n, 1), *r = calloc(n, 1);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    a->ok = s && r;
    if (!a->ok) {
        fprintf(stderr, "mpi_check: rank %d thread %d: out of memory\n", rank, a->id);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int round = 0; round < 50; round++) {
        size_t len = (size_t) (round * 1399) % n;
        fill(s, len, rank, right, round + a->id);
        MPI_Sendrecv(s, (int) len, MPI_BYTE, right, 40, r, (int) len, MPI_BYTE, left, 40,
                     a->comm, MPI_STATUS_IGNORE);
        for (size_t i = 0; i < len; i++) {
            if (r[i] != pattern(left, rank, len, i, round + a->id)) {
                fprintf(stderr, "mpi_check: rank %d thread %d: round %d byte %zu wrong\n", rank,
                        a->id, round, i);
                a->ok = 0;
                break;
            }
        }
    }
    free(s);
    free(r);
    return NULL;
}

static void threads(void)
{
    struct thread_arg a[2];
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        MPI_Comm_dup(MPI_COMM_WORLD, &a[i].comm);
        a[i].id = i;
    }
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, exchanger, &a[i]);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        a[i].ok ? passed++ : failed++;
        MPI_Comm_free(&a[i].comm);
    }
}

int main(int argc, char **argv)
{
    int quick = 0, rma = 0;
    double seconds = 0;
    for (int i = 1; i < argc; i++) {
        if (0 == strcmp(argv[i], "--quick")) quick = 1;
        else if (0 == strcmp(argv[i], "--rma")) rma = 1;
        else if (0 == strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: mpi_check [--quick] [--rma] [--seconds S]\n");
            return 2;
        }
    }
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, rma ? MPI_THREAD_SINGLE : MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t maxsz = quick ? 1048589 : 4194304;
    /* --seconds S: repeat the rounds until rank 0 has seen S seconds (the
     * kill test's long run); otherwise 1 (--quick) or 3 rounds. */
    double t0 = MPI_Wtime();
    for (int rep = 0;; rep++) {
        int more = seconds > 0 ? MPI_Wtime() - t0 < seconds : rep < (quick ? 1 : 3);
        MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (!more) break;
        pairs(maxsz);
        vectors();
        flood(64, 8);
        flood(32, 65536);
        flood(4, 1048576);
        collectives(quick ? 300000 : 4194304);
        if (rma) onesided(quick ? 100000 : 1 << 20);
        else if (provided == MPI_THREAD_MULTIPLE) threads();
        MPI_Barrier(MPI_COMM_WORLD);
    }
    printf("mpi_check: rank %d: %d passed, %d failed\n", rank, passed, failed);
    fflush(stdout);
    MPI_Finalize();
    return failed ? 1 : 0;
}
