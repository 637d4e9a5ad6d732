/* What `tern bench` reads of the machine it runs on (cmd_bench.c prints it
 * beside every result). */
#ifndef TERN_CLI_BENCH_MACHINE_H
#define TERN_CLI_BENCH_MACHINE_H

#include <stddef.h>

void bench_cpu_name(char *out, size_t n);
double bench_ram_gib(void);
/* CPU-seconds per second spent by the rest of the machine over ~0.5 s. */
double bench_others_busy_cpus(void);
/* Read bandwidth (GB/s) of `threads` threads over a buffer larger than any
 * cache, best of 3, measured in a child process (its 1 GiB buffer stays out
 * of this process's peak RSS); 0 when it cannot tell. */
double bench_read_bandwidth_apart(int threads);
/* GPU memory this process holds (MiB), from nvidia-smi; < 0 when it cannot
 * tell. */
double bench_gpu_mem_mib(void);
/* Other processes with a context on the GPUs (nvidia-smi), -1 unknown. */
int bench_gpu_other_processes(void);
double bench_peak_rss_gib(void);

#endif
