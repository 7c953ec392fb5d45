// gather.cu: the copy kernels of stage's cuda backend.
//
// One launch moves a chunk's segments. The host writes an array of
// descriptors into host-mapped pinned memory and passes its device address;
// each thread block takes one descriptor at a time (grid-stride over the
// array), a few of its threads fetch it (one bus round trip) and all of
// them copy it.
//
// stage_copy_segments takes plain segments {src, dst, len} and copies each
// with 16-byte vector loads and stores when source and destination share
// 16-byte alignment (8- or 4-byte words when they share less), byte copies
// for the unaligned head and tail, and byte copies throughout when they
// share no 4-byte alignment.
//
// stage_copy_strided takes strided descriptors: n2 rows of n1 pieces of
// len bytes, piece (i2, i1) at src + i2*src2 + i1*src1 and likewise dst.
// The host compresses a long list of short segments into them (a layout
// that keeps a block's heads apart gives one descriptor per run of tokens
// of a block instead of one per (token, head) row piece), so a descriptor
// carries kilobytes, not a few hundred bytes. The block spreads the
// descriptor's words over all its threads whatever the piece length (piece
// and offset come from the word's index), so 256-byte pieces keep every
// thread busy; words are 16 bytes when every address, stride and length
// is a multiple of 16, else 8, 4 or 1. A 1 x 1 descriptor is copied as a
// plain segment.
//
// Gather passes the pinned slot's DEVICE address as dst, so the kernel writes
// straight into host memory over the bus; Scatter passes it as src. Segments
// (and pieces) must not overlap one another.
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

// 64 bytes; the host checks len * n1 * n2 fits a descriptor's byte cap.
struct StageStrided {
  unsigned long long src, dst;    // piece (0, 0)
  unsigned long long src1, dst1;  // from a piece to the next in its row
  unsigned long long src2, dst2;  // from a row to the next
  unsigned int len, n1, n2, pad;  // bytes per piece, pieces per row, rows
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

// One segment, by the whole block.
__device__ __forceinline__ void copy_segment(unsigned long long src, unsigned long long dst,
                                             unsigned long long len) {
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
    copy_segment(src, dst, len);
  }
}

// Copies total words of type T of a strided descriptor, wpp words per
// piece: word w is word w % wpp of piece p = w / wpp, which is piece
// p % n1 of row p / n1. 32-bit index arithmetic (the host caps a
// descriptor far below 4 GiB); STAGE_UNROLL loads in flight per thread.
template <typename T>
__device__ __forceinline__ void copy_pieces(unsigned long long src, unsigned long long dst,
                                            unsigned long long src1, unsigned long long dst1,
                                            unsigned long long src2, unsigned long long dst2,
                                            unsigned int wpp, unsigned int n1,
                                            unsigned int total) {
  const unsigned int step = blockDim.x;
  for (unsigned int base = threadIdx.x; base < total; base += STAGE_UNROLL * step) {
    T v[STAGE_UNROLL];
    T* to[STAGE_UNROLL];
#pragma unroll
    for (int k = 0; k < STAGE_UNROLL; k++) {
      const unsigned int w = base + k * step;
      to[k] = 0;
      if (w < total) {
        const unsigned int p = w / wpp, o = w - p * wpp;
        const unsigned int i2 = p / n1, i1 = p - i2 * n1;
        const unsigned long long off = (unsigned long long)o * sizeof(T);
        v[k] = *(const T*)(src + i2 * src2 + i1 * src1 + off);
        to[k] = (T*)(dst + i2 * dst2 + i1 * dst1 + off);
      }
    }
#pragma unroll
    for (int k = 0; k < STAGE_UNROLL; k++) {
      if (to[k]) *to[k] = v[k];
    }
  }
}

extern "C" __global__ void __launch_bounds__(STAGE_BLOCK)
stage_copy_strided(const StageStrided* descs, unsigned int count) {
  __shared__ unsigned long long d[8];
  for (unsigned int i = blockIdx.x; i < count; i += gridDim.x) {
    if (threadIdx.x < 8) {
      const unsigned long long* p = (const unsigned long long*)&descs[i];
      d[threadIdx.x] = p[threadIdx.x];
    }
    __syncthreads();
    const unsigned long long src = d[0], dst = d[1], src1 = d[2], dst1 = d[3];
    const unsigned long long src2 = d[4], dst2 = d[5];
    const unsigned int len = (unsigned int)d[6], n1 = (unsigned int)(d[6] >> 32);
    const unsigned int n2 = (unsigned int)d[7];
    __syncthreads();  // all have read d before it is overwritten
    if (n1 <= 1 && n2 <= 1) {
      copy_segment(src, dst, len);
      continue;
    }
    if (len == 0 || n1 == 0 || n2 == 0) continue;
    const unsigned long long a = src | dst | src1 | dst1 | src2 | dst2 | len;
    const unsigned int pieces = n1 * n2;
    if ((a & 15) == 0) {
      copy_pieces<uint4>(src, dst, src1, dst1, src2, dst2, len / 16, n1, pieces * (len / 16));
    } else if ((a & 7) == 0) {
      copy_pieces<unsigned long long>(src, dst, src1, dst1, src2, dst2, len / 8, n1, pieces * (len / 8));
    } else if ((a & 3) == 0) {
      copy_pieces<unsigned int>(src, dst, src1, dst1, src2, dst2, len / 4, n1, pieces * (len / 4));
    } else {
      copy_pieces<unsigned char>(src, dst, src1, dst1, src2, dst2, len, n1, pieces * len);
    }
  }
}
