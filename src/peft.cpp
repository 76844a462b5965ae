// peft.cpp: peft's adapter directory in and out (io/peft.hpp), and the
// LoRA templates of models/lora.hpp, compiled once for the CPU backend
// (LoRA's only one until it has run on a GPU).
#include "xfmr/io/peft.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/core/error.hpp"

namespace xfmr {


namespace detail {

// The base's Hugging Face module names: GPT-2's or Llama's.
inline bool peft_gpt2(const ModelDims& d) { return !d.parts.rope(); }

// An xfmr target's peft module name and the reverse.
inline const std::vector<std::pair<std::string, std::string>>& peft_modules(bool gpt2) {
  static const std::vector<std::pair<std::string, std::string>> llama = {
      {"q", "self_attn.q_proj"}, {"k", "self_attn.k_proj"}, {"v", "self_attn.v_proj"}, {"o", "self_attn.o_proj"},
      {"gate", "mlp.gate_proj"}, {"up", "mlp.up_proj"},     {"down", "mlp.down_proj"}};
  static const std::vector<std::pair<std::string, std::string>> gpt = {
      {"qkv", "attn.c_attn"}, {"o", "attn.c_proj"}, {"fc1", "mlp.c_fc"}, {"down", "mlp.c_proj"}};
  return gpt2 ? gpt : llama;
}
inline std::string peft_module(bool gpt2, std::string_view target) {
  for (const auto& [t, m] : peft_modules(gpt2))
    if (t == target) return m;
  std::string known;
  for (const auto& [t, m] : peft_modules(gpt2)) known += (known.empty() ? "" : ", ") + t;
  detail::fail("LoRA target '", target, "' has no module in ", gpt2 ? "GPT-2" : "Llama",
               "'s Hugging Face layout (peft's format takes ", known, ")");
}
// The key of an adapter tensor ("lora_A" or "lora_B") of block i's target.
inline std::string peft_key(bool gpt2, int block, std::string_view target, std::string_view which) {
  return std::string("base_model.model.") + (gpt2 ? "transformer.h." : "model.layers.") + std::to_string(block) +
         "." + peft_module(gpt2, target) + "." + std::string(which) + ".weight";
}
inline int block_of(std::string_view linear_name) {  // "blocks.3.attn.qkv" -> 3
  return std::stoi(std::string(linear_name.substr(7, linear_name.find('.', 7) - 7)));
}
// Row r of an xfmr q or k projection: the row of Hugging Face's (rotary
// pairs against rotate-half halves, heads of `head` rows).
inline std::int64_t hf_row(std::int64_t r, int head) {
  const std::int64_t h = r / head, j = r % head;
  return h * head + (j % 2) * (head / 2) + j / 2;
}

}  // namespace detail

template <class Backend>
std::vector<AttachedFile> peft_adapter_files(LanguageModel<Backend>& model, const LoraOptions& o) {
  using S = typename Backend::Scalar;
  const ModelDims d = model.dims();
  const bool gpt2 = detail::peft_gpt2(d);
  SafeTensorsWriter w;
  std::vector<std::string> targets;
  std::size_t adapters = 0;
  model.visit_adapters([&](std::string_view name, LinearAdapters<Backend>& linear, auto&) {
    for (auto& x : linear.list()) {
      if (x.id != 0) continue;  // the model's own adapter (those loaded beside it are others' files)
      const int block = detail::block_of(name);
      const std::int64_t in = x.a.dim(1);
      std::vector<S> a(x.a.size()), b(x.b.size());
      x.a.copy_to_host(a.data());
      x.b.copy_to_host(b.data());
      std::vector<float> fa(a.begin(), a.end()), fb(b.size());
      const bool pairs = !gpt2 && (x.name == "q" || x.name == "k");
      for (std::int64_t r = 0; r < x.width; ++r)
        for (int k = 0; k < x.rank; ++k)
          fb[std::size_t((pairs ? detail::hf_row(r, d.qk_head()) : r) * x.rank + k)] = float(b[std::size_t(r * x.rank + k)]);
      w.add<float>(detail::peft_key(gpt2, block, x.name, "lora_A"), {x.rank, in}, fa);
      w.add<float>(detail::peft_key(gpt2, block, x.name, "lora_B"), {x.width, x.rank}, fb);
      if (std::find(targets.begin(), targets.end(), x.name) == targets.end()) targets.push_back(x.name);
      ++adapters;
    }
  });
  require(adapters > 0, "a peft adapter: the model has no LoRA adapters");
  nlohmann::json modules = nlohmann::json::array();
  const auto has = [&](const char* t) { return std::find(targets.begin(), targets.end(), t) != targets.end(); };
  for (const std::string& t : targets) {
    const std::string m = detail::peft_module(gpt2, t), last = m.substr(m.find('.') + 1);
    if (gpt2 && (t == "o" || t == "down")) {  // GPT-2's two c_proj: one name (peft matches a name's end) or each's own
      if (!(has("o") && has("down"))) modules.push_back(m);
      else if (t == "o") modules.push_back(last);
    } else {
      modules.push_back(last);
    }
  }
  const nlohmann::json c = {{"peft_type", "LORA"},         {"task_type", "CAUSAL_LM"},
                            {"r", o.rank},                 {"lora_alpha", o.alpha},
                            {"lora_dropout", o.dropout},   {"target_modules", modules},
                            {"fan_in_fan_out", gpt2},      {"bias", "none"},
                            {"use_rslora", o.rslora},      {"use_dora", false},
                            {"modules_to_save", nullptr},  {"layers_to_transform", nullptr},
                            {"rank_pattern", nlohmann::json::object()},
                            {"alpha_pattern", nlohmann::json::object()},
                            {"init_lora_weights", true},   {"inference_mode", true},
                            {"base_model_name_or_path", nullptr}};
  const std::string text = c.dump(2) + "\n";
  std::vector<std::byte> config(text.size());
  std::memcpy(config.data(), text.data(), text.size());
  return {{"adapter_config.json", std::move(config)}, {"adapter_model.safetensors", w.serialize()}};
}

template <class Backend>
void save_peft_adapter(LanguageModel<Backend>& model, const LoraOptions& o, const std::filesystem::path& dir,
                       bool overwrite) {
  namespace fs = std::filesystem;
  require(!dir.empty(), "save_peft_adapter: no directory named (an empty path)");
  require(overwrite || (!fs::exists(dir / "adapter_model.safetensors") && !fs::exists(dir / "adapter_config.json")),
          dir.string(), " holds an adapter already (overwrite replaces it)");
  const std::vector<AttachedFile> files = peft_adapter_files(model, o);
  fs::create_directories(dir);
  for (const AttachedFile& f : files) {
    std::ofstream out(dir / f.name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(f.bytes.data()), std::streamsize(f.bytes.size()));
    require(out.good(), "could not write ", (dir / f.name).string());
  }
}

template <class Backend>
LoraOptions load_peft_adapter(LanguageModel<Backend>& model, const std::filesystem::path& dir, int id) {
  using S = typename Backend::Scalar;
  const std::filesystem::path config_file = dir / "adapter_config.json";
  std::ifstream in(config_file);
  require(in.good(), "no peft adapter in ", dir.string(), " (no adapter_config.json)");
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    detail::fail(config_file.string(), ": not JSON (", e.what(), ")");
  }
  const std::string src = config_file.string();
  require(c.is_object() && c.value("peft_type", "") == "LORA", src, ": peft_type is not \"LORA\"");
  const auto absent_or = [&](const char* key, const auto& ok) {
    return !c.contains(key) || c[key].is_null() || ok(c[key]);
  };
  require(absent_or("use_dora", [](const auto& v) { return v == false; }), src, ": use_dora (DoRA) is not LoRA");
  require(absent_or("bias", [](const auto& v) { return v == "none"; }), src, ": bias ", c.value("bias", nlohmann::json()).dump(),
          " trains biases; xfmr's adapters have none");
  require(absent_or("modules_to_save", [](const auto& v) { return v.empty(); }), src,
          ": modules_to_save (whole modules trained beside the adapters) is not supported");
  require(absent_or("layers_to_transform", [](const auto&) { return false; }), src,
          ": layers_to_transform (adapters on some layers only) is not supported");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    require(absent_or(key, [](const auto& v) { return v.empty(); }), src, ": ", key,
            " (a rank or alpha a module) is not supported");
  require(c.contains("r") && c["r"].is_number_integer() && c["r"].template get<long>() >= 1, src,
          ": r must be a positive integer");
  require(c.contains("lora_alpha") && c["lora_alpha"].is_number(), src, ": lora_alpha must be a number");
  const ModelDims d = model.dims();
  const bool gpt2 = detail::peft_gpt2(d);
  // GPT-2's Conv1D weights are (in, out): peft sets fan_in_fan_out for them (and corrects it when not
  // set); the Linear projections of Llama's layout take none.
  require(gpt2 || absent_or("fan_in_fan_out", [](const auto& v) { return v == false; }), src,
          ": fan_in_fan_out is for GPT-2's Conv1D weights; this model's projections are Linear");
  LoraOptions o{.rank = c["r"].template get<int>(),
                .alpha = c["lora_alpha"].template get<double>(),
                .rslora = c.value("use_rslora", false),
                .targets = {},
                .dropout = c.value("lora_dropout", 0.0)};
  require(c.contains("target_modules") && c["target_modules"].is_array(), src,
          ": target_modules must be a list of module names (a regular expression is not supported)");
  for (const auto& m : c["target_modules"]) {
    require(m.is_string(), src, ": target_modules holds ", m.dump(), ", not a module name");
    const std::string name = m.template get<std::string>();
    std::vector<std::string> found;
    for (const auto& [t, module] : detail::peft_modules(gpt2))
      if (module == name || module.ends_with("." + name)) found.push_back(t);
    require(!found.empty(), src, ": target module '", name, "' is no projection of ", gpt2 ? "GPT-2" : "Llama",
            "'s Hugging Face layout");
    for (const std::string& t : found)
      if (std::find(o.targets.begin(), o.targets.end(), t) == o.targets.end()) o.targets.push_back(t);
  }
  require(o.dropout >= 0 && o.dropout < 1, src, ": lora_dropout ", o.dropout, " outside [0, 1)");
  const SafeTensors file = SafeTensors::load(dir / "adapter_model.safetensors");
  LoraOptions placed = o;  // read to decode with (or to merge): no dropout drawn, whatever the file trained with
  placed.dropout = 0;
  add_lora(model, placed, 0, id);
  std::size_t read = 0;
  try {
    model.visit_adapters([&](std::string_view name, LinearAdapters<Backend>& linear, auto&) {
      for (auto& x : linear.list()) {
        if (x.id != id) continue;
        const int block = detail::block_of(name);
        const std::string ka = detail::peft_key(gpt2, block, x.name, "lora_A"),
                          kb = detail::peft_key(gpt2, block, x.name, "lora_B");
        require(file.contains(ka) && file.contains(kb), file.source(), ": no ", file.contains(ka) ? kb : ka,
                " (target_modules names it)");
        std::vector<float> a(x.a.size()), b(x.b.size());
        file.copy_to<float>(ka, {x.rank, x.a.dim(1)}, a);
        file.copy_to<float>(kb, {x.width, x.rank}, b);
        const bool pairs = !gpt2 && (x.name == "q" || x.name == "k");
        std::vector<S> sa(a.begin(), a.end()), sb(b.size());
        for (std::int64_t r = 0; r < x.width; ++r)
          for (int k = 0; k < x.rank; ++k)
            sb[std::size_t(r * x.rank + k)] = S(b[std::size_t((pairs ? detail::hf_row(r, d.qk_head()) : r) * x.rank + k)]);
        for (const S v : sa) require(std::isfinite(double(v)), ka, " holds a value that is not finite");
        for (const S v : sb) require(std::isfinite(double(v)), kb, " holds a value that is not finite");
        x.a.copy_from_host(sa.data());
        x.b.copy_from_host(sb.data());
        read += 2;
      }
    });
    for (const std::string& n : file.names())
      require(n.find(".lora_A.weight") != std::string::npos || n.find(".lora_B.weight") != std::string::npos, file.source(),
              ": tensor '", n, "' is not a LoRA adapter's");
    require(read == file.names().size(), file.source(), " holds ", file.names().size(), " tensors; target_modules ",
            "names ", read);
  } catch (...) {
    model.visit_adapters([&](std::string_view, LinearAdapters<Backend>& linear, auto&) { linear.clear(id); });
    if (id == 0) model.freeze_base(false);
    throw;
  }
  return o;
}


XFMR_PEFT(template, CpuBackend<float>)
XFMR_LORA(template, CpuBackend<float>)

}  // namespace xfmr
