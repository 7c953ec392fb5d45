// gather.cu: the copy kernel of stage's cuda backend.
//
// One launch moves every segment of a chunk. The host writes an array of
// descriptors {src, dst, len} into host-mapped pinned memory and passes its
// device address; each thread block takes one descriptor at a time
// (grid-stride over the array) and copies it with 16-byte vector loads and
// stores when source and destination share 16-byte alignment (8- or 4-byte
// words when they share less), byte copies for the unaligned head and tail,
// and byte copies throughout when they share no 4-byte alignment.
//
// Gather passes the pinned slot's DEVICE address as dst, so the kernel writes
// straight into host memory over the bus; Scatter passes it as src. Segments
// must not overlap one another.
//
// Generated PTX (committed beside this file, embedded by kernels.go):
//
//	nvcc -ptx -arch=compute_80 -O3 -o gather.ptx gather.cu
//
// compute_80 PTX is JIT-compiled by the driver for Ampere, Hopper and newer.

struct StageDesc {
  unsigned long long src;
  unsigned long long dst;
  unsigned long long len;
};

#define STAGE_BLOCK 256
#define STAGE_UNROLL 4

// Copies n words of type T; consecutive threads touch consecutive words, and
// each thread keeps STAGE_UNROLL loads in flight before it stores.
template <typename T>
__device__ __forceinline__ void copy_words(const T* __restrict__ s, T* __restrict__ d,
                                           unsigned long long n) {
  const unsigned long long step = blockDim.x;
  unsigned long long i = threadIdx.x;
  for (; i + (STAGE_UNROLL - 1) * step < n; i += STAGE_UNROLL * step) {
    T v[STAGE_UNROLL];
#pragma unroll
    for (int k = 0; k < STAGE_UNROLL; k++) v[k] = s[i + k * step];
#pragma unroll
    for (int k = 0; k < STAGE_UNROLL; k++) d[i + k * step] = v[k];
  }
  for (; i < n; i += step) d[i] = s[i];
}

__device__ __forceinline__ void copy_bytes(const unsigned char* __restrict__ s,
                                           unsigned char* __restrict__ d,
                                           unsigned long long n) {
  for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

// src and dst are congruent modulo sizeof(T): copy a byte head up to the
// first T boundary, the body as T words, and a byte tail.
template <typename T>
__device__ __forceinline__ void copy_aligned(unsigned long long src, unsigned long long dst,
                                             unsigned long long len) {
  const unsigned long long w = sizeof(T);
  unsigned long long head = (w - (src & (w - 1))) & (w - 1);
  if (head > len) head = len;
  copy_bytes((const unsigned char*)src, (unsigned char*)dst, head);
  src += head;
  dst += head;
  len -= head;
  const unsigned long long n = len / w;
  copy_words<T>((const T*)src, (T*)dst, n);
  const unsigned long long done = n * w;
  copy_bytes((const unsigned char*)(src + done), (unsigned char*)(dst + done), len - done);
}

extern "C" __global__ void __launch_bounds__(STAGE_BLOCK)
stage_copy_segments(const StageDesc* descs, unsigned int count) {
  __shared__ unsigned long long d[3];
  for (unsigned int i = blockIdx.x; i < count; i += gridDim.x) {
    // Three threads fetch the descriptor (one bus round trip when it lives
    // in host-mapped memory); everyone else reads it from shared memory.
    if (threadIdx.x < 3) {
      const unsigned long long* p = (const unsigned long long*)&descs[i];
      d[threadIdx.x] = p[threadIdx.x];
    }
    __syncthreads();
    const unsigned long long src = d[0], dst = d[1], len = d[2];
    __syncthreads();  // all have read d before it is overwritten
    const unsigned long long mis = src ^ dst;
    if (len >= 64 && (mis & 15) == 0) {
      copy_aligned<uint4>(src, dst, len);
    } else if (len >= 64 && (mis & 7) == 0) {
      copy_aligned<unsigned long long>(src, dst, len);
    } else if (len >= 64 && (mis & 3) == 0) {
      copy_aligned<unsigned int>(src, dst, len);
    } else {
      copy_bytes((const unsigned char*)src, (unsigned char*)dst, len);
    }
  }
}
