// run_model: run a qcompiler artifact (OUT/model.so + OUT/manifest.json) on a CPU device with
// nothing but the TVM runtime (libtvm_runtime.so + libtvm_ffi.so), as an edge device would.
//
//   run_model OUT_DIR IN0.bin [IN1.bin ...] [-o PREFIX] [-n REPEAT]
//
// Each INk.bin holds the raw bytes (C order, little endian) of input k, with the shape and dtype
// that manifest.json gives; the program checks the sizes. Output k goes to PREFIXk.bin (default
// PREFIX "out"), raw bytes likewise, and a line "output k NAME DTYPE[SHAPE] -> FILE" is printed.
// With -n REPEAT > 1 it also prints the mean time per run.
//
// An artifact with dynamic dims (format 2, `qcompile --dynamic`): an input's one dynamic dim is
// read from its file's size; the inputs are zero-padded to the smallest bucket that holds the
// sizes, that bucket's function runs, and the outputs are cut back to the sizes.
//
// Only the tvm-ffi C++ headers are used (the TVM wheel's tvm/runtime headers do not compile on
// their own). libtvm_runtime.so must be linked with --no-as-needed: we call nothing from it
// directly, but loading it registers the Relax VM loader, the CPU device API and the builtins.
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <chrono>
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

// ---- a minimal JSON reader (enough for manifest.json) ------------------------------------------
struct Json {
  enum Kind { kNull, kBool, kNum, kStr, kArr, kObj } kind = kNull;
  double num = 0;
  std::string str;
  std::vector<Json> arr;
  std::map<std::string, Json> obj;
  const Json& operator[](const std::string& key) const {
    auto it = obj.find(key);
    if (kind != kObj || it == obj.end()) throw std::runtime_error("manifest.json: missing field '" + key + "'");
    return it->second;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}
  Json Parse() {
    Json v = Value();
    Ws();
    if (i_ != s_.size()) Fail("trailing characters");
    return v;
  }

 private:
  const std::string& s_;
  size_t i_ = 0;
  [[noreturn]] void Fail(const char* what) {
    throw std::runtime_error("manifest.json: " + std::string(what) + " at offset " + std::to_string(i_));
  }
  void Ws() { while (i_ < s_.size() && std::strchr(" \t\r\n", s_[i_])) ++i_; }
  bool Eat(char c) { Ws(); if (i_ < s_.size() && s_[i_] == c) { ++i_; return true; } return false; }
  std::string Str() {
    if (!Eat('"')) Fail("expected a string");
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c == '\\' && i_ < s_.size()) {
        char e = s_[i_++];
        if (e == 'u') { out += '?'; i_ += 4; continue; }   // non-ASCII: not needed for our fields
        const char* map = "b\bf\fn\nr\rt\t";
        const char* m = std::strchr(map, e);
        c = (m && (m - map) % 2 == 0) ? m[1] : e;
      }
      out += c;
    }
    if (i_++ >= s_.size()) Fail("unterminated string");
    return out;
  }
  Json Value() {
    Json v;
    Ws();
    if (i_ >= s_.size()) Fail("unexpected end");
    char c = s_[i_];
    if (c == '{') {
      v.kind = Json::kObj; ++i_;
      if (Eat('}')) return v;
      do { std::string k = Str(); if (!Eat(':')) Fail("expected ':'"); v.obj[k] = Value(); } while (Eat(','));
      if (!Eat('}')) Fail("expected '}'");
    } else if (c == '[') {
      v.kind = Json::kArr; ++i_;
      if (Eat(']')) return v;
      do { v.arr.push_back(Value()); } while (Eat(','));
      if (!Eat(']')) Fail("expected ']'");
    } else if (c == '"') {
      v.kind = Json::kStr; v.str = Str();
    } else if (s_.compare(i_, 4, "true") == 0 || s_.compare(i_, 5, "false") == 0) {
      v.kind = Json::kBool; v.num = s_[i_] == 't'; i_ += s_[i_] == 't' ? 4 : 5;
    } else if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
    } else {
      char* end = nullptr;
      v.kind = Json::kNum; v.num = std::strtod(s_.c_str() + i_, &end);
      if (end == s_.c_str() + i_) Fail("bad value");
      i_ = end - s_.c_str();
    }
    return v;
  }
};

// ---- tensors ------------------------------------------------------------------------------------
using Sizes = std::map<std::string, int64_t>;  // a dynamic dim's name -> its size

struct TensorSpec {
  std::string name, dtype;
  std::vector<int64_t> shape;   // -1 where dynamic
  std::vector<std::string> dims;  // the dynamic dims' names, "" where fixed
  int64_t numel() const { int64_t n = 1; for (int64_t d : shape) n *= d; return n; }
  std::vector<int64_t> at(const Sizes& sizes) const {  // the shape with the dynamic dims' sizes
    std::vector<int64_t> out(shape);
    for (size_t i = 0; i < dims.size(); ++i) if (!dims[i].empty()) out[i] = sizes.at(dims[i]);
    return out;
  }
  std::string str() const {
    std::string s = name + " " + dtype + "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + (dims[i].empty() ? std::to_string(shape[i]) : dims[i]);
    return s + "]";
  }
};

static std::vector<TensorSpec> Specs(const Json& list) {
  std::vector<TensorSpec> out;
  for (const Json& t : list.arr) {
    TensorSpec s{t["name"].str, t["dtype"].str, {}, {}};
    for (const Json& d : t["shape"].arr) {
      s.shape.push_back(d.kind == Json::kStr ? -1 : static_cast<int64_t>(d.num));
      s.dims.push_back(d.kind == Json::kStr ? d.str : "");
    }
    out.push_back(s);
  }
  return out;
}

// Copy the box [0, box) of a row-major src (shape src_shape) into a row-major dst (dst_shape).
static void CopyBox(const char* src, const std::vector<int64_t>& src_shape, char* dst,
                    const std::vector<int64_t>& dst_shape, const std::vector<int64_t>& box, size_t esize) {
  size_t rank = box.size();
  if (rank == 0) { std::memcpy(dst, src, esize); return; }
  std::vector<int64_t> idx(rank, 0);
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < rank; ++i) rows *= box[i];
  for (int64_t r = 0; r < rows && box[rank - 1] > 0; ++r) {
    int64_t so = 0, d_o = 0;
    for (size_t i = 0; i < rank; ++i) { so = so * src_shape[i] + idx[i]; d_o = d_o * dst_shape[i] + idx[i]; }
    std::memcpy(dst + d_o * esize, src + so * esize, box[rank - 1] * esize);
    for (int64_t i = static_cast<int64_t>(rank) - 2; i >= 0; --i) { if (++idx[i] < box[i]) break; idx[i] = 0; }
  }
}

static DLDataType ParseDType(const std::string& name) {
  static const std::map<std::string, DLDataType> kTypes = {
      {"float32", {kDLFloat, 32, 1}}, {"float16", {kDLFloat, 16, 1}}, {"bfloat16", {kDLBfloat, 16, 1}},
      {"float64", {kDLFloat, 64, 1}}, {"int8", {kDLInt, 8, 1}},       {"uint8", {kDLUInt, 8, 1}},
      {"int16", {kDLInt, 16, 1}},     {"int32", {kDLInt, 32, 1}},     {"int64", {kDLInt, 64, 1}},
      {"bool", {kDLBool, 8, 1}}};
  auto it = kTypes.find(name);
  if (it == kTypes.end()) throw std::runtime_error("unsupported dtype " + name);
  return it->second;
}

struct CPUAlloc {  // NDAllocator for ffi::Tensor::FromNDAlloc: 64-byte aligned host memory
  void AllocData(DLTensor* t) { t->data = std::aligned_alloc(64, (ffi::GetDataSize(*t) + 63) / 64 * 64); }
  void FreeData(DLTensor* t) { std::free(t->data); }
};

static std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

static ffi::Tensor Alloc(const std::vector<int64_t>& shape, DLDataType dt) {
  return ffi::Tensor::FromNDAlloc(CPUAlloc(), ffi::ShapeView(shape.data(), shape.size()), dt, DLDevice{kDLCPU, 0});
}

// The size of ``spec``'s one dynamic dim in the file ``path`` (into ``sizes``; checked against the
// range and other inputs).
static void ReadSize(const TensorSpec& spec, const std::string& path, const Json& ranges, Sizes& sizes) {
  std::string dim;
  int64_t fixed = 1;
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    if (spec.dims[i].empty()) { fixed *= spec.shape[i]; continue; }
    if (!dim.empty()) throw std::runtime_error("input " + spec.str() + " has two dynamic dims: run it with qcompiler.runtime");
    dim = spec.dims[i];
  }
  if (dim.empty()) return;
  int64_t row = static_cast<int64_t>(ffi::GetDataSize(fixed, ParseDType(spec.dtype)));
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error("cannot read " + path);
  int64_t bytes = static_cast<int64_t>(f.tellg());
  int64_t n = row ? bytes / row : 0;
  const Json& r = ranges[dim];
  if (row == 0 || bytes % row || n < r.arr[0].num || n > r.arr[1].num)
    throw std::runtime_error(path + ": " + std::to_string(bytes) + " bytes is not input " + spec.str() + " with " + dim +
                             " in " + std::to_string(int64_t(r.arr[0].num)) + ".." + std::to_string(int64_t(r.arr[1].num)));
  if (sizes.count(dim) && sizes[dim] != n)
    throw std::runtime_error("inputs disagree on " + dim + ": " + std::to_string(sizes[dim]) + " and " + std::to_string(n));
  sizes[dim] = n;
}

static ffi::Tensor LoadInput(TensorSpec spec, const std::string& path, const Sizes& sizes) {
  spec.shape = spec.at(sizes);
  DLDataType dt = ParseDType(spec.dtype);
  std::string bytes = ReadFile(path);
  size_t want = ffi::GetDataSize(spec.numel(), dt);
  if (bytes.size() != want)
    throw std::runtime_error(path + ": " + std::to_string(bytes.size()) + " bytes, but input " + spec.str() +
                             " needs " + std::to_string(want));
  ffi::Tensor t = Alloc(spec.shape, dt);
  std::memcpy(t.data_ptr(), bytes.data(), want);
  return t;
}

// ``t`` (row-major, shape ``from``) in a zero tensor of shape ``to`` or cut to it, the box both share.
static ffi::Tensor Reshaped(const ffi::Tensor& t, const std::vector<int64_t>& to) {
  std::vector<int64_t> from(t.shape().begin(), t.shape().end()), box(to.size());
  if (from == to) return t;  // a size that is a bucket: nothing to pad or cut
  for (size_t i = 0; i < to.size(); ++i) box[i] = std::min(from[i], to[i]);
  ffi::Tensor out = Alloc(to, t.dtype());
  size_t esize = ffi::GetDataSize(1, t.dtype());
  std::memset(out.data_ptr(), 0, ffi::GetDataSize(out.numel(), t.dtype()));
  CopyBox(static_cast<const char*>(t.data_ptr()), from, static_cast<char*>(out.data_ptr()), to, box, esize);
  return out;
}

int main(int argc, char** argv) {
  std::vector<std::string> files;
  std::string out_dir, prefix = "out";
  int repeat = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-o" && i + 1 < argc) {
      prefix = argv[++i];
    } else if (a == "-n" && i + 1 < argc) {
      repeat = std::atoi(argv[++i]);
    } else if (out_dir.empty()) {
      out_dir = a;
    } else {
      files.push_back(a);
    }
  }
  if (out_dir.empty()) {
    std::fprintf(stderr, "usage: %s OUT_DIR IN0.bin [IN1.bin ...] [-o PREFIX] [-n REPEAT]\n", argv[0]);
    return 2;
  }
  try {
    Json m = JsonParser(ReadFile(out_dir + "/manifest.json")).Parse();
    int version = static_cast<int>(m["format_version"].num);
    if (version != 1 && version != 2) throw std::runtime_error("unsupported artifact format_version");
    if (m["target"]["family"].str == "cuda")
      throw std::runtime_error("this example runs CPU artifacts; run cuda artifacts with qcompiler.runtime");
    std::vector<TensorSpec> ins = Specs(m["inputs"]), outs = Specs(m["outputs"]);
    if (files.size() != ins.size()) {
      std::string names;
      for (auto& s : ins) names += "\n  " + s.str();
      throw std::runtime_error("model takes " + std::to_string(ins.size()) + " input file(s), got " +
                               std::to_string(files.size()) + ":" + names);
    }
    Sizes sizes, bucket;
    std::string fn_name = "main";
    if (version == 2) {  // dynamic dims: sizes from the files, the smallest bucket that holds them
      for (size_t k = 0; k < ins.size(); ++k) ReadSize(ins[k], files[k], m["dynamic"]["dims"], sizes);
      int64_t best = -1;
      for (const Json& b : m["dynamic"]["buckets"].arr) {
        int64_t work = 1;
        bool fits = true;
        for (auto& [dim, n] : sizes) { work *= int64_t(b["sizes"][dim].num); fits = fits && b["sizes"][dim].num >= n; }
        if (fits && (best < 0 || work < best)) {
          best = work, fn_name = b["function"].str, bucket.clear();
          for (auto& [dim, n] : sizes) bucket[dim] = int64_t(b["sizes"][dim].num);
        }
      }
    }
    std::vector<ffi::Tensor> inputs;
    for (size_t k = 0; k < ins.size(); ++k) {
      ffi::Tensor x = LoadInput(ins[k], files[k], sizes);
      inputs.push_back(version == 2 ? Reshaped(x, ins[k].at(bucket)) : x);
    }

    ffi::Module lib = ffi::Module::LoadFromFile(out_dir + "/" + m["library"]["file"].str);
    ffi::Module vm = lib->GetFunction("vm_load_executable").value()().cast<ffi::Module>();
    vm->GetFunction("vm_initialization").value()(static_cast<int>(kDLCPU), 0, 2);  // 2 = pooled allocator
    ffi::Function main_fn = vm->GetFunction(fn_name).value();

    std::vector<ffi::AnyView> args(inputs.begin(), inputs.end());
    ffi::Any result;
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < std::max(repeat, 1); ++r) main_fn.CallPacked(args.data(), static_cast<int32_t>(args.size()), &result);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    std::vector<ffi::Tensor> ys;
    if (auto t = result.as<ffi::Tensor>()) ys.push_back(*t);
    else for (const ffi::Any& y : result.cast<ffi::Array<ffi::Any>>()) ys.push_back(y.cast<ffi::Tensor>());
    if (ys.size() != outs.size()) throw std::runtime_error("model returned a different number of outputs than the manifest lists");
    for (size_t k = 0; k < ys.size(); ++k) {
      const ffi::Tensor y = version == 2 ? Reshaped(ys[k], outs[k].at(sizes)) : ys[k];
      std::vector<int64_t> shape(y.shape().begin(), y.shape().end());
      if (shape != outs[k].at(sizes)) throw std::runtime_error("output " + outs[k].name + " has an unexpected shape");
      std::string path = prefix + std::to_string(k) + ".bin";
      std::ofstream f(path, std::ios::binary);
      f.write(static_cast<const char*>(y.data_ptr()), ffi::GetDataSize(y.numel(), y.dtype()));
      if (!f) throw std::runtime_error("cannot write " + path);
      TensorSpec got = outs[k];
      got.shape = shape, got.dims.assign(shape.size(), "");
      std::printf("output %zu %s -> %s\n", k, got.str().c_str(), path.c_str());
    }
    if (repeat > 1) std::printf("%.3f ms per run (mean of %d)\n", ms / repeat, repeat);
    return 0;
  } catch (const ffi::Error& e) {
    std::fprintf(stderr, "run_model: TVM error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run_model: error: %s\n", e.what());
  }
  return 1;
}
