// peercopy: where a 4 GiB GPU0 -> GPU1 copy stands against the ceiling
// probe's peer copy (shared/bench/gpuprobe.cu: 512 MiB x 10 on one stream,
// timed by events), for issue 37's same-node ipc row. Each case times
// cudaMemcpyAsync + cudaStreamSynchronize by the host clock, as the
// sidecar's copy is timed, 10 times, and prints the median:
//
//   A  8 x 512 MiB peer copies, event timed (the ceiling probe's way)
//   B  one 4 GiB copy, back to back (B2: a fresh stream each, as stage's
//      copyDirect makes)
//   C  after 300 ms idle (the GPUs' clocks lapse)
//   D  the bench's --verify: poison the destination (pageable H2D), copy,
//      read back and compare (D2: poison only)
//   E  pulled: the copy on GPU1's stream
//   F  half pushed by GPU0, half pulled by GPU1, at once
//   G  4 x 1 GiB on one stream
//   H  a copy kernel on GPU0 (its SMs read and write through NVLink)
//      instead of the copy engine
//   I  between VMM allocations (cuMemCreate, mapped and made accessible
//      to both GPUs), as a same-node push copies registered VMM regions
//   J  between memory another process allocated (cudaMalloc) and shared
//      by legacy IPC handles, opened here with lazy peer access: the
//      stagectl bench's memory as a sidecar imports it
//   K  the same with VMM allocations shared as POSIX fds, imported and
//      made accessible to GPU0 only, as the sidecar imports them
//   J2 J after 300 ms idle each, on a fresh stream: a checked same-node
//      push's copy as the sidecar makes it
//   L  after 300 ms idle, a 1 MiB copy on another stream and 200 us of
//      spinning before the timed copy: does waking the link first (while a
//      push's handles travel) take back the idle GPUs' extra time?
//   M  the same with the 1 MiB copies local instead (scratch to scratch on
//      GPU0 and on GPU1; M0: GPU0 only; M1: GPU1 only): can each sidecar
//      wake its own GPU without touching the peer's memory?
//
// "./peercopy cross" runs J, J2 and K alone, as a sidecar meets them: no
// peer access enabled beforehand (the legacy handles enable it lazily),
// the driver API's cuMemcpyDtoDAsync on a fresh non-blocking stream and
// cuStreamSynchronize, and prints, beside enqueue-to-end, the wait alone
// (stage's copy_wait) and the copy's own time by timing events.
//
// J and K run this program again as a child ("peercopy child", on fd 3
// a socket to this process) that allocates, hands the handles over, and
// waits until this process closes the socket.
//
// Build and run on a machine with two peer-capable GPUs:
//   nvcc -O2 -o peercopy bench/peercopy/peercopy.cu -lcuda && ./peercopy
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <thread>
#include <initializer_list>
#include <vector>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
#define CU(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { const char* m; cuGetErrorString(e, &m); printf("%s: %s\n", #x, m); exit(1);} } while (0)
using clk = std::chrono::steady_clock;
// copy16 copies n 16-byte words, grid-stride.
__global__ void copy16(const int4* __restrict__ s, int4* __restrict__ d, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) d[i] = s[i];
}
// vmmCreate allocates size bytes of device dev's memory, exportable as a
// POSIX fd.
static CUmemGenericAllocationHandle vmmCreate(int dev, size_t size) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h;
  CU(cuMemCreate(&h, size, &prop, 0));
  return h;
}
// vmmMap maps allocation h (size bytes) and makes it readable and
// writable by the devices in devs.
static void* vmmMap(CUmemGenericAllocationHandle h, size_t size, std::initializer_list<int> devs) {
  CUdeviceptr p;
  CU(cuMemAddressReserve(&p, size, 0, 0, 0));
  CU(cuMemMap(p, size, 0, h, 0));
  std::vector<CUmemAccessDesc> acc(devs.size());
  size_t i = 0;
  for (int d : devs) {
    acc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[i].location.id = d;
    acc[i++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CU(cuMemSetAccess(p, size, acc.data(), acc.size()));
  return (void*)p;
}
// vmm maps size bytes of device dev's memory, accessible to devices 0 and 1.
static void* vmm(int dev, size_t size) { return vmmMap(vmmCreate(dev, size), size, {0, 1}); }
static double ms(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }
static const size_t G4 = 4ull << 30;
static void report(const char* name, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  double med = v[v.size() / 2];
  printf("%-44s median %8.3f ms (%.3f..%.3f) = %7.2f GB/s\n", name, med, v.front(), v.back(), G4 / med / 1e6);
}
// vmmfd allocates size bytes on dev, maps them for dev (into *mapped) and
// exports them as a POSIX fd.
static int vmmfd(int dev, size_t size, void** mapped) {
  CUmemGenericAllocationHandle h = vmmCreate(dev, size);
  *mapped = vmmMap(h, size, {dev});
  int fd = -1;
  CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  return fd;
}

// freshCopy times one copy of n bytes on a new stream, from its enqueue to
// the end of its wait, as the sidecar's direct copy runs.
static double freshCopy(void* d, const void* s, size_t n) {
  cudaStream_t f;
  CK(cudaStreamCreateWithFlags(&f, cudaStreamNonBlocking));
  auto t0 = clk::now();
  CK(cudaMemcpyAsync(d, s, n, cudaMemcpyDefault, f));
  CK(cudaStreamSynchronize(f));
  double t = ms(t0, clk::now());
  CK(cudaStreamDestroy(f));
  return t;
}

// sidecarCopy is freshCopy the way the sidecar's copyDirect runs it, with
// the driver API; wait is the time after the enqueue returned, gpu the
// copy's time between two timing events around it.
struct ctimes { double all, wait, gpu; };
static ctimes sidecarCopy(void* d, const void* s, size_t n) {
  CUstream f; CUevent a, b;
  CU(cuStreamCreate(&f, CU_STREAM_NON_BLOCKING));
  CU(cuEventCreate(&a, CU_EVENT_DEFAULT)); CU(cuEventCreate(&b, CU_EVENT_DEFAULT));
  auto t0 = clk::now();
  CU(cuEventRecord(a, f));
  CU(cuMemcpyDtoDAsync((CUdeviceptr)d, (CUdeviceptr)s, n, f));
  CU(cuEventRecord(b, f));
  auto t1 = clk::now();
  CU(cuStreamSynchronize(f));
  auto t2 = clk::now();
  float g = 0; CU(cuEventElapsedTime(&g, a, b));
  CU(cuEventDestroy(a)); CU(cuEventDestroy(b)); CU(cuStreamDestroy(f));
  return {ms(t0, t2), ms(t1, t2), g};
}
static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
static void reportTimes(const char* name, const std::vector<ctimes>& ts) {
  std::vector<double> all, wait, gpu;
  for (auto& t : ts) { all.push_back(t.all); wait.push_back(t.wait); gpu.push_back(t.gpu); }
  printf("%-44s median %8.3f ms = %7.2f GB/s; wait alone %8.3f ms; GPU events %8.3f ms\n", name, median(all), G4 / median(all) / 1e6, median(wait), median(gpu));
}

// handover is what the child sends: two legacy IPC handles (source on
// GPU0, destination on GPU1); the two VMM fds ride along as SCM_RIGHTS.
struct handover { cudaIpcMemHandle_t src, dst; };

// fdMsg is a message of one handover and room for two fds (ctl).
struct fdMsg {
  handover m;
  char ctl[CMSG_SPACE(2 * sizeof(int))] = {};
  iovec iov = {&m, sizeof m};
  msghdr mh = {};
  fdMsg() { mh.msg_iov = &iov; mh.msg_iovlen = 1; mh.msg_control = ctl; mh.msg_controllen = sizeof ctl; }
  fdMsg(const fdMsg&) = delete;
};

// child allocates the source (GPU0, filled) and destination (GPU1) twice,
// by cudaMalloc and by VMM, sends them over fd 3 and waits for EOF there.
static int child() {
  fdMsg x;
  void *s, *d, *vs, *vd;
  CK(cudaSetDevice(0)); CK(cudaMalloc(&s, G4)); CK(cudaMemset(s, 0x5a, G4)); CK(cudaIpcGetMemHandle(&x.m.src, s));
  int fs = vmmfd(0, G4, &vs); CK(cudaMemset(vs, 0x5a, G4));
  CK(cudaSetDevice(1)); CK(cudaMalloc(&d, G4)); CK(cudaIpcGetMemHandle(&x.m.dst, d));
  int fdd = vmmfd(1, G4, &vd);
  CK(cudaDeviceSynchronize()); CK(cudaSetDevice(0)); CK(cudaDeviceSynchronize());
  cmsghdr* c = CMSG_FIRSTHDR(&x.mh);
  c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS; c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  int fds[2] = {fs, fdd};
  memcpy(CMSG_DATA(c), fds, sizeof fds);
  if (sendmsg(3, &x.mh, 0) != (ssize_t)sizeof x.m) { perror("child: sendmsg"); return 1; }
  char b;
  while (read(3, &b, 1) > 0) {}
  return 0;
}

// importfd maps a VMM fd of size bytes, accessible to GPU0 only.
static void* importfd(int fd, size_t size) {
  CUmemGenericAllocationHandle h;
  CU(cuMemImportFromShareableHandle(&h, (void*)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  return vmmMap(h, size, {0});
}

// crossProcess runs cases J and K against a child of this program.
static void crossProcess(const char* self, bool sidecarLike) {
  int sv[2];
  // Close-on-exec, so that the child holds only its own end and sees EOF
  // when this process closes its end.
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) { perror("socketpair"); return; }
  pid_t pid = fork();
  if (pid == 0) {
    if (sv[1] == 3) fcntl(3, F_SETFD, 0); // dup2 onto itself keeps the flag
    else dup2(sv[1], 3);                  // the copy on 3 does not
    execl(self, self, "child", (char*)nullptr);
    perror("exec child");
    _exit(127);
  }
  close(sv[1]);
  fdMsg x;
  cmsghdr* c = nullptr;
  if (recvmsg(sv[0], &x.mh, MSG_WAITALL) != (ssize_t)sizeof x.m || !(c = CMSG_FIRSTHDR(&x.mh)) || c->cmsg_type != SCM_RIGHTS) {
    printf("J/K: no handles from the child\n");
    close(sv[0]); waitpid(pid, nullptr, 0);
    return;
  }
  int fds[2];
  memcpy(fds, CMSG_DATA(c), sizeof fds);
  // 10 copies each after one untimed (the first use of a mapping).
  auto series = [sidecarLike](const char* name, void* d, void* sr, int idleMs = 0) {
    if (sidecarLike) {
      std::vector<ctimes> v;
      sidecarCopy(d, sr, G4);
      for (int r = 0; r < 10; r++) { if (idleMs) std::this_thread::sleep_for(std::chrono::milliseconds(idleMs)); v.push_back(sidecarCopy(d, sr, G4)); }
      reportTimes(name, v);
      return;
    }
    std::vector<double> v;
    freshCopy(d, sr, G4);
    for (int r = 0; r < 10; r++) { if (idleMs) std::this_thread::sleep_for(std::chrono::milliseconds(idleMs)); v.push_back(freshCopy(d, sr, G4)); }
    report(name, v);
  };
  CK(cudaSetDevice(0));
  void *is, *id;
  CK(cudaIpcOpenMemHandle(&is, x.m.src, cudaIpcMemLazyEnablePeerAccess));
  CK(cudaIpcOpenMemHandle(&id, x.m.dst, cudaIpcMemLazyEnablePeerAccess));
  series("J another process's cudaMalloc, legacy IPC", id, is);
  series("J2 J after 300 ms idle, fresh stream", id, is, 300);
  series("K another process's VMM, fds, GPU0 access", importfd(fds[1], G4), importfd(fds[0], G4));
  CK(cudaIpcCloseMemHandle(is)); CK(cudaIpcCloseMemHandle(id));
  close(sv[0]);
  waitpid(pid, nullptr, 0);
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "child") == 0) return child();
  if (argc > 1 && strcmp(argv[1], "cross") == 0) { CK(cudaSetDevice(0)); CK(cudaFree(0)); crossProcess(argv[0], true); return 0; }
  void *src, *dst, *dst0;
  CK(cudaSetDevice(1)); CK(cudaMalloc(&dst, G4));
  CK(cudaSetDevice(0)); CK(cudaMalloc(&src, G4)); CK(cudaMalloc(&dst0, 64 << 20));
  CK(cudaDeviceEnablePeerAccess(1, 0));
  CK(cudaSetDevice(1)); CK(cudaDeviceEnablePeerAccess(0, 0)); CK(cudaSetDevice(0));
  CK(cudaMemset(src, 0x5a, G4));
  cudaStream_t s, s1; CK(cudaStreamCreate(&s)); CK(cudaSetDevice(1)); CK(cudaStreamCreate(&s1)); CK(cudaSetDevice(0));
  char* host = (char*)malloc(8 << 20); memset(host, 0xab, 8 << 20);
  char* back = (char*)malloc(G4);
  const int R = 10;
  for (int w = 0; w < 3; w++) { CK(cudaMemcpyAsync(dst, src, G4, cudaMemcpyDefault, s)); CK(cudaStreamSynchronize(s)); }
  { // the ceiling probe's way: 512 MiB x 8, event timed
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b); std::vector<double> v;
    for (int r = 0; r < R; r++) {
      cudaEventRecord(a, s);
      for (int i = 0; i < 8; i++) cudaMemcpyPeerAsync((char*)dst + (size_t)i * (512 << 20), 1, (char*)src + (size_t)i * (512 << 20), 0, 512 << 20, s);
      cudaEventRecord(b, s); cudaEventSynchronize(b); float t; cudaEventElapsedTime(&t, a, b); v.push_back(t);
    }
    report("A 8 x 512MiB peer, events", v);
  }
  auto one = [&](cudaStream_t st, void* d, const void* sr, size_t n) { auto t0 = clk::now(); CK(cudaMemcpyAsync(d, sr, n, cudaMemcpyDefault, st)); CK(cudaStreamSynchronize(st)); return ms(t0, clk::now()); };
  { std::vector<double> v; for (int r = 0; r < R; r++) v.push_back(one(s, dst, src, G4)); report("B one 4GiB copy, wall, back to back", v); }
  { std::vector<double> v; for (int r = 0; r < R; r++) v.push_back(freshCopy(dst, src, G4)); report("B2 fresh stream each", v); }
  { std::vector<double> v; for (int r = 0; r < R; r++) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); v.push_back(one(s, dst, src, G4)); } report("C after 300 ms idle", v); }
  { std::vector<double> v; for (int r = 0; r < R; r++) {
      CK(cudaSetDevice(1)); for (size_t o = 0; o < G4; o += 8 << 20) CK(cudaMemcpy((char*)dst + o, host, 8 << 20, cudaMemcpyHostToDevice)); CK(cudaSetDevice(0));
      v.push_back(one(s, dst, src, G4));
      CK(cudaMemcpy(back, dst, G4, cudaMemcpyDeviceToHost)); if (memcmp(back, back + (G4 >> 1), 4096)) printf("mismatch?\n");
      for (size_t o = 0; o < G4; o += 4096) if (back[o] != 0x5a) { printf("bad at %zu\n", o); break; }
    } report("D checked: poison H2D pageable, copy, D2H+compare", v); }
  { std::vector<double> v; for (int r = 0; r < R; r++) {
      CK(cudaSetDevice(1)); for (size_t o = 0; o < G4; o += 8 << 20) CK(cudaMemcpy((char*)dst + o, host, 8 << 20, cudaMemcpyHostToDevice)); CK(cudaSetDevice(0));
      v.push_back(one(s, dst, src, G4)); } report("D2 poison only, then copy", v); }
  { std::vector<double> v; for (int r = 0; r < R; r++) { CK(cudaSetDevice(1)); v.push_back(one(s1, dst, src, G4)); CK(cudaSetDevice(0)); } report("E pulled by GPU1's stream", v); }
  { std::vector<double> v; for (int r = 0; r < R; r++) { auto t0 = clk::now();
      CK(cudaMemcpyAsync(dst, src, G4 / 2, cudaMemcpyDefault, s)); CK(cudaSetDevice(1)); CK(cudaMemcpyAsync((char*)dst + G4 / 2, (char*)src + G4 / 2, G4 / 2, cudaMemcpyDefault, s1));
      CK(cudaStreamSynchronize(s1)); CK(cudaSetDevice(0)); CK(cudaStreamSynchronize(s)); v.push_back(ms(t0, clk::now())); } report("F half pushed by GPU0, half pulled by GPU1", v); }
  { std::vector<double> v; for (int r = 0; r < R; r++) { auto t0 = clk::now();
      for (int i = 0; i < 4; i++) CK(cudaMemcpyAsync((char*)dst + (size_t)i * (1ull << 30), (char*)src + (size_t)i * (1ull << 30), 1ull << 30, cudaMemcpyDefault, s));
      CK(cudaStreamSynchronize(s)); v.push_back(ms(t0, clk::now())); } report("G 4 x 1GiB on one stream", v); }
  { int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0)); std::vector<double> v;
    for (int r = 0; r < R; r++) { auto t0 = clk::now(); copy16<<<sms * 4, 512, 0, s>>>((const int4*)src, (int4*)dst, G4 / 16);
      CK(cudaGetLastError()); CK(cudaStreamSynchronize(s)); v.push_back(ms(t0, clk::now())); }
    report("H copy kernel on GPU0 (SMs), not the engine", v); }
  { void* vs = vmm(0, G4); void* vd = vmm(1, G4); CK(cudaMemset(vs, 0x5a, G4)); std::vector<double> v;
    for (int r = 0; r < R; r++) v.push_back(one(s, vd, vs, G4));
    report("I VMM allocations (cuMemCreate), engine", v); }
  { cudaStream_t w; CK(cudaStreamCreateWithFlags(&w, cudaStreamNonBlocking)); std::vector<double> v;
    for (int r = 0; r < R; r++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      CK(cudaMemcpyAsync((char*)dst + G4 - (1 << 20), src, 1 << 20, cudaMemcpyDefault, w));
      auto t0 = clk::now(); while (ms(t0, clk::now()) < 0.2) {}
      CK(cudaStreamSynchronize(w));
      v.push_back(one(s, dst, src, G4));
    }
    CK(cudaStreamDestroy(w)); report("L after idle, a 1 MiB copy 200 us before", v); }
  { // M: local wake-ups only; scratch of 2 MiB on each GPU
    void *a0, *a1; CK(cudaMalloc(&a0, 2 << 20)); CK(cudaSetDevice(1)); CK(cudaMalloc(&a1, 2 << 20)); CK(cudaSetDevice(0));
    cudaStream_t w0, w1; CK(cudaStreamCreateWithFlags(&w0, cudaStreamNonBlocking));
    CK(cudaSetDevice(1)); CK(cudaStreamCreateWithFlags(&w1, cudaStreamNonBlocking)); CK(cudaSetDevice(0));
    struct { const char* name; bool g0, g1; } ms3[] = {{"M local 1 MiB on GPU0 and GPU1 200 us before", true, true},
                                                      {"M0 local 1 MiB on GPU0 200 us before", true, false},
                                                      {"M1 local 1 MiB on GPU1 200 us before", false, true}};
    for (auto& m : ms3) {
      std::vector<double> v;
      for (int r = 0; r < R; r++) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        if (m.g0) CK(cudaMemcpyAsync((char*)a0 + (1 << 20), a0, 1 << 20, cudaMemcpyDefault, w0));
        if (m.g1) { CK(cudaSetDevice(1)); CK(cudaMemcpyAsync((char*)a1 + (1 << 20), a1, 1 << 20, cudaMemcpyDefault, w1)); CK(cudaSetDevice(0)); }
        auto t0 = clk::now(); while (ms(t0, clk::now()) < 0.2) {}
        CK(cudaStreamSynchronize(w0)); CK(cudaStreamSynchronize(w1));
        v.push_back(one(s, dst, src, G4));
      }
      report(m.name, v);
    }
    CK(cudaStreamDestroy(w0)); CK(cudaStreamDestroy(w1)); CK(cudaFree(a0)); CK(cudaFree(a1)); }
  crossProcess(argv[0], false);
  return 0;
}
