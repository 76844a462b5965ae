// architecture.cpp: a language model's architecture as JSON (io/architecture.hpp).
#include "xfmr/io/architecture.hpp"

#include <nlohmann/json.hpp>

#include "json_bounds.hpp"

using json = nlohmann::json;

namespace xfmr {

namespace {

const char* scaling_name(RopeScaling::Kind k) {
  switch (k) {
    case RopeScaling::none: return "none";
    case RopeScaling::linear: return "linear";
    case RopeScaling::llama3: return "llama3";
  }
  return "none";
}

}  // namespace

std::string architecture_json(const PresetInfo& p) {
  const json j = {
      {"name", p.name},
      {"parts",
       {{"pre_norm", p.parts.pre_norm},
        {"rms_norm", p.parts.rms_norm},
        {"activation", std::string(p.parts.activation_name())},
        {"positions", std::string(p.parts.positions_name())}}},
      {"dims",
       {{"max_t", p.max_t},
        {"d_model", p.d_model},
        {"n_heads", p.n_heads},
        {"n_kv_heads", p.kv_heads()},
        {"n_layers", p.n_layers},
        {"d_ff", p.d_ff},
        {"qk_head_dim", p.qk_head_dim},
        {"v_head_dim", p.v_head_dim},
        {"norm_eps", p.norm_eps},
        {"rope_theta", p.rope_theta},
        {"rope_scaling",
         {{"kind", scaling_name(p.rope_scaling.kind)},
          {"factor", p.rope_scaling.factor},
          {"low_freq_factor", p.rope_scaling.low_freq_factor},
          {"high_freq_factor", p.rope_scaling.high_freq_factor},
          {"original_max_t", p.rope_scaling.original_max_t}}},
        {"bias", p.bias},
        {"qkv_bias", p.qkv_bias}}},
      {"dropout", p.dropout}};
  return j.dump();
}

PresetInfo architecture_from_json(std::string_view text, const std::string& source) {
  const json j = detail::parse_json_object(text, source, "an architecture");
  auto field = [&](const json& o, const char* key, const std::string& where) -> const json& {
    require(o.is_object() && o.contains(key), source, ": the architecture has no ", where, key);
    return o[key];
  };
  auto boolean = [&](const json& o, const char* key, const std::string& where) {
    const json& v = field(o, key, where);
    require(v.is_boolean(), source, ": ", where, key, " ", v.dump(), " is not true or false");
    return v.get<bool>();
  };
  auto string = [&](const json& o, const char* key, const std::string& where) {
    const json& v = field(o, key, where);
    require(v.is_string(), source, ": ", where, key, " ", v.dump(), " is not a string");
    return v.get<std::string>();
  };
  auto integer = [&](const json& o, const char* key, std::int64_t lo, std::int64_t hi) {
    return int(detail::json_integer(field(o, key, "dims."), lo, hi, source + ": dims." + key));
  };
  auto number = [&](const json& o, const char* key, double lo, double hi, const std::string& where) {
    const json& v = field(o, key, where);
    require(v.is_number() && v.get<double>() >= lo && v.get<double>() <= hi, source, ": ", where, key, " ", v.dump(),
            " is not a number in [", lo, ", ", hi, "]");
    return v.get<double>();
  };
  PresetInfo p;
  p.name = string(j, "name", "");
  const json& parts = field(j, "parts", "");
  p.parts.pre_norm = boolean(parts, "pre_norm", "parts.");
  p.parts.rms_norm = boolean(parts, "rms_norm", "parts.");
  p.parts.activation = ModelParts::activation_named(string(parts, "activation", "parts."), source + ": parts.activation");
  p.parts.positions = ModelParts::positions_named(string(parts, "positions", "parts."), source + ": parts.positions");
  const json& d = field(j, "dims", "");
  p.max_t = integer(d, "max_t", 1, 1 << 24);
  p.d_model = integer(d, "d_model", 1, 1 << 16);
  p.n_heads = integer(d, "n_heads", 1, 1 << 10);
  p.n_kv_heads = integer(d, "n_kv_heads", 1, 1 << 10);
  p.n_layers = integer(d, "n_layers", 1, 1 << 10);
  p.d_ff = integer(d, "d_ff", 1, 1 << 20);
  p.qk_head_dim = integer(d, "qk_head_dim", 0, 1 << 16);
  p.v_head_dim = integer(d, "v_head_dim", 0, 1 << 16);
  p.norm_eps = number(d, "norm_eps", 1e-30, 1, "dims.");
  p.rope_theta = number(d, "rope_theta", 1, 1e12, "dims.");
  const json& rs = field(d, "rope_scaling", "dims.");
  const std::string kind = string(rs, "kind", "dims.rope_scaling.");
  if (kind == "linear") p.rope_scaling.kind = RopeScaling::linear;
  else if (kind == "llama3") p.rope_scaling.kind = RopeScaling::llama3;
  else require(kind == "none", source, ": dims.rope_scaling.kind '", kind, "' is none of none, linear, llama3");
  p.rope_scaling.factor = number(rs, "factor", 1, 1e6, "dims.rope_scaling.");
  p.rope_scaling.low_freq_factor = number(rs, "low_freq_factor", 0, 1e6, "dims.rope_scaling.");
  p.rope_scaling.high_freq_factor = number(rs, "high_freq_factor", 0, 1e6, "dims.rope_scaling.");
  p.rope_scaling.original_max_t = int(detail::json_integer(field(rs, "original_max_t", "dims.rope_scaling."), 1,
                                                           1 << 24, source + ": dims.rope_scaling.original_max_t"));
  p.bias = boolean(d, "bias", "dims.");
  p.qkv_bias = boolean(d, "qkv_bias", "dims.");
  p.dropout = float(number(j, "dropout", 0, 0.99, ""));
  try {
    p.dims().check();
  } catch (const Error& e) {
    detail::fail(source, ": ", e.what());
  }
  return p;
}

PresetInfo architecture_of(const Metadata& metadata, const std::filesystem::path& source) {
  if (const auto it = metadata.find("architecture"); it != metadata.end())
    return architecture_from_json(it->second, source.string() + ": architecture");
  return LanguageModelPresets::info(metadata_value(metadata, "preset", source));
}

}  // namespace xfmr
