/*
 * What a hot request's pause and resume of its thread's perf event cost on this
 * machine, against a plain system call: PERF_EVENT_IOC_ENABLE then _DISABLE on a
 * per-thread cpu-clock event (what `go_high` and `on_hot_end` do once per hot
 * request), a read of the thread's CPU clock (the dead-time bookkeeping beside them)
 * and `getppid` (the cheapest system call). Prints µs per call, averaged over 200 000.
 *
 *     gcc -O2 -o /tmp/perf_ioctl_cost benches/perf_ioctl_cost.c && /tmp/perf_ioctl_cost
 *
 * Linux only; needs perf_event_paranoid <= 2 (user-space events of one's own thread).
 */
#define _GNU_SOURCE
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { N = 200000 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_CPU_CLOCK;
    a.sample_period = 1000000; /* 1 ms: spanprof's high rate */
    a.disabled = 1;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    if (fd < 0) {
        perror("perf_event_open");
        return 1;
    }
    struct timespec ts;
    double t0 = now();
    for (int i = 0; i < N; i++) {
        ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
        ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
    }
    double pair = (now() - t0) / N * 1e6;
    t0 = now();
    for (int i = 0; i < N; i++)
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    double clock = (now() - t0) / N * 1e6;
    t0 = now();
    for (int i = 0; i < N; i++)
        getppid();
    double plain = (now() - t0) / N * 1e6;
    printf("{\"enable_disable_pair_us\": %.2f, \"thread_cpu_clock_us\": %.2f, "
           "\"getppid_us\": %.2f}\n", pair, clock, plain);
    return 0;
}
