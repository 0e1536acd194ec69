perf record -a -g -- vrdmactl perf write_bw --path tcp -s 1048576 -D 5 --local
