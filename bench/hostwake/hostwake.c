// hostwake: runs a command with the host's power management asked to keep
// it awake, to find out whether a transfer after idle is slow because of
// the host's CPU power states (issue 37, the one-transfer rows and the
// checked ipc row). Both requests last exactly as long as the command:
//
//   -l US   a CPU wake-up latency request of US microseconds (PM QoS,
//           /dev/cpu_dma_latency): idle CPUs stay out of states slower
//           to leave than US. The open file is inherited across exec and
//           the request ends when the command exits.
//   -u MIN  the command's minimum utilisation clamp (0..1024, uclamp_min
//           by sched_setattr): with the schedutil governor its threads run
//           at least at MIN/1024 of the top frequency from the first
//           instant, instead of after the load average has grown. Threads
//           it starts inherit it.
//
//   cc -O2 -o hostwake bench/hostwake/hostwake.c
//   ./hostwake -l 0 -u 1024 -- ./idletcp 8 1073741824 1000 6 shared
//
// A request the host refuses is reported on stderr ("hostwake: ... not
// applied") and the command runs anyway, so a variant's log says which
// requests held.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

// struct sched_attr as of Linux 5.3 (the uclamp fields last).
struct attr {
  uint32_t size, policy;
  uint64_t flags;
  int32_t nice;
  uint32_t prio;
  uint64_t runtime, deadline, period;
  uint32_t util_min, util_max;
};
#define KEEP_POLICY 0x08
#define KEEP_PARAMS 0x10
#define UTIL_CLAMP_MIN 0x20

static void latency(int us) {
  int fd = open("/dev/cpu_dma_latency", O_WRONLY);  // no O_CLOEXEC: the command keeps it
  int32_t v = us;
  if (fd < 0 || write(fd, &v, sizeof v) != sizeof v) {
    fprintf(stderr, "hostwake: wake-up latency %d us not applied: /dev/cpu_dma_latency: %s\n", us, strerror(errno));
    if (fd >= 0) close(fd);
    return;
  }
  fprintf(stderr, "hostwake: wake-up latency %d us held (fd %d)\n", us, fd);
}

static void clamp(int min) {
  struct attr a = {.size = sizeof a, .flags = KEEP_POLICY | KEEP_PARAMS | UTIL_CLAMP_MIN, .util_min = (uint32_t)min};
  if (syscall(SYS_sched_setattr, 0, &a, 0) != 0) {
    fprintf(stderr, "hostwake: uclamp_min %d not applied: sched_setattr: %s\n", min, strerror(errno));
    return;
  }
  fprintf(stderr, "hostwake: uclamp_min %d set\n", min);
}

int main(int argc, char **argv) {
  int opt;
  while ((opt = getopt(argc, argv, "+l:u:")) != -1) {
    switch (opt) {
    case 'l': latency(atoi(optarg)); break;
    case 'u': clamp(atoi(optarg)); break;
    default: fprintf(stderr, "usage: hostwake [-l US] [-u MIN] [--] CMD [ARGS...]\n"); return 2;
    }
  }
  if (optind >= argc) { fprintf(stderr, "usage: hostwake [-l US] [-u MIN] [--] CMD [ARGS...]\n"); return 2; }
  execvp(argv[optind], argv + optind);
  fprintf(stderr, "hostwake: exec %s: %s\n", argv[optind], strerror(errno));
  return 127;
}
