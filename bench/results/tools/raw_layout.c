/* Raw MPI only, no runtime: the same tensors reduced in place, chunked, from their own separate
 * buffers (as a framework holds gradients) vs one contiguous buffer of the same total size (what
 * the "best-chunked" reference of B1/B2 reduces). Best of 8 per variant, 3 repetitions.
 *
 *   mpicc -O2 -o raw_layout bench/results/tools/raw_layout.c
 *   mpirun --bind-to core -np 2 ./raw_layout bench/tensor_sets/bert_base.txt
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
static float* alloc(size_t n) {
  size_t b = (n * 4 + 4095) / 4096 * 4096;
  float* p = mmap(NULL, b, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  memset(p, 0, b);
  return p;
}
static void chunked(float* p, long n, long chunk) {
  for (long s = 0; s < n; s += chunk) {
    long c = n - s < chunk ? n - s : chunk;
    MPI_Allreduce(MPI_IN_PLACE, p + s, (int)c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
}
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  long el[1000]; int nt = 0; long total = 0;
  FILE* f = fopen(argv[1], "r"); char line[256];
  while (fgets(line, sizeof line, f)) { if (line[0] == '#' || line[0] == '\n') continue; el[nt] = atol(line); total += el[nt++]; }
  float* bufs[1000];
  for (int i = 0; i < nt; ++i) bufs[i] = alloc(el[i]);
  float* big = alloc(total);
  long chunks[] = {1 << 18, 1 << 20};  /* elements: 1 MiB, 4 MiB */
  for (int rep = 0; rep < 3; ++rep) {
    for (int c = 0; c < 2; ++c) {
      double best_sep = 1e9, best_big = 1e9;
      for (int it = 0; it < 8; ++it) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = nt - 1; i >= 0; --i) chunked(bufs[i], el[i], chunks[c]);
        double t1 = MPI_Wtime();
        MPI_Barrier(MPI_COMM_WORLD);
        double t2 = MPI_Wtime();
        chunked(big, total, chunks[c]);
        double t3 = MPI_Wtime();
        if (t1 - t0 < best_sep) best_sep = t1 - t0;
        if (t3 - t2 < best_big) best_big = t3 - t2;
      }
      int r; MPI_Comm_rank(MPI_COMM_WORLD, &r);
      if (r == 0) printf("chunk %ld MiB: separate buffers %.1f ms, one buffer %.1f ms, ratio %.3f\n", chunks[c] * 4 >> 20, best_sep * 1e3, best_big * 1e3, best_sep / best_big);
    }
  }
  MPI_Finalize();
}
