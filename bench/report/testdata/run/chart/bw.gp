set terminal pngcairo noenhanced size 960,600 font "sans,10"
set output "/tmp/po-rep/benchmarks-bw.png"
set title "Bandwidth against message size, vrdma (solid) beside UCX (dashed); MiB/s = 2^20 B/s"
set logscale x 2
set logscale y 10
set xrange [3:11000000]
set xtics ("4 B" 4, "32 B" 32, "256 B" 256, "2 KiB" 2048, "16 KiB" 16384, "128 KiB" 131072, "1 MiB" 1048576, "8 MiB" 8388608)
set format y "%g"
set xlabel "message size"
set ylabel "MiB/s"
set grid
set key top left
set datafile missing "?"
plot "bench/report/testdata/run/chart/bw.dat" using 1:2 with linespoints lw 2 lc rgb "#7b2cbf" pt 7 ps 0.6 title "vrdma memcpy", \
     "bench/report/testdata/run/chart/bw.dat" using 1:3 with linespoints lw 2 lc rgb "#1b7f3b" pt 7 ps 0.6 title "vrdma tcp", \
     "bench/report/testdata/run/chart/bw.dat" using 1:4 with linespoints lw 2 lc rgb "#1f5fbf" pt 7 ps 0.6 title "vrdma rdma", \
     "bench/report/testdata/run/chart/bw.dat" using 1:5 with linespoints lw 2 lc rgb "#e07b00" dt 2 pt 7 ps 0.6 title "UCX shm ucp_put_bw", \
     "bench/report/testdata/run/chart/bw.dat" using 1:6 with linespoints lw 2 lc rgb "#b0182a" dt 2 pt 7 ps 0.6 title "UCX tcp tag_bw"
