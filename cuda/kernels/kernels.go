// Package kernels holds the CUDA kernels of the cuda backend as PTX text,
// embedded in the binary and JIT-compiled by the driver at run time
// (cuModuleLoadData), so stage needs no CUDA toolkit to build.
//
// gather.cu is the source; gather.ptx is generated from it with
//
//	nvcc -ptx -arch=compute_80 -O3 -o gather.ptx gather.cu
//
// on a machine with the CUDA toolkit, and committed. Regenerate it whenever
// gather.cu changes.
package kernels

import _ "embed"

// GatherPTX is gather.ptx: the module holding CopyFunc and StridedFunc.
//
//go:embed gather.ptx
var GatherPTX string

// CopyFunc is the kernel's entry point:
//
//	extern "C" __global__ void stage_copy_segments(const StageDesc *descs, unsigned int count);
//
// with StageDesc = {u64 src, u64 dst, u64 len}, 24 bytes.
const CopyFunc = "stage_copy_segments"

// CopyBlock is the thread-block size CopyFunc was compiled for
// (__launch_bounds__); launch with exactly this many threads.
const CopyBlock = 256

// DescSize is sizeof(StageDesc).
const DescSize = 24

// StridedFunc is the strided kernel's entry point, same launch shape:
//
//	extern "C" __global__ void stage_copy_strided(const StageStrided *descs, unsigned int count);
//
// with StageStrided = {u64 src, dst, src1, dst1, src2, dst2; u32 len, n1,
// n2, pad}, 64 bytes: n2 rows of n1 pieces of len bytes, piece (i2, i1) at
// src + i2*src2 + i1*src1 (dst likewise).
const StridedFunc = "stage_copy_strided"

// StridedDescSize is sizeof(StageStrided).
const StridedDescSize = 64
