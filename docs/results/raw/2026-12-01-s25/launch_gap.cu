// Launch-gap microbenchmark: back-to-back persistent-style launches (132 blocks, 384 threads,
// 200 KB smem) that each spin for `spin_ns`; time per launch minus spin = the gap.
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
__device__ unsigned long long now() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__global__ void spin(unsigned long long spin_ns, int pdl, int* sink) {
  extern __shared__ char smem[];
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  unsigned long long t0 = now();
  smem[threadIdx.x] = 1;
  while (now() - t0 < spin_ns) {}
  if (pdl) asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0 && smem[5] == 7) *sink = 1;
}
int main() {
  int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int smem = 200 * 1024;
  CK(cudaFuncSetAttribute(spin, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int* sink; CK(cudaMalloc(&sink, 4));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  printf("%-22s %8s %10s %10s\n", "variant", "spin_us", "per_launch", "gap_us");
  for (unsigned long long spin_ns : {0ull, 20000ull, 100000ull})
    for (int v = 0; v < 4; ++v) {
      const bool coop = v & 1, pdl = v & 2;
      cudaLaunchAttribute at[2]; int n = 0;
      if (coop) { at[n].id = cudaLaunchAttributeCooperative; at[n].val.cooperative = 1; ++n; }
      if (pdl) { at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[n].val.programmaticStreamSerializationAllowed = 1; ++n; }
      cudaLaunchConfig_t c{}; c.gridDim = dim3(sms); c.blockDim = dim3(384); c.dynamicSmemBytes = smem; c.stream = s; c.attrs = at; c.numAttrs = n;
      int ipdl = pdl;
      const int iters = 200;
      for (int i = 0; i < 20; ++i) CK(cudaLaunchKernelEx(&c, spin, spin_ns, ipdl, sink));
      CK(cudaEventRecord(a, s));
      for (int i = 0; i < iters; ++i) CK(cudaLaunchKernelEx(&c, spin, spin_ns, ipdl, sink));
      CK(cudaEventRecord(b, s)); CK(cudaEventSynchronize(b));
      float ms = 0; CK(cudaEventElapsedTime(&ms, a, b));
      const double per = ms * 1000.0 / iters;
      printf("%-22s %8.1f %10.2f %10.2f\n", coop ? (pdl ? "cooperative+pdl" : "cooperative") : (pdl ? "pdl" : "plain"), spin_ns / 1000.0, per, per - spin_ns / 1000.0);
    }
  return 0;
}
