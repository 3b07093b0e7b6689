// MEGAPLAN_HOST_DEVICE: a function both the host and CUDA device code compile, from one definition
// (nvcc sees __host__ __device__; the host compiler nothing).
#pragma once

#ifdef __CUDACC__
#define MEGAPLAN_HOST_DEVICE __host__ __device__
#else
#define MEGAPLAN_HOST_DEVICE
#endif
