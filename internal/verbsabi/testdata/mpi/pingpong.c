/*
 * pingpong: two MPI ranks send a buffer back and forth, each round's
 * contents derived from the round and the sender, and check every byte
 * they receive. Prints "pingpong ok ROUNDS SIZE" on rank 0, or says what
 * differed and exits 1. Run by internal/verbsabi's TestMiddlewareMPI.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pattern(int round, int rank, size_t i)
{
	return (unsigned char)(round * 31 + rank * 7 + i * 13);
}

int main(int argc, char **argv)
{
	int rank, size, rounds = argc > 1 ? atoi(argv[1]) : 100;
	size_t len = argc > 2 ? (size_t)atol(argv[2]) : 65536;
	unsigned char *buf;
	double t0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size != 2 || rounds < 1 || len < 1) {
		if (rank == 0)
			fprintf(stderr, "pingpong: needs 2 ranks (has %d), ROUNDS >= 1 and SIZE >= 1\n", size);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	buf = malloc(len);
	if (!buf)
		MPI_Abort(MPI_COMM_WORLD, 2);
	t0 = MPI_Wtime();
	for (int r = 0; r < rounds; r++) {
		int from = r % 2, to = 1 - from;

		if (rank == from) {
			for (size_t i = 0; i < len; i++)
				buf[i] = pattern(r, rank, i);
			MPI_Send(buf, (int)len, MPI_BYTE, to, r, MPI_COMM_WORLD);
		} else {
			memset(buf, 0, len);
			MPI_Recv(buf, (int)len, MPI_BYTE, from, r, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (size_t i = 0; i < len; i++) {
				if (buf[i] != pattern(r, from, i)) {
					fprintf(stderr, "pingpong: rank %d round %d byte %zu: 0x%02x, want 0x%02x\n", rank, r,
						i, buf[i], pattern(r, from, i));
					MPI_Abort(MPI_COMM_WORLD, 1);
				}
			}
		}
	}
	if (rank == 0)
		printf("pingpong ok %d %zu %.1f usec/round\n", rounds, len, (MPI_Wtime() - t0) * 1e6 / rounds);
	free(buf);
	MPI_Finalize();
	return 0;
}
