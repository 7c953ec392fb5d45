// gpuwake: what one small copy costs right after the GPU sat idle (issue
// 37: a 4 KiB push between two GPUs took 66-78 us back to back and
// 250-670 us after 2-50 ms of idle). For each idle gap, REPS times: sleep
// the gap, then time one 4 KiB copy by the host clock, from its enqueue to
// the end of its wait. Copies: D2H from GPU0 and H2D to GPU1, pinned host
// memory, each waited for by spinning (cudaStreamSynchronize, the default
// context spins) and by a blocking-sync event (the interrupt path, as
// stage's hybrid wait ends after its 20 us poll).
//
//   nvcc -O2 -o gpuwake bench/gpuwake/gpuwake.cu && ./gpuwake [REPS]
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
using clk = std::chrono::steady_clock;
static const size_t N = 4096;

struct Side { int dev; void* d; void* h; cudaStream_t s; cudaEvent_t ev; };

static Side side(int dev) {
  Side x{dev};
  CK(cudaSetDevice(dev));
  CK(cudaMalloc(&x.d, N));
  CK(cudaMallocHost(&x.h, N));
  CK(cudaStreamCreateWithFlags(&x.s, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&x.ev, cudaEventDisableTiming | cudaEventBlockingSync));
  return x;
}

// once times one copy on x (d2h or h2d), waited by spinning or by the event.
static double once(Side& x, bool d2h, bool block) {
  CK(cudaSetDevice(x.dev));
  auto t0 = clk::now();
  CK(cudaMemcpyAsync(d2h ? x.h : x.d, d2h ? x.d : x.h, N, d2h ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, x.s));
  if (block) {
    CK(cudaEventRecord(x.ev, x.s));
    CK(cudaEventSynchronize(x.ev));
  } else {
    CK(cudaStreamSynchronize(x.s));
  }
  return std::chrono::duration<double, std::micro>(clk::now() - t0).count();
}

int main(int argc, char** argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 30;
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  Side a = side(0), b = side(ndev > 1 ? 1 : 0);
  for (int w = 0; w < 100; w++) { once(a, true, false); once(b, false, false); }
  const int gaps[] = {0, 2, 10, 50, 200};
  printf("%-8s %-26s %10s %10s %10s\n", "idle ms", "copy", "p50 us", "min", "max");
  for (int g : gaps) {
    for (int c = 0; c < 4; c++) {
      bool d2h = c < 2, block = c % 2;
      std::vector<double> v;
      for (int r = 0; r < reps; r++) {
        if (g) std::this_thread::sleep_for(std::chrono::milliseconds(g));
        v.push_back(once(d2h ? a : b, d2h, block));
      }
      std::sort(v.begin(), v.end());
      char name[64];
      snprintf(name, sizeof name, "%s GPU%d, %s", d2h ? "D2H from" : "H2D to", d2h ? a.dev : b.dev, block ? "blocking event" : "spin");
      printf("%-8d %-26s %10.1f %10.1f %10.1f\n", g, name, v[v.size() / 2], v.front(), v.back());
    }
  }
  return 0;
}
