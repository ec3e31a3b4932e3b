/* Stub of the CUDA driver API (libcuda.so.1) for GPU-less BUILD hosts.
 *
 * TVM's CUDA codegen hands the generated CUDA C++ to "ffi.Module.create.cuda", which lives in
 * libtvm_runtime_cuda.so. That library links libcuda.so.1; without a driver it cannot be loaded,
 * and TVM silently stores CUDA *source* in the artifact (to be JIT-compiled on the GPU host).
 * With this stub loaded first (RTLD_GLOBAL, soname libcuda.so.1) the real factory runs, calls
 * tvm_callback_cuda_compile (nvcc -> fatbin) and the artifact carries compiled device code.
 *
 * Every entry point fails with CUDA_ERROR_NO_DEVICE (100). Build-time only: never ship it.
 * Built by qcompiler.codegen.cuda.aot: gcc -shared -fPIC -Wl,-soname,libcuda.so.1 */
typedef int CUresult;
static const char* kMsg = "CUDA_ERROR_NO_DEVICE (qcompiler build-host stub libcuda)";
#define STUB(name) CUresult name() { return 100; }
STUB(cuDeviceGetName)
STUB(cuFuncSetAttribute)
STUB(cuLaunchKernelEx)
STUB(cuModuleGetFunction)
STUB(cuModuleLoadData)
STUB(cuModuleUnload)
STUB(cuTensorMapEncodeTiled)
STUB(cuInit)
STUB(cuDriverGetVersion)
STUB(cuGetProcAddress)
STUB(cuGetProcAddress_v2)
CUresult cuGetErrorName(CUresult e, const char** s) { (void)e; *s = kMsg; return 0; }
CUresult cuGetErrorString(CUresult e, const char** s) { (void)e; *s = kMsg; return 0; }
