// idletcp: what one burst of loopback TCP moves right after the host sat
// idle, against the same burst back to back (issue 37, the one-transfer
// rows, each checked: the sidecars sit idle through every check). CONNS
// connections, each sent from its own thread out of a 16 MiB buffer (stage's
// footprint per stream) and read by its own thread; a burst is BYTES split
// evenly, timed from its start until every reader has its share. Each of
// ROUNDS bursts follows GAP_MS of idle; GAP_MS 0 runs them back to back.
//
//   cc -O2 -pthread -o idletcp bench/idletcp/idletcp.c
//   ./idletcp CONNS BYTES GAP_MS ROUNDS     e.g. ./idletcp 8 1073741824 1000 6
//
// Prints each burst's GB/s and the median.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RING (16u << 20)
static int conns, rounds, gap_ms;
static size_t share;
static pthread_barrier_t go, done;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void die(const char *m) { perror(m); exit(1); }

static void *sender(void *arg) {
  int fd = (int)(long)arg;
  char *buf = malloc(RING);
  memset(buf, 0x5a, RING);
  for (int r = 0; r < rounds; r++) {
    pthread_barrier_wait(&go);
    for (size_t left = share, off = 0; left > 0;) {
      size_t n = left < 4u << 20 ? left : 4u << 20;
      if (off + n > RING) off = 0;
      ssize_t k = write(fd, buf + off, n);
      if (k <= 0) die("write");
      left -= k, off += k;
    }
  }
  return NULL;
}

static void *receiver(void *arg) {
  int fd = (int)(long)arg;
  char *buf = malloc(RING);
  for (int r = 0; r < rounds; r++) {
    for (size_t left = share; left > 0;) {
      ssize_t k = recv(fd, buf, left < RING ? left : RING, 0);
      if (k <= 0) die("recv");
      left -= k;
    }
    pthread_barrier_wait(&done);
  }
  return NULL;
}

static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
  if (argc != 5) { fprintf(stderr, "usage: idletcp CONNS BYTES GAP_MS ROUNDS\n"); return 2; }
  conns = atoi(argv[1]); size_t bytes = strtoull(argv[2], 0, 10); gap_ms = atoi(argv[3]); rounds = atoi(argv[4]);
  if (conns < 1 || conns > 64 || rounds < 1 || bytes < (size_t)conns) { fprintf(stderr, "idletcp: bad arguments\n"); return 2; }
  share = bytes / conns;
  int ln = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (ln < 0 || bind(ln, (void *)&a, sizeof a) || listen(ln, 64) || getsockname(ln, (void *)&a, &al)) die("listen");
  pthread_barrier_init(&go, NULL, conns + 1);
  pthread_barrier_init(&done, NULL, conns + 1);
  pthread_t th[128];
  for (int i = 0; i < conns; i++) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (void *)&a, sizeof a)) die("connect");
    int s = accept(ln, NULL, NULL);
    if (s < 0) die("accept");
    pthread_create(&th[2 * i], NULL, sender, (void *)(long)c);
    pthread_create(&th[2 * i + 1], NULL, receiver, (void *)(long)s);
  }
  double *gbs = calloc(rounds, sizeof *gbs);
  for (int r = 0; r < rounds; r++) {
    if (gap_ms > 0) usleep(gap_ms * 1000);
    double t0 = now();
    pthread_barrier_wait(&go);
    pthread_barrier_wait(&done);
    gbs[r] = share * conns / (now() - t0) / 1e9;
    printf("burst %d: %.2f GB/s\n", r, gbs[r]);
  }
  qsort(gbs, rounds, sizeof *gbs, cmp);
  printf("idletcp %d conns, %zu B a burst, %d ms idle before each: median %.2f GB/s (%.2f..%.2f, %d bursts)\n", conns,
         share * conns, gap_ms, gbs[rounds / 2], gbs[0], gbs[rounds - 1], rounds);
  return 0;
}
