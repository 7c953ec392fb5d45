//go:build ignore

// (The constraint above keeps the go tool from taking this file for cgo.)

// tcpmodes.c: the C side of bench/tcpmodes (main.go says what is measured
// and why). Loopback TCP with --conns sender/receiver thread pairs, each
// sender cycling over --ring bytes of its own touched mmap'd memory in
// --chunk writes, by --mode:
//   write     blocking write() (writev of head and payload with --head > 0)
//   splice    vmsplice into a pipe, splice into the socket (head by
//             send(MSG_MORE)); the send ring is never written once touched,
//             so sending pages the kernel still holds is harmless here
//   zerocopy  sendmsg(MSG_ZEROCOPY) on an SO_ZEROCOPY socket; completions
//             reaped from the error queue; a ring slot is sent again only
//             once its last send completed; zc_copied counts completions
//             the kernel flagged SO_EE_CODE_ZEROCOPY_COPIED (on loopback it
//             copies when it hands the bytes to the receiving socket)
// Receivers recv(MSG_WAITALL) chunk by chunk into their own ring. CPU per
// side from getrusage(RUSAGE_THREAD) around each thread's loop; the
// process's (RUSAGE_SELF) and the host's (/proc/stat) beside them.
// Same flags and JSON keys as the Go probe:
//   gcc -O2 -pthread -Wall -o tcpmodes tcpmodes.c
//   ./tcpmodes [--conns 8] [--total 4GiB] [--chunk 4MiB] [--ring 16MiB]
//              [--sndbuf 0] [--head 0] [--mode write] [--json]
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <getopt.h>
#if defined(__has_include) && __has_include(<linux/errqueue.h>)
#include <linux/errqueue.h>
#else // no kernel headers: the layout of linux/errqueue.h's struct
struct sock_extended_err {
	uint32_t ee_errno;
	uint8_t ee_origin, ee_type, ee_code, ee_pad;
	uint32_t ee_info, ee_data;
};
#endif
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
#ifndef SO_EE_ORIGIN_ZEROCOPY
#define SO_EE_ORIGIN_ZEROCOPY 5
#endif
#ifndef SO_EE_CODE_ZEROCOPY_COPIED
#define SO_EE_CODE_ZEROCOPY_COPIED 1
#endif

enum { M_WRITE, M_SPLICE, M_ZEROCOPY };
static const char *mode_names[] = {"write", "splice", "zerocopy"};
// What a failed send was doing, by mode.
static const char *mode_calls[] = {
	"write()/writev() of the chunk",
	"send(head, MSG_MORE), vmsplice or splice of the chunk",
	"sendmsg(MSG_ZEROCOPY) or reaping its completions (EPROTO: an entry that is not the next completion; ETIMEDOUT: none within 10 s)"};

static struct {
	int conns, mode, json;
	long long total, chunk, ring, sndbuf, head;
} opt = {8, M_WRITE, 0, 4LL << 30, 4 << 20, 16 << 20, 0, 0};

// One connection: its sockets, rings, splice pipe, zerocopy state, and
// what each side measured.
struct conn {
	int sfd, rfd, pipe[2], pipecap;
	char *sring, *rring, *head;
	uint64_t zc_next, zc_done, *slot_end;
	long long zc_completions, zc_copied;
	long long sent, got;
	double send_cpu, recv_cpu, send_end, recv_end;
	char err[512];
};
static struct conn *conns;
static pthread_barrier_t ready, go;
static pthread_mutex_t abort_mu = PTHREAD_MUTEX_INITIALIZER;
static int aborted;

static void die(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	fputs("tcpmodes: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

static double now(void) {
	struct timespec t;
	if (clock_gettime(CLOCK_MONOTONIC, &t)) die("clock_gettime: %s", strerror(errno));
	return t.tv_sec + t.tv_nsec * 1e-9;
}

// cpu is who's user plus system seconds (getrusage); -1 on failure.
static double cpu(int who) {
	struct rusage ru;
	if (getrusage(who, &ru)) return -1;
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

// host reads /proc/stat's cpu line: busy (user nice system irq softirq)
// and softirq seconds.
static void host(double *busy, double *soft) {
	FILE *f = fopen("/proc/stat", "r");
	if (!f) die("host CPU: open /proc/stat: %s", strerror(errno));
	unsigned long long v[7];
	int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]);
	fclose(f);
	if (n != 7) die("host CPU: /proc/stat does not start with a cpu line of 7 counters");
	long hz = sysconf(_SC_CLK_TCK);
	if (hz <= 0) die("host CPU: sysconf(_SC_CLK_TCK) gave %ld", hz);
	*busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6]) / hz;
	*soft = (double)v[6] / hz;
}

// fail records the first error of c's side and wakes every other thread.
static void *fail(struct conn *c, const char *side, const char *what, long long at) {
	if (!c->err[0]) snprintf(c->err, sizeof c->err, "%s %d: %s at %lld: %s", side, (int)(c - conns), what, at, strerror(errno));
	pthread_mutex_lock(&abort_mu);
	if (!aborted) {
		aborted = 1;
		for (int i = 0; i < opt.conns; i++) {
			shutdown(conns[i].sfd, SHUT_RDWR);
			shutdown(conns[i].rfd, SHUT_RDWR);
		}
	}
	pthread_mutex_unlock(&abort_mu);
	return NULL;
}

// write_all writes iov[0..n) whole with writev, resuming after partial writes.
static int write_all(int fd, struct iovec *iov, int n) {
	while (n > 0) {
		ssize_t k = writev(fd, iov, n);
		if (k < 0 && errno == EINTR) continue;
		if (k <= 0) return -1;
		while (n > 0 && (size_t)k >= iov->iov_len) { k -= iov->iov_len; iov++; n--; }
		if (n > 0) { iov->iov_base = (char *)iov->iov_base + k; iov->iov_len -= k; }
	}
	return 0;
}

// send_splice sends head with MSG_MORE, then p by vmsplice+splice.
static int send_splice(struct conn *c, char *p, size_t n) {
	for (size_t off = 0; off < (size_t)opt.head;) {
		ssize_t k = send(c->sfd, c->head + off, opt.head - off, MSG_MORE | MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR) continue;
		if (k <= 0) return -1;
		off += k;
	}
	for (size_t off = 0; off < n;) {
		struct iovec iov = {p + off, n - off < (size_t)c->pipecap ? n - off : (size_t)c->pipecap};
		ssize_t k = vmsplice(c->pipe[1], &iov, 1, SPLICE_F_NONBLOCK);
		if (k < 0 && errno == EINTR) continue;
		if (k <= 0) return -1;
		for (ssize_t left = k; left > 0;) {
			unsigned fl = SPLICE_F_MOVE | (off + k < n ? SPLICE_F_MORE : 0);
			ssize_t m = splice(c->pipe[0], NULL, c->sfd, NULL, left, fl);
			if (m < 0 && errno == EINTR) continue;
			if (m <= 0) return -1;
			left -= m;
		}
		off += k;
	}
	return 0;
}

// zc_reap reads zerocopy completions off the error queue; with block it
// first waits (10 s at most) for one. -1 with errno set on failure.
static int zc_reap(struct conn *c, int block) {
	for (;;) {
		union {
			char buf[CMSG_SPACE(sizeof(struct sock_extended_err)) + 64];
			struct cmsghdr align;
		} ctl;
		struct msghdr m = {0};
		m.msg_control = ctl.buf;
		m.msg_controllen = sizeof ctl.buf;
		if (recvmsg(c->sfd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) {
			if (errno == EINTR) continue;
			if (errno != EAGAIN || !block) return errno == EAGAIN ? 0 : -1;
			struct pollfd pf = {c->sfd, 0, 0};
			int r = poll(&pf, 1, 10000);
			if (r < 0 && errno == EINTR) continue;
			if (r < 0) return -1;
			if (r == 0) { errno = ETIMEDOUT; return -1; }
			continue;
		}
		for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
			if (!((h->cmsg_level == SOL_IP && h->cmsg_type == IP_RECVERR) ||
			      (h->cmsg_level == SOL_IPV6 && h->cmsg_type == IPV6_RECVERR)))
				continue;
			struct sock_extended_err ee;
			memcpy(&ee, CMSG_DATA(h), sizeof ee);
			if (ee.ee_origin != SO_EE_ORIGIN_ZEROCOPY || ee.ee_errno != 0 ||
			    ee.ee_info != (uint32_t)c->zc_done || ee.ee_data < ee.ee_info) {
				errno = EPROTO; // not the next zerocopy completion
				return -1;
			}
			uint64_t k = (uint64_t)(ee.ee_data - ee.ee_info) + 1;
			c->zc_done += k;
			c->zc_completions += k;
			if (ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED) c->zc_copied += k;
		}
		block = 0;
	}
}

static int zc_wait(struct conn *c, uint64_t id) {
	while (c->zc_done < id)
		if (zc_reap(c, 1)) return -1;
	return 0;
}

// send_zc sends head and p with sendmsg(MSG_ZEROCOPY) once slot's last
// send completed.
static int send_zc(struct conn *c, int slot, char *p, size_t n) {
	if (zc_wait(c, c->slot_end[slot])) return -1;
	struct iovec iov[2] = {{c->head, opt.head}, {p, n}}, *v = iov + (opt.head ? 0 : 1);
	int cnt = opt.head ? 2 : 1;
	while (cnt > 0) {
		struct msghdr m = {0};
		m.msg_iov = v;
		m.msg_iovlen = cnt;
		ssize_t k = sendmsg(c->sfd, &m, MSG_ZEROCOPY | MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR) continue;
		if (k < 0 && errno == ENOBUFS && c->zc_next > c->zc_done) {
			if (zc_wait(c, c->zc_done + 1)) return -1;
			continue;
		}
		if (k <= 0) return -1;
		c->zc_next++;
		while (cnt > 0 && (size_t)k >= v->iov_len) { k -= v->iov_len; v++; cnt--; }
		if (cnt > 0) { v->iov_base = (char *)v->iov_base + k; v->iov_len -= k; }
		if (zc_reap(c, 0)) return -1;
	}
	c->slot_end[slot] = c->zc_next;
	return 0;
}

static void *sender(void *arg) {
	struct conn *c = arg;
	pthread_barrier_wait(&ready);
	pthread_barrier_wait(&go);
	double c0 = cpu(RUSAGE_THREAD);
	if (c0 < 0) return fail(c, "sender", "getrusage(RUSAGE_THREAD)", 0);
	long long slots = opt.ring / opt.chunk;
	for (long long k = 0; c->sent < opt.total; k++) {
		size_t n = opt.total - c->sent < opt.chunk ? opt.total - c->sent : opt.chunk;
		int slot = k % slots;
		char *p = c->sring + slot * opt.chunk;
		int rc;
		if (opt.mode == M_SPLICE) rc = send_splice(c, p, n);
		else if (opt.mode == M_ZEROCOPY) rc = send_zc(c, slot, p, n);
		else {
			struct iovec iov[2] = {{c->head, opt.head}, {p, n}};
			rc = opt.head ? write_all(c->sfd, iov, 2) : write_all(c->sfd, iov + 1, 1);
		}
		if (rc) return fail(c, "sender", mode_calls[opt.mode], c->sent);
		c->sent += n;
	}
	if (opt.mode == M_ZEROCOPY && zc_wait(c, c->zc_next)) return fail(c, "sender", "last zerocopy completions", c->sent);
	c->send_end = now();
	c->send_cpu = cpu(RUSAGE_THREAD) - c0;
	return NULL;
}

// read_full fills p with recv(MSG_WAITALL).
static int read_full(int fd, char *p, size_t n) {
	while (n > 0) {
		ssize_t k = recv(fd, p, n, MSG_WAITALL);
		if (k < 0 && errno == EINTR) continue;
		if (k == 0) errno = EPIPE; // the peer closed early
		if (k <= 0) return -1;
		p += k;
		n -= k;
	}
	return 0;
}

static void *receiver(void *arg) {
	struct conn *c = arg;
	char *head = malloc(opt.head + 1);
	if (!head) return fail(c, "receiver", "malloc head", 0);
	pthread_barrier_wait(&ready);
	pthread_barrier_wait(&go);
	double c0 = cpu(RUSAGE_THREAD);
	if (c0 < 0) { free(head); return fail(c, "receiver", "getrusage(RUSAGE_THREAD)", 0); }
	long long slots = opt.ring / opt.chunk;
	for (long long k = 0; c->got < opt.total; k++) {
		size_t n = opt.total - c->got < opt.chunk ? opt.total - c->got : opt.chunk;
		if (read_full(c->rfd, head, opt.head)) { free(head); return fail(c, "receiver", "read head", c->got); }
		if (read_full(c->rfd, c->rring + (k % slots) * opt.chunk, n)) { free(head); return fail(c, "receiver", "recv(MSG_WAITALL)", c->got); }
		c->got += n;
	}
	c->recv_end = now();
	c->recv_cpu = cpu(RUSAGE_THREAD) - c0;
	free(head);
	return NULL;
}

// parse_size reads "4MiB", "64K", "1048576" (binary units, B optional).
static long long parse_size(const char *flag, const char *s) {
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno || end == s || v < 0) die("--%s %s: want a number of bytes, optionally with B, KiB, MiB or GiB", flag, s);
	long long mult = 1;
	if (!strcmp(end, "GiB") || !strcmp(end, "G")) mult = 1LL << 30;
	else if (!strcmp(end, "MiB") || !strcmp(end, "M")) mult = 1LL << 20;
	else if (!strcmp(end, "KiB") || !strcmp(end, "K")) mult = 1LL << 10;
	else if (strcmp(end, "B") && *end) die("--%s %s: unknown unit %s", flag, s, end);
	if (v > (1LL << 62) / mult) die("--%s %s is too large", flag, s);
	return v * mult;
}

static void parse(int argc, char **argv) {
	static struct option o[] = {
		{"conns", 1, 0, 'c'}, {"total", 1, 0, 't'}, {"chunk", 1, 0, 'k'}, {"ring", 1, 0, 'r'},
		{"sndbuf", 1, 0, 'b'}, {"head", 1, 0, 'h'}, {"mode", 1, 0, 'm'}, {"json", 0, 0, 'j'}, {0, 0, 0, 0}};
	for (int ch; (ch = getopt_long(argc, argv, "", o, NULL)) != -1;) {
		switch (ch) {
		case 'c': opt.conns = (int)parse_size("conns", optarg); break;
		case 't': opt.total = parse_size("total", optarg); break;
		case 'k': opt.chunk = parse_size("chunk", optarg); break;
		case 'r': opt.ring = parse_size("ring", optarg); break;
		case 'b': opt.sndbuf = parse_size("sndbuf", optarg); break;
		case 'h': opt.head = parse_size("head", optarg); break;
		case 'j': opt.json = 1; break;
		case 'm':
			opt.mode = -1;
			for (int i = 0; i < 3; i++)
				if (!strcmp(optarg, mode_names[i])) opt.mode = i;
			if (opt.mode < 0) die("--mode %s: want one of write, splice, zerocopy", optarg);
			break;
		default: die("flags: --conns --total --chunk --ring --sndbuf --head --mode --json");
		}
	}
	if (optind < argc) die("unexpected argument %s", argv[optind]);
	if (opt.conns < 1 || opt.conns > 256) die("--conns %d: want 1..256", opt.conns);
	if (opt.chunk < 1 || opt.chunk > 1LL << 30) die("--chunk %lld: want 1 B..1GiB", opt.chunk);
	if (opt.total < 1 || opt.total > 1LL << 50) die("--total %lld: want 1 B..1PiB", opt.total);
	if (opt.ring < opt.chunk || opt.ring % opt.chunk || opt.ring > 1LL << 36)
		die("--ring %lld must be a whole number (>= 1) of --chunk %lld, at most 64GiB", opt.ring, opt.chunk);
	if (opt.sndbuf > 1LL << 30) die("--sndbuf %lld: want 0..1GiB", opt.sndbuf);
	if (opt.head > 1 << 20) die("--head %lld: want 0..1MiB", opt.head);
}

static void setint(int fd, int level, int name, int v, const char *what, int i) {
	if (setsockopt(fd, level, name, &v, sizeof v)) die("connection %d: setsockopt %s %d: %s", i, what, v, strerror(errno));
}

// touched maps n bytes and writes every one of them.
static char *touched(size_t n, int fill) {
	char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) die("mmap %zu B ring: %s", n, strerror(errno));
	for (size_t i = 0; i < n; i++) p[i] = (char)(fill + i);
	return p;
}

// pipe_max is /proc/sys/fs/pipe-max-size, or 1 MiB when unreadable.
static int pipe_max(void) {
	int v = 0;
	FILE *f = fopen("/proc/sys/fs/pipe-max-size", "r");
	if (f) {
		if (fscanf(f, "%d", &v) != 1) v = 0;
		fclose(f);
	}
	return v > 0 ? v : 1 << 20;
}

// setup connects conn i over the listener l and prepares its mode.
static void setup(int l, struct sockaddr_in *addr, int i) {
	struct conn *c = &conns[i];
	c->sfd = socket(AF_INET, SOCK_STREAM, 0);
	if (c->sfd < 0) die("connection %d: socket: %s", i, strerror(errno));
	if (connect(c->sfd, (struct sockaddr *)addr, sizeof *addr)) die("connection %d: connect: %s", i, strerror(errno));
	c->rfd = accept(l, NULL, NULL);
	if (c->rfd < 0) die("connection %d: accept: %s", i, strerror(errno));
	int fds[2] = {c->sfd, c->rfd};
	for (int j = 0; j < 2; j++) {
		setint(fds[j], IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY", i);
		if (opt.sndbuf) {
			setint(fds[j], SOL_SOCKET, SO_SNDBUF, (int)opt.sndbuf, "SO_SNDBUF", i);
			setint(fds[j], SOL_SOCKET, SO_RCVBUF, (int)opt.sndbuf, "SO_RCVBUF", i);
		}
	}
	c->sring = touched(opt.ring, 2 * i);
	c->rring = touched(opt.ring, 2 * i + 1);
	c->head = calloc(1, opt.head + 1);
	c->slot_end = calloc(opt.ring / opt.chunk, sizeof *c->slot_end);
	if (!c->head || !c->slot_end) die("connection %d: calloc: %s", i, strerror(errno));
	c->pipe[0] = c->pipe[1] = -1;
	if (opt.mode == M_ZEROCOPY) setint(c->sfd, SOL_SOCKET, SO_ZEROCOPY, 1, "SO_ZEROCOPY (this kernel or socket refuses zerocopy sends)", i);
	if (opt.mode == M_SPLICE) {
		if (pipe2(c->pipe, O_CLOEXEC)) die("connection %d: pipe2: %s", i, strerror(errno));
		long long want = opt.chunk < 65536 ? 65536 : opt.chunk;
		if (want > pipe_max()) want = pipe_max();
		(void)fcntl(c->pipe[1], F_SETPIPE_SZ, (int)want); // a smaller pipe only costs rounds
		c->pipecap = fcntl(c->pipe[1], F_GETPIPE_SZ);
		if (c->pipecap <= 0) die("connection %d: F_GETPIPE_SZ: %s", i, strerror(errno));
	}
}

static const char *size(long long n, char *buf) {
	if (!n) return "0";
	const char *u[] = {"GiB", "MiB", "KiB"};
	for (int i = 0; i < 3; i++) {
		long long m = 1LL << (30 - 10 * i);
		if (n % m == 0) { sprintf(buf, "%lld%s", n / m, u[i]); return buf; }
	}
	sprintf(buf, "%lldB", n);
	return buf;
}

int main(int argc, char **argv) {
	parse(argc, argv);
	int l = socket(AF_INET, SOCK_STREAM, 0);
	if (l < 0) die("listen socket: %s", strerror(errno));
	struct sockaddr_in a = {0};
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t al = sizeof a;
	if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 256) || getsockname(l, (struct sockaddr *)&a, &al))
		die("listen on loopback: %s", strerror(errno));
	conns = calloc(opt.conns, sizeof *conns);
	pthread_t *th = calloc(2 * opt.conns, sizeof *th);
	if (!conns || !th) die("calloc: %s", strerror(errno));
	for (int i = 0; i < opt.conns; i++) setup(l, &a, i);
	close(l);
	int e;
	if ((e = pthread_barrier_init(&ready, NULL, 2 * opt.conns + 1)) || (e = pthread_barrier_init(&go, NULL, 2 * opt.conns + 1)))
		die("pthread_barrier_init: %s", strerror(e));
	for (int i = 0; i < opt.conns; i++)
		if ((e = pthread_create(&th[2 * i], NULL, sender, &conns[i])) || (e = pthread_create(&th[2 * i + 1], NULL, receiver, &conns[i])))
			die("pthread_create: %s", strerror(e));
	pthread_barrier_wait(&ready);
	double p0 = cpu(RUSAGE_SELF), h0, s0, h1, s1;
	host(&h0, &s0);
	double t0 = now();
	pthread_barrier_wait(&go);
	for (int i = 0; i < 2 * opt.conns; i++)
		if ((e = pthread_join(th[i], NULL))) die("pthread_join: %s", strerror(e));
	double p1 = cpu(RUSAGE_SELF);
	host(&h1, &s1);
	if (p0 < 0 || p1 < 0) die("getrusage(RUSAGE_SELF): %s", strerror(errno));
	long long sent = 0, got = 0, zcs = 0, zcc = 0;
	double scpu = 0, rcpu = 0, end = t0;
	int bad = 0;
	for (int i = 0; i < opt.conns; i++) {
		struct conn *c = &conns[i];
		if (c->err[0]) { fprintf(stderr, "tcpmodes: %s\n", c->err); bad = 1; }
		if (c->send_cpu < 0 || c->recv_cpu < 0) { fprintf(stderr, "tcpmodes: connection %d: getrusage(RUSAGE_THREAD) failed\n", i); bad = 1; }
		sent += c->sent; got += c->got; zcs += c->zc_completions; zcc += c->zc_copied;
		scpu += c->send_cpu; rcpu += c->recv_cpu;
		if (c->send_end > end) end = c->send_end;
		if (c->recv_end > end) end = c->recv_end;
	}
	if (!bad && (sent != got || sent != opt.total * opt.conns)) {
		fprintf(stderr, "tcpmodes: sent %lld B, received %lld B, want %lld B\n", sent, got, opt.total * opt.conns);
		bad = 1;
	}
	if (bad) return 1;
	double secs = end - t0, gb = got / 1e9, pc = p1 - p0, hc = h1 - h0, sc = s1 - s0;
	double percore = scpu + rcpu > 0 ? gb / (scpu + rcpu) : -1;
	const char *m = mode_names[opt.mode];
	if (opt.json) {
		printf("{\"impl\":\"c\",\"mode\":\"%s\",\"conns\":%d,\"total\":%lld,\"chunk\":%lld,\"ring\":%lld,\"sndbuf\":%lld,\"head\":%lld,\"locked\":true,\"spin_us\":0,"
		       "\"sent\":%lld,\"received\":%lld,\"seconds\":%.9f,\"gbps\":%.6f,\"send_cpu_s\":%.6f,\"recv_cpu_s\":%.6f,"
		       "\"proc_cpu_s\":%.6f,\"host_cpu_s\":%.6f,\"host_softirq_s\":%.6f,\"send_cpu_s_per_gb\":%.6f,\"recv_cpu_s_per_gb\":%.6f,"
		       "\"proc_cpu_s_per_gb\":%.6f,\"host_cpu_s_per_gb\":%.6f,\"gbps_per_core\":%.6f,\"zc_sends\":%lld,\"zc_copied\":%lld}\n",
		       m, opt.conns, opt.total, opt.chunk, opt.ring, opt.sndbuf, opt.head, sent, got, secs, gb / secs, scpu, rcpu,
		       pc, hc, sc, scpu / gb, rcpu / gb, pc / gb, hc / gb, percore, zcs, zcc);
		return 0;
	}
	char b1[32], b2[32], b3[32];
	printf("%-2s %-8s conns %d chunk %s ring %s sndbuf %s head %lld: %.2f GB in %.3f s = %6.2f GB/s",
	       "c", m, opt.conns, size(opt.chunk, b1), size(opt.ring, b2), size(opt.sndbuf, b3), opt.head, gb, secs, gb / secs);
	printf("; cpu s/GB send %.4f recv %.4f proc %.4f host %.4f (softirq %.2f s); %.2f GB/s per busy core",
	       scpu / gb, rcpu / gb, pc / gb, hc / gb, sc, percore);
	if (opt.mode == M_ZEROCOPY) printf("; zerocopy completions %lld, copied %lld", zcs, zcc);
	printf("\n");
	return 0;
}
