// verify_probe: call functions of a qcompiler artifact's Relax VM on raw inputs, many runs in one
// process, with nothing but the TVM runtime. `qcompile verify` cross-builds it for aarch64 and runs
// it under qemu-aarch64 to get the outputs of `main` and `debug` computed by the ARM kernels.
//
//   verify_probe LIB FUNCS RUNS PREFIX DTYPE:D0xD1x...:FILE [...]
//
// FUNCS: comma-separated function names (e.g. main,debug). Input k's FILE holds RUNS consecutive
// tensors of the given dtype and shape (raw bytes, C order). For each run every function is called
// on that run's inputs; output j of function F is appended to PREFIX.F.j.bin, and once per output
// a line "F j DTYPE D0xD1x..." is printed, so the caller can read RUNS x shape arrays back.
// The manifest is not read here: the Python caller passes the shapes (and checked the sha256).
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ffi = tvm::ffi;

static const std::map<std::string, DLDataType> kTypes = {
    {"float32", {kDLFloat, 32, 1}}, {"float16", {kDLFloat, 16, 1}}, {"float64", {kDLFloat, 64, 1}},
    {"int8", {kDLInt, 8, 1}},       {"uint8", {kDLUInt, 8, 1}},     {"int16", {kDLInt, 16, 1}},
    {"int32", {kDLInt, 32, 1}},     {"int64", {kDLInt, 64, 1}},     {"bool", {kDLBool, 8, 1}}};

static std::string DTypeName(DLDataType t) {
  for (const auto& kv : kTypes)
    if (kv.second.code == t.code && kv.second.bits == t.bits && kv.second.lanes == t.lanes) return kv.first;
  throw std::runtime_error("output of unsupported dtype");
}

static std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

struct CPUAlloc {  // NDAllocator for ffi::Tensor::FromNDAlloc: 64-byte aligned host memory
  void AllocData(DLTensor* t) { t->data = std::aligned_alloc(64, (ffi::GetDataSize(*t) + 63) / 64 * 64); }
  void FreeData(DLTensor* t) { std::free(t->data); }
};

struct Input {
  DLDataType dtype;
  std::vector<int64_t> shape;
  std::string bytes;  // RUNS tensors
  size_t size = 0;    // bytes of one tensor
};

static Input ParseInput(const std::string& arg, long runs) {
  std::vector<std::string> parts = Split(arg, ':');
  if (parts.size() != 3) throw std::runtime_error("bad input spec '" + arg + "' (want DTYPE:D0xD1:FILE)");
  auto it = kTypes.find(parts[0]);
  if (it == kTypes.end()) throw std::runtime_error("unsupported dtype " + parts[0]);
  Input in{it->second, {}, {}, 0};
  int64_t n = 1;
  for (const std::string& d : Split(parts[1], 'x')) in.shape.push_back(std::atoll(d.c_str())), n *= in.shape.back();
  in.size = ffi::GetDataSize(n, in.dtype);
  std::ifstream f(parts[2], std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + parts[2]);
  std::stringstream ss;
  ss << f.rdbuf();
  in.bytes = ss.str();
  if (in.bytes.size() != in.size * runs)
    throw std::runtime_error(parts[2] + ": " + std::to_string(in.bytes.size()) + " bytes, want " +
                             std::to_string(in.size * runs));
  return in;
}

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s LIB FUNCS RUNS PREFIX DTYPE:D0xD1:FILE [...]\n", argv[0]);
    return 2;
  }
  try {
    std::vector<std::string> funcs = Split(argv[2], ',');
    long runs = std::atol(argv[3]);
    std::string prefix = argv[4];
    std::vector<Input> inputs;
    for (int i = 5; i < argc; ++i) inputs.push_back(ParseInput(argv[i], runs));

    ffi::Module lib = ffi::Module::LoadFromFile(argv[1]);
    ffi::Module vm = lib->GetFunction("vm_load_executable").value()().cast<ffi::Module>();
    vm->GetFunction("vm_initialization").value()(static_cast<int>(kDLCPU), 0, 2);  // 2 = pooled allocator
    std::vector<ffi::Function> fns;
    for (const std::string& name : funcs) {
      auto fn = vm->GetFunction(name);
      if (!fn.has_value()) throw std::runtime_error("the library has no function '" + name + "'");
      fns.push_back(*fn);
    }
    std::map<std::string, std::ofstream> files;
    for (long r = 0; r < runs; ++r) {
      std::vector<ffi::Tensor> ts;
      for (const Input& in : inputs) {
        ffi::Tensor t = ffi::Tensor::FromNDAlloc(CPUAlloc(), ffi::ShapeView(in.shape.data(), in.shape.size()),
                                                 in.dtype, DLDevice{kDLCPU, 0});
        std::memcpy(t.data_ptr(), in.bytes.data() + r * in.size, in.size);
        ts.push_back(t);
      }
      std::vector<ffi::AnyView> args(ts.begin(), ts.end());
      for (size_t f = 0; f < fns.size(); ++f) {
        ffi::Any result;
        fns[f].CallPacked(args.data(), static_cast<int32_t>(args.size()), &result);
        std::vector<ffi::Tensor> ys;
        if (auto t = result.as<ffi::Tensor>()) ys.push_back(*t);
        else for (const ffi::Any& y : result.cast<ffi::Array<ffi::Any>>()) ys.push_back(y.cast<ffi::Tensor>());
        for (size_t j = 0; j < ys.size(); ++j) {
          const ffi::Tensor& y = ys[j];
          std::string path = prefix + "." + funcs[f] + "." + std::to_string(j) + ".bin";
          if (r == 0) {
            std::string shape;
            for (int64_t d : y.shape()) shape += (shape.empty() ? "" : "x") + std::to_string(d);
            std::printf("%s %zu %s %s\n", funcs[f].c_str(), j, DTypeName(y.dtype()).c_str(), shape.c_str());
            files[path].open(path, std::ios::binary);
          }
          files[path].write(static_cast<const char*>(y.data_ptr()), ffi::GetDataSize(y.numel(), y.dtype()));
          if (!files[path]) throw std::runtime_error("cannot write " + path);
        }
      }
    }
    return 0;
  } catch (const ffi::Error& e) {
    std::fprintf(stderr, "verify_probe: TVM error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "verify_probe: error: %s\n", e.what());
  }
  return 1;
}
