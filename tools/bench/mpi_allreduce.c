/* The peer of `ddl-bench allreduce`: Open MPI's own in-place MPI_Allreduce in a plain C loop,
 * as OSU's osu_allreduce and nccl-tests measure it.
 *
 *   mpicc -O2 -o target/mpi_allreduce tools/bench/mpi_allreduce.c
 *   mpirun -np 2 target/mpi_allreduce [--min-bytes B] [--max-bytes B] [--step-factor F]
 *                                     [--iters N] [--warmup N] [--nonblocking]
 *                                     [--thread-multiple]
 *
 * For each size (float32, MPI_SUM): one correctness call on integer-valued data (compared
 * exactly with the sum every rank can compute), `--warmup` untimed calls, a barrier, then
 * N back-to-back timed calls of
 *     MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)
 * (or MPI_Iallreduce + MPI_Wait with --nonblocking; --thread-multiple initialises MPI with
 * MPI_Init_thread(MPI_THREAD_MULTIPLE) instead of MPI_Init, to price that thread level). time = the mean of the N calls on the
 * slowest rank: ddl-bench's statistic. N = clamp(iters * 64 MiB / bytes, iters, 10000), the
 * same rule as ddl-bench, so small messages are timed over many calls.
 * pass_us: N passes of STREAM's scale kernel in place (buf[i] *= s) over a buffer of the same
 * size on every rank at once (slowest rank): the memory-bandwidth bound of an in-place
 * allreduce on one node, which must at least read every rank's buffer and write it back.
 * Prints one JSON line per size, the fields of `ddl-bench allreduce --json`. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_bytes(const char *flag, const char *s) {
    char *end;
    double v = strtod(s, &end);
    size_t mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1 << 10, end++;
    else if (*end == 'M' || *end == 'm') mult = 1 << 20, end++;
    else if (*end == 'G' || *end == 'g') mult = 1 << 30, end++;
    if (*end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end != '\0' || v <= 0) {
        fprintf(stderr, "mpi_allreduce: %s %s is not a size (e.g. 4096, 64KiB, 16MiB)\n", flag, s);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return (size_t)(v * (double)mult);
}

static float fill_value(size_t i, int rank, int salt) {
    return (float)((i * 7919 + (size_t)rank * 104729 + (size_t)salt * 31) % 2001) - 1000.0f;
}

static size_t iters_for(size_t bytes, size_t iters) {
    size_t n = iters * ((size_t)64 << 20) / bytes;
    size_t cap = iters > 10000 ? iters : 10000;
    if (n < iters) n = iters;
    if (n > cap) n = cap;
    return n;
}

static void allreduce(float *buf, int n, int nonblocking) {
    if (nonblocking) {
        MPI_Request req;
        MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
    } else {
        MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
}

int main(int argc, char **argv) {
    int thread_multiple = 0;
    for (int a = 1; a < argc; a++) thread_multiple |= strcmp(argv[a], "--thread-multiple") == 0;
    if (thread_multiple) {
        int provided;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    } else {
        MPI_Init(&argc, &argv);
    }
    int rank, p;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    size_t min_bytes = 4096, max_bytes = 64 << 20, factor = 4, iters = 20, warmup = 3;
    int nonblocking = 0;
    for (int a = 1; a < argc; a++) {
        const char *flag = argv[a];
        if (strcmp(flag, "--nonblocking") == 0) {
            nonblocking = 1;
            continue;
        }
        if (strcmp(flag, "--thread-multiple") == 0) continue;
        if (a + 1 >= argc) {
            fprintf(stderr, "mpi_allreduce: %s needs a value\n", flag);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        const char *v = argv[++a];
        if (strcmp(flag, "--min-bytes") == 0) min_bytes = parse_bytes(flag, v);
        else if (strcmp(flag, "--max-bytes") == 0) max_bytes = parse_bytes(flag, v);
        else if (strcmp(flag, "--step-factor") == 0) factor = parse_bytes(flag, v);
        else if (strcmp(flag, "--iters") == 0) iters = parse_bytes(flag, v);
        else if (strcmp(flag, "--warmup") == 0) warmup = (size_t)atol(v);
        else {
            fprintf(stderr, "mpi_allreduce: unknown flag %s\n", flag);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (factor < 2 || min_bytes < 4 || min_bytes > max_bytes) {
        fprintf(stderr, "mpi_allreduce: need --step-factor >= 2 and 4 <= --min-bytes <= --max-bytes\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    float *buf = malloc(max_bytes), *other = malloc(max_bytes);
    /* Not a constant the compiler could fold: the pass must read and write every element. */
    float scale = argc > 1000 ? 2.0f : 1.0f;
    if (!buf || !other) {
        fprintf(stderr, "mpi_allreduce: cannot allocate %zu bytes\n", max_bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const char *algo = nonblocking ? (thread_multiple ? "mpi-c-iallreduce-mt" : "mpi-c-iallreduce")
                                   : (thread_multiple ? "mpi-c-mt" : "mpi-c");
    int salt = 0;
    for (size_t bytes = min_bytes / 4 * 4; bytes <= max_bytes; bytes *= factor, salt++) {
        int n = (int)(bytes / 4);
        for (int i = 0; i < n; i++) buf[i] = fill_value(i, rank, salt);
        allreduce(buf, n, nonblocking);
        int bad = 0;
        for (int i = 0; i < n && !bad; i++) {
            float want = 0.0f;
            for (int r = 0; r < p; r++) want += fill_value(i, r, salt);
            bad = buf[i] != want;
        }
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        memset(buf, 0, bytes);
        for (size_t w = 0; w < warmup; w++) allreduce(buf, n, nonblocking);
        size_t calls = iters_for(bytes, iters);
        MPI_Barrier(MPI_COMM_WORLD);
        double start = MPI_Wtime();
        for (size_t c = 0; c < calls; c++) allreduce(buf, n, nonblocking);
        double mean = (MPI_Wtime() - start) / (double)calls;
        memset(other, 0, bytes);
        MPI_Barrier(MPI_COMM_WORLD);
        start = MPI_Wtime();
        for (size_t c = 0; c < calls; c++) {
            for (int i = 0; i < n; i++) other[i] *= scale;
            __asm__ volatile("" : : "r"(other) : "memory");
        }
        double times[2] = {mean, (MPI_Wtime() - start) / (double)calls};
        MPI_Reduce(rank == 0 ? MPI_IN_PLACE : times, times, 2, MPI_DOUBLE, MPI_MAX, 0,
                   MPI_COMM_WORLD);
        mean = times[0];
        if (rank == 0) {
            double algbw = (double)bytes / mean / 1e9;
            printf("{\"algo\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"calls\":%zu,\"time_us\":%.3f,"
                   "\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,\"correct\":%s,\"pass_us\":%.3f}\n",
                   algo, p, bytes, calls, mean * 1e6, algbw, algbw * 2.0 * (p - 1) / p,
                   bad ? "false" : "true", times[1] * 1e6);
            fflush(stdout);
        }
    }
    free(buf);
    free(other);
    MPI_Finalize();
    return 0;
}
