// idletcp: what one burst of loopback TCP moves right after the host sat
// idle, against the same burst back to back (issue 37, the one-transfer
// rows, each checked: the sidecars sit idle through every check). CONNS
// connections, each sent from its own thread out of a 16 MiB buffer (stage's
// footprint per stream) and read by its own thread; a burst is BYTES, timed
// from its start until the readers have it all. Each of ROUNDS bursts
// follows GAP_MS of idle; GAP_MS 0 runs them back to back. MODE says how a
// burst is shared out:
//
//   split   (default) evenly, BYTES/CONNS a connection: the burst ends
//           with its slowest connection
//   shared  in 1 MiB chunks each sender takes from a common counter as it
//           is ready for one, as stage's streams take chunks: the burst
//           ends when the bytes do, whichever connections carried them
//
//   cc -O2 -pthread -o idletcp bench/idletcp/idletcp.c
//   ./idletcp CONNS BYTES GAP_MS ROUNDS [MODE]   e.g. ./idletcp 8 1073741824 1000 6 shared
//
// Prints each burst's GB/s and the median.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RING (16u << 20)
#define CHUNK (1u << 20)
static int conns, rounds, gap_ms, shared;
static size_t share, bytes;
static pthread_barrier_t go, done;
// shared mode: the next chunk to send, the bytes read this burst, and the
// signal that they are all in
static atomic_size_t next, got;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t all_in = PTHREAD_COND_INITIALIZER;
static int burst_done;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void die(const char *m) { perror(m); exit(1); }

// put writes n bytes from the ring, wrapping at its end.
static void put(int fd, const char *buf, size_t n, size_t *off) {
  for (size_t left = n; left > 0;) {
    size_t w = left < 4u << 20 ? left : 4u << 20;
    if (*off + w > RING) *off = 0;
    ssize_t k = write(fd, buf + *off, w);
    if (k <= 0) die("write");
    left -= k, *off += k;
  }
}

static void *sender(void *arg) {
  int fd = (int)(long)arg;
  char *buf = malloc(RING);
  size_t off = 0;
  memset(buf, 0x5a, RING);
  for (int r = 0; r < rounds; r++) {
    pthread_barrier_wait(&go);
    if (!shared) {
      put(fd, buf, share, &off);
      continue;
    }
    for (;;) {
      size_t at = atomic_fetch_add(&next, CHUNK);
      if (at >= bytes) break;
      put(fd, buf, bytes - at < CHUNK ? bytes - at : CHUNK, &off);
    }
  }
  return NULL;
}

// shared_receiver reads whatever its connection brings, for every burst,
// and signals when a burst's bytes are all in.
static void *shared_receiver(void *arg) {
  int fd = (int)(long)arg;
  char *buf = malloc(RING);
  for (;;) {
    ssize_t k = recv(fd, buf, RING, 0);
    if (k <= 0) die("recv");
    if (atomic_fetch_add(&got, (size_t)k) + (size_t)k == bytes) {
      pthread_mutex_lock(&mu);
      burst_done = 1;
      pthread_cond_signal(&all_in);
      pthread_mutex_unlock(&mu);
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
  if (argc != 5 && argc != 6) { fprintf(stderr, "usage: idletcp CONNS BYTES GAP_MS ROUNDS [split|shared]\n"); return 2; }
  conns = atoi(argv[1]); bytes = strtoull(argv[2], 0, 10); gap_ms = atoi(argv[3]); rounds = atoi(argv[4]);
  shared = argc == 6 && strcmp(argv[5], "shared") == 0;
  if (conns < 1 || conns > 64 || rounds < 1 || bytes < (size_t)conns ||
      (argc == 6 && !shared && strcmp(argv[5], "split") != 0)) { fprintf(stderr, "idletcp: bad arguments\n"); return 2; }
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
    pthread_create(&th[2 * i + 1], NULL, shared ? shared_receiver : receiver, (void *)(long)s);
  }
  double *gbs = calloc(rounds, sizeof *gbs);
  for (int r = 0; r < rounds; r++) {
    if (gap_ms > 0) usleep(gap_ms * 1000);
    atomic_store(&next, 0);
    atomic_store(&got, 0);
    pthread_mutex_lock(&mu);
    burst_done = 0;
    pthread_mutex_unlock(&mu);
    double t0 = now();
    pthread_barrier_wait(&go);
    if (shared) {
      pthread_mutex_lock(&mu);
      while (!burst_done) pthread_cond_wait(&all_in, &mu);
      pthread_mutex_unlock(&mu);
    } else {
      pthread_barrier_wait(&done);
    }
    double moved = shared ? (double)bytes : (double)share * conns;
    gbs[r] = moved / (now() - t0) / 1e9;
    printf("burst %d: %.2f GB/s\n", r, gbs[r]);
  }
  qsort(gbs, rounds, sizeof *gbs, cmp);
  printf("idletcp %d conns %s, %zu B a burst, %d ms idle before each: median %.2f GB/s (%.2f..%.2f, %d bursts)\n", conns,
         shared ? "shared" : "split", shared ? bytes : share * conns, gap_ms, gbs[rounds / 2], gbs[0], gbs[rounds - 1], rounds);
  return 0;
}
