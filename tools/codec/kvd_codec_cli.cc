// kvd-codec: command-line front end of src/codec, used by the measurement scripts
// (tools/kvmodel/measure.py) and for inspecting stored objects.
//
//   kvd-codec roundtrip --layout KV,LAYERS,TOKENS,HIDDEN[,DTYPE] [--bins SPEC]
//                       [--anchor-group G] [--anchor-bins B] [--codec cachegen|fp8]
//                       [--fp8-dtype float8_e4m3fn] [--threads N] IN OUT
//       IN holds whole objects back to back; each is encoded, decoded and written to
//       OUT. Prints one JSON line: objects, raw and encoded bytes, and per-plane
//       encoded bytes summed over the objects.
//   kvd-codec inspect FILE        prints the header of an encoded object
//   kvd-codec encode  (same options) IN OUT     one object
//   kvd-codec decode  IN OUT                    one object
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec/format.h"

using namespace kvd;         // NOLINT
using namespace kvd::codec;  // NOLINT

namespace {

[[noreturn]] void Die(const std::string& msg) {
  fprintf(stderr, "kvd-codec: %s\n", msg.c_str());
  exit(2);
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) Die("cannot read " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& data) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  if (!f) Die("cannot write " + path);
}

struct Args {
  std::string cmd;
  ObjectLayout layout;
  CachegenOptions opt;
  std::string codec = "cachegen";
  Fp8Kind fp8 = Fp8Kind::kE4m3fn;
  std::vector<std::string> files;
};

Args Parse(int argc, char** argv) {
  if (argc < 2) Die("usage: kvd-codec roundtrip|encode|decode|inspect ... (see the source header)");
  Args a;
  a.cmd = argv[1];
  bool have_bins = false;
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value after " + s);
      return argv[++i];
    };
    if (s == "--layout") {
      std::string v = next();
      GroupShape g;
      unsigned kv, l, t, h;
      char dt[32] = "bfloat16";
      if (sscanf(v.c_str(), "%u,%u,%u,%u,%31s", &kv, &l, &t, &h, dt) < 4) Die("bad --layout " + v);
      g.kv_size = kv;
      g.layers = l;
      g.tokens = t;
      g.hidden = h;
      auto d = DtypeFromName(dt);
      if (!d.ok()) Die(d.status().message());
      g.dtype = *d;
      a.layout.groups.push_back(g);
    } else if (s == "--bins") {
      auto b = BinSchedule::Parse(next());
      if (!b.ok()) Die(b.status().message());
      a.opt.bins = *b;
      have_bins = true;
    } else if (s == "--anchor-group") {
      a.opt.anchor_group = static_cast<uint32_t>(std::stoul(next()));
    } else if (s == "--anchor-bins") {
      a.opt.anchor_bins = static_cast<uint32_t>(std::stoul(next()));
    } else if (s == "--threads") {
      a.opt.threads = std::stoi(next());
    } else if (s == "--codec") {
      a.codec = next();
    } else if (s == "--fp8-dtype") {
      auto k = Fp8KindFromName(next());
      if (!k.ok()) Die(k.status().message());
      a.fp8 = *k;
    } else if (s.starts_with("--")) {
      Die("unknown option " + s);
    } else {
      a.files.push_back(s);
    }
  }
  if (!have_bins && !a.layout.groups.empty()) a.opt.bins = BinSchedule::Lmcache(a.layout.groups[0].layers);
  return a;
}

int Roundtrip(const Args& a) {
  if (a.files.size() != 2) Die("roundtrip needs IN OUT");
  if (auto st = a.layout.Validate(); !st.ok()) Die(st.message());
  const std::vector<uint8_t> in = ReadFile(a.files[0]);
  const uint64_t ob = a.layout.Bytes();
  if (in.size() % ob != 0) Die("input is not a whole number of objects");
  const size_t n = in.size() / ob;
  std::vector<uint8_t> out(in.size());
  uint64_t enc_total = 0;
  std::vector<uint64_t> plane_bytes;
  double enc_s = 0, dec_s = 0;
  for (size_t i = 0; i < n; ++i) {
    std::span<const uint8_t> obj(in.data() + i * ob, ob);
    std::span<uint8_t> dst(out.data() + i * ob, ob);
    if (a.codec == "fp8") {
      std::vector<uint8_t> enc(Fp8EncodedBytes(a.layout));
      auto t0 = std::chrono::steady_clock::now();
      if (auto st = Fp8Encode(a.layout, obj, a.fp8, enc); !st.ok()) Die(st.message());
      auto t1 = std::chrono::steady_clock::now();
      if (auto st = Fp8Decode(enc, a.layout, a.fp8, dst); !st.ok()) Die(st.message());
      auto t2 = std::chrono::steady_clock::now();
      enc_s += std::chrono::duration<double>(t1 - t0).count();
      dec_s += std::chrono::duration<double>(t2 - t1).count();
      enc_total += enc.size();
      continue;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto enc = Encode(a.layout, obj, a.opt);
    auto t1 = std::chrono::steady_clock::now();
    if (!enc.ok()) Die(enc.status().message());
    if (auto st = Decode(*enc, dst, &a.layout, a.opt.threads); !st.ok()) Die(st.message());
    auto t2 = std::chrono::steady_clock::now();
    enc_s += std::chrono::duration<double>(t1 - t0).count();
    dec_s += std::chrono::duration<double>(t2 - t1).count();
    enc_total += enc->size();
    // Per-plane payload sizes from the header.
    auto h = format::ReadHeader(*enc);
    if (!h.ok()) Die(h.status().message());
    if (plane_bytes.empty()) plane_bytes.assign(h->planes.size(), 0);
    for (size_t p = 0; p < h->planes.size(); ++p) plane_bytes[p] += h->planes[p].payload_bytes;
  }
  WriteFile(a.files[1], out);
  printf("{\"objects\": %zu, \"raw_bytes\": %llu, \"encoded_bytes\": %llu, \"encode_s\": %.6f, "
         "\"decode_s\": %.6f, \"plane_bytes\": [",
         n, static_cast<unsigned long long>(in.size()), static_cast<unsigned long long>(enc_total), enc_s, dec_s);
  for (size_t p = 0; p < plane_bytes.size(); ++p) {
    printf("%s%llu", p ? ", " : "", static_cast<unsigned long long>(plane_bytes[p]));
  }
  printf("]}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = Parse(argc, argv);
  if (a.cmd == "roundtrip") return Roundtrip(a);
  if (a.cmd == "encode") {
    if (a.files.size() != 2) Die("encode needs IN OUT");
    auto enc = Encode(a.layout, ReadFile(a.files[0]), a.opt);
    if (!enc.ok()) Die(enc.status().message());
    WriteFile(a.files[1], *enc);
    return 0;
  }
  if (a.cmd == "decode") {
    if (a.files.size() != 2) Die("decode needs IN OUT");
    auto d = Decode(ReadFile(a.files[0]), a.opt.threads);
    if (!d.ok()) Die(d.status().message());
    WriteFile(a.files[1], d->bytes);
    return 0;
  }
  if (a.cmd == "inspect") {
    if (a.files.size() != 1) Die("inspect needs FILE");
    auto info = Inspect(ReadFile(a.files[0]));
    if (!info.ok()) Die(info.status().message());
    printf("format v%u, %s, %llu bytes encoded, anchor group %u\nplane bins:", info->format_version,
           info->layout.Describe().c_str(), static_cast<unsigned long long>(info->encoded_bytes),
           info->anchor_group);
    for (auto b : info->plane_bins) printf(" %u", b);
    printf("\n");
    return 0;
  }
  Die("unknown command " + a.cmd);
}
