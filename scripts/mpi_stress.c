/*
 * mpi_stress.c -- the message pattern of `btl stress`, in MPI, for the
 * shared-memory series of scripts/shm-memory.sh (Open MPI's vader under the
 * same workload as btl).
 *
 *   mpirun -np N ./mpi_stress [MESSAGES] [MAX_SIZE] [SEED]     (20 65536 1)
 *
 * Every rank sends MESSAGES messages to every other rank, message `seq` to
 * `dst` of exactly the length `btl stress --seed SEED --max-size MAX_SIZE`
 * gives it (btl_core::check::message_len, the same generator ported below:
 * half up to 64 B, a third up to 4 KiB, a tenth up to 64 KiB, the rest up
 * to MAX_SIZE) and filled with the same content stream
 * (btl_core::check::fill). Receives are posted first (one per sender and
 * sequence number, tag = sequence), then the sends, then MPI_Waitall; every
 * received message is checked (length and content). Rank 0 prints one line;
 * the exit status is 0 only if every message arrived intact.
 *
 * btl stress also has a one-sided phase (a put and get per peer of a small
 * region) that this program does not reproduce: it moves through the
 * fragments already counted here and does not change the segment size.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* xorshift64* seeded through splitmix64 (btl_core::check's Rng). */
static uint64_t rng_new(uint64_t seed) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return (z ^ (z >> 31)) | 1;
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dULL;
}

static uint64_t message_rng(uint64_t seed, uint32_t src, uint32_t dst, uint64_t seq) {
    return rng_new(seed ^ ((uint64_t)src << 48) ^ ((uint64_t)dst << 32) ^ (seq * 0x10000001ULL));
}

static size_t message_len(uint64_t seed, uint32_t src, uint32_t dst, uint64_t seq, size_t max) {
    uint64_t r = message_rng(seed, src, dst, seq);
    uint64_t pick = rng_next(&r) % 100;
    size_t cap = pick <= 49 ? 64 : pick <= 82 ? 4096 : pick <= 94 ? 65536 : max;
    if (cap > max) cap = max;
    return (size_t)(rng_next(&r) % ((uint64_t)cap + 1));
}

static void fill(unsigned char *b, size_t n, uint64_t seed, uint32_t src, uint32_t dst, uint64_t seq) {
    uint64_t r = message_rng(seed ^ 0x5eed, src, dst, seq);
    for (size_t at = 0; at < n; at += 8) {
        uint64_t v = rng_next(&r);
        size_t k = n - at < 8 ? n - at : 8;
        for (size_t i = 0; i < k; i++) b[at + i] = (unsigned char)(v >> (8 * i)); /* little endian */
    }
}

/* Room for message `seq` from `src` to `dst`: its length in `*len`, and
 * at least one byte (malloc(0) may return NULL); aborts the job when
 * memory runs out. */
static unsigned char *message_buf(uint64_t seed, uint32_t src, uint32_t dst, long seq, long max,
                                  size_t *len) {
    *len = message_len(seed, src, dst, (uint64_t)seq, (size_t)max);
    unsigned char *b = malloc(*len ? *len : 1);
    if (!b) MPI_Abort(MPI_COMM_WORLD, 1);
    return b;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long messages = argc > 1 ? atol(argv[1]) : 20;
    long max = argc > 2 ? atol(argv[2]) : 65536;
    uint64_t seed = argc > 3 ? strtoull(argv[3], NULL, 10) : 1;
    if (messages < 1 || messages > 32767 || max < 0 || max > (1L << 30)) {
        if (me == 0) fprintf(stderr, "mpi_stress: MESSAGES 1..32767 (MPI tags), MAX_SIZE 0..2^30\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t total = (size_t)(n - 1) * (size_t)messages;
    unsigned char **rbuf = calloc(total, sizeof *rbuf), **sbuf = calloc(total, sizeof *sbuf);
    MPI_Request *req = calloc(2 * total, sizeof *req);
    if (!rbuf || !sbuf || !req) MPI_Abort(MPI_COMM_WORLD, 1);
    double t0 = MPI_Wtime();
    size_t k = 0;
    for (int src = 0; src < n; src++) {
        if (src == me) continue;
        for (long seq = 0; seq < messages; seq++, k++) {
            size_t len;
            rbuf[k] = message_buf(seed, (uint32_t)src, (uint32_t)me, seq, max, &len);
            MPI_Irecv(rbuf[k], (int)len, MPI_BYTE, src, (int)seq, MPI_COMM_WORLD, &req[k]);
        }
    }
    k = 0;
    for (int dst = 0; dst < n; dst++) {
        if (dst == me) continue;
        for (long seq = 0; seq < messages; seq++, k++) {
            size_t len;
            sbuf[k] = message_buf(seed, (uint32_t)me, (uint32_t)dst, seq, max, &len);
            fill(sbuf[k], len, seed, (uint32_t)me, (uint32_t)dst, (uint64_t)seq);
            MPI_Isend(sbuf[k], (int)len, MPI_BYTE, dst, (int)seq, MPI_COMM_WORLD, &req[total + k]);
        }
    }
    MPI_Status *st = calloc(2 * total, sizeof *st);
    if (!st) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Waitall((int)(2 * total), req, st);
    long bad = 0;
    unsigned long long bytes = 0;
    k = 0;
    for (int src = 0; src < n; src++) {
        if (src == me) continue;
        for (long seq = 0; seq < messages; seq++, k++) {
            size_t len;
            unsigned char *want = message_buf(seed, (uint32_t)src, (uint32_t)me, seq, max, &len);
            int got = 0;
            MPI_Get_count(&st[k], MPI_BYTE, &got);
            fill(want, len, seed, (uint32_t)src, (uint32_t)me, (uint64_t)seq);
            if ((size_t)got != len || memcmp(want, rbuf[k], len) != 0) bad++;
            bytes += len;
            free(want);
            free(rbuf[k]);
            free(sbuf[k]);
        }
    }
    long bad_all = 0;
    unsigned long long bytes_all = 0;
    MPI_Reduce(&bad, &bad_all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&bytes, &bytes_all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (me == 0)
        printf("mpi_stress: %d ranks, %ld messages per pair, %llu bytes, %ld wrong, %.2f s: %s\n", n,
               messages, bytes_all, bad_all, MPI_Wtime() - t0, bad_all ? "ERRORS" : "all intact");
    MPI_Finalize();
    return bad_all ? 1 : 0;
}
