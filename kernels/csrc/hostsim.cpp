// The host-simulation build: avex_prune.cu's kernel bodies run thread by thread on the CPU,
// on host pointers, behind the same C API. Tests use it on machines without a GPU.
#define AVEX_HOST_SIMULATION
#include "avex_prune.cu"
