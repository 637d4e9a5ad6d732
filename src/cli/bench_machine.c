/* What `tern bench` reads of the machine: its CPU, memory, load, read
 * bandwidth, and the GPU memory held. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/bench_machine.h"
#include "util/clock.h"

void bench_cpu_name(char *out, size_t n) {
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && c) {
            c += 2;
            c[strcspn(c, "\n")] = '\0';
            snprintf(out, n, "%s", c);
            break;
        }
    }
    if (f) fclose(f);
}

double bench_ram_gib(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (double)pages * size / (1u << 30) : 0.0;
}

/* The machine's busy and total time from /proc/stat (jiffies). */
static int cpu_jiffies(unsigned long long *busy, unsigned long long *total) {
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                       &v[6], &v[7])
              : 0;
    if (f) fclose(f);
    if (n < 5) return -1;
    *total = 0;
    for (int i = 0; i < 8; i++) *total += v[i];
    *busy = *total - v[3] - v[4];
    return 0;
}

static double self_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

double bench_others_busy_cpus(void) {
    unsigned long long b0, t0, b1, t1;
    double s0 = self_cpu_s(), w0 = tern_now_s();
    if (cpu_jiffies(&b0, &t0) != 0) return 0.0;
    usleep(500000);
    if (cpu_jiffies(&b1, &t1) != 0 || t1 == t0) return 0.0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double busy = (double)(b1 - b0) / (double)(t1 - t0) * (double)ncpu;
    double own = (self_cpu_s() - s0) / (tern_now_s() - w0);
    return busy - own > 0 ? busy - own : 0.0;
}

/* Read bandwidth: the ceiling a memory-bound decode step can reach. */
typedef struct {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} bw_part;

static void *bw_read(void *arg) {
    bw_part *b = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= b->n; i += 4) {
        s0 += b->p[i];
        s1 += b->p[i + 1];
        s2 += b->p[i + 2];
        s3 += b->p[i + 3];
    }
    b->sum = s0 + s1 + s2 + s3;
    return NULL;
}

static double read_bandwidth(int threads) {
    size_t bytes = (size_t)1 << 30, n = bytes / 8;
    uint64_t *buf = malloc(bytes);
    if (!buf || threads < 1) { free(buf); return 0.0; }
    for (size_t i = 0; i < n; i++) buf[i] = i;
    pthread_t th[256];
    bw_part parts[256];
    if (threads > 256) threads = 256;
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = tern_now_s();
        int started = 0;
        for (int i = 0; i < threads; i++) {
            parts[i] = (bw_part){buf + n / threads * i, n / threads, 0};
            if (pthread_create(&th[i], NULL, bw_read, &parts[i]) == 0) started++;
            else break;
        }
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        double gbs = (double)bytes / started * started / (tern_now_s() - t0) / 1e9;
        if (started == threads && gbs > best) best = gbs;
    }
    free(buf);
    return best;
}

double bench_read_bandwidth_apart(int threads) {
    int fd[2];
    if (pipe(fd) != 0) return 0.0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        double v = read_bandwidth(threads);
        ssize_t w = write(fd[1], &v, sizeof v);
        _exit(w == (ssize_t)sizeof v ? 0 : 1);
    }
    close(fd[1]);
    double v = 0.0;
    if (pid < 0 || read(fd[0], &v, sizeof v) != (ssize_t)sizeof v) v = 0.0;
    close(fd[0]);
    if (pid > 0) waitpid(pid, NULL, 0);
    return v;
}

/* The engine allocates everything at load and session creation, so
 * a reading while a session lives is its peak. */
double bench_gpu_mem_mib(void) {
    FILE *p = popen("nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null", "r");
    if (!p) return -1;
    char line[256];
    double mib = -1;
    long me = (long)getpid();
    while (fgets(line, sizeof line, p)) {
        long pid;
        double m;
        if (sscanf(line, "%ld, %lf", &pid, &m) == 2 && pid == me) mib = m;
    }
    pclose(p);
    return mib;
}

int bench_gpu_other_processes(void) {
    FILE *p = popen("nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null", "r");
    if (!p) return -1;
    char line[64];
    int n = 0;
    long me = (long)getpid();
    while (fgets(line, sizeof line, p)) n += atol(line) != me && atol(line) > 0;
    return pclose(p) == 0 ? n : -1;
}

double bench_peak_rss_gib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / (1024.0 * 1024.0);
}
