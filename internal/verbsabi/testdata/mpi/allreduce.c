/*
 * allreduce: every rank contributes a vector that depends on its rank;
 * MPI_Allreduce sums them, and every rank checks every element of the sum
 * against the formula. Prints "allreduce ok RANKS COUNT" on rank 0, or
 * says what differed and exits 1. Run by internal/verbsabi's
 * TestMiddlewareMPI.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	int rank, size, count = argc > 1 ? atoi(argv[1]) : 100000, rounds = argc > 2 ? atoi(argv[2]) : 10;
	long *in, *out;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (count < 1 || rounds < 1)
		MPI_Abort(MPI_COMM_WORLD, 2);
	in = malloc(sizeof(*in) * (size_t)count);
	out = malloc(sizeof(*out) * (size_t)count);
	if (!in || !out)
		MPI_Abort(MPI_COMM_WORLD, 2);
	for (int r = 0; r < rounds; r++) {
		for (int i = 0; i < count; i++)
			in[i] = (long)(rank + 1) * i + r;
		MPI_Allreduce(in, out, count, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
		for (int i = 0; i < count; i++) {
			/* sum over ranks k of (k+1)*i + r */
			long want = (long)size * (size + 1) / 2 * i + (long)size * r;

			if (out[i] != want) {
				fprintf(stderr, "allreduce: rank %d round %d element %d: %ld, want %ld\n", rank, r, i,
					out[i], want);
				MPI_Abort(MPI_COMM_WORLD, 1);
			}
		}
	}
	if (rank == 0)
		printf("allreduce ok %d %d %d\n", size, count, rounds);
	free(in);
	free(out);
	MPI_Finalize();
	return 0;
}
