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
//
// Build and run on a machine with two peer-capable GPUs:
//   nvcc -O2 -o peercopy bench/peercopy/peercopy.cu -lcuda && ./peercopy
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <thread>
#include <vector>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
#define CU(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { const char* m; cuGetErrorString(e, &m); printf("%s: %s\n", #x, m); exit(1);} } while (0)
using clk = std::chrono::steady_clock;
// copy16 copies n 16-byte words, grid-stride.
__global__ void copy16(const int4* __restrict__ s, int4* __restrict__ d, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) d[i] = s[i];
}
// vmm maps size bytes of device dev's memory, accessible to devices 0 and 1.
static void* vmm(int dev, size_t size) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h;
  CU(cuMemCreate(&h, size, &prop, 0));
  CUdeviceptr p;
  CU(cuMemAddressReserve(&p, size, 0, 0, 0));
  CU(cuMemMap(p, size, 0, h, 0));
  CUmemAccessDesc acc[2] = {};
  for (int i = 0; i < 2; i++) { acc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE; acc[i].location.id = i; acc[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; }
  CU(cuMemSetAccess(p, size, acc, 2));
  return (void*)p;
}
static double ms(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }
static const size_t G4 = 4ull << 30;
static void report(const char* name, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  double med = v[v.size() / 2];
  printf("%-44s median %8.3f ms (%.3f..%.3f) = %7.2f GB/s\n", name, med, v.front(), v.back(), G4 / med / 1e6);
}
int main() {
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
  { std::vector<double> v; for (int r = 0; r < R; r++) { cudaStream_t f; CK(cudaStreamCreateWithFlags(&f, cudaStreamNonBlocking)); v.push_back(one(f, dst, src, G4)); CK(cudaStreamDestroy(f)); } report("B2 fresh stream each", v); }
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
  return 0;
}
