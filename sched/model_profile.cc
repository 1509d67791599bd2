#include "sched/model_profile.h"

#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace gradlane::sched {
namespace {

using Json = nlohmann::json;

// Beyond these, sums of times in ns or byte counts times 1e9 would lose meaning long before
// they overflow; no real model comes near (1e12 µs is eleven days, 2^50 bytes a petabyte).
constexpr double kMaxMicros = 1e12;
constexpr double kMaxParamBytes = 1125899906842624.0;  // 2^50

std::string LayerWhere(size_t index, const std::string& name) {
  if (name.empty()) return absl::StrCat("layers[", index, "]");
  return absl::StrCat("layers[", index, "] (\"", name, "\")");
}

// Reads a non-negative, finite number of microseconds and converts it to ns.
absl::StatusOr<TimeNs> ReadMicros(const Json& obj, const char* field, const std::string& where) {
  auto it = obj.find(field);
  if (it == obj.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing field \"", field, "\""));
  }
  if (!it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field \"", field, "\" must be a number, got ", it->type_name()));
  }
  const double us = it->get<double>();
  if (!std::isfinite(us) || us < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field \"", field, "\" must be >= 0, got ", us));
  }
  if (us > kMaxMicros) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field \"", field, "\" is implausibly large: ", us));
  }
  return static_cast<TimeNs>(std::llround(us * 1000.0));
}

absl::StatusOr<uint64_t> ReadBytes(const Json& obj, const char* field, const std::string& where) {
  auto it = obj.find(field);
  if (it == obj.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing field \"", field, "\""));
  }
  if (it->is_number_unsigned()) {
    const uint64_t v = it->get<uint64_t>();
    if (static_cast<double>(v) > kMaxParamBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field \"", field, "\" is implausibly large: ", v));
    }
    return v;
  }
  if (it->is_number_integer()) {  // signed and not unsigned: negative
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field \"", field, "\" must be >= 0, got ", it->get<int64_t>()));
  }
  if (it->is_number_float()) {
    // Some generators write sizes as 37632.0; accept those, refuse fractions.
    const double v = it->get<double>();
    if (!std::isfinite(v) || v < 0 || v != std::floor(v) || v > kMaxParamBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": field \"", field, "\" must be a non-negative whole number, got ", v));
    }
    return static_cast<uint64_t>(v);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": field \"", field, "\" must be a non-negative integer, got ", it->type_name()));
}

}  // namespace

TimeNs ModelProfile::ForwardNs() const {
  TimeNs sum = 0;
  for (const ModelLayer& l : layers) sum += l.fwd_ns;
  return sum;
}

TimeNs ModelProfile::BackwardNs() const {
  TimeNs sum = 0;
  TimeNs last_ready = 0;
  for (const ModelLayer& l : layers) {
    sum += l.bwd_ns;
    last_ready = std::max(last_ready, l.ready_ns);
  }
  return std::max(sum, last_ready);
}

uint64_t ModelProfile::TotalParamBytes() const {
  uint64_t sum = 0;
  for (const ModelLayer& l : layers) sum += l.param_bytes;
  return sum;
}

absl::StatusOr<ModelProfile> ParseModelProfile(std::string_view json_text) {
  const Json root = Json::parse(json_text.begin(), json_text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError("model profile: not valid JSON");
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model profile: top level must be an object, got ", root.type_name()));
  }
  ModelProfile profile;

  auto model = root.find("model");
  if (model == root.end()) {
    return absl::InvalidArgumentError("model profile: missing field \"model\"");
  }
  if (!model->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model profile: field \"model\" must be a string, got ", model->type_name()));
  }
  profile.model = model->get<std::string>();

  // batch_size and reference document the profile; the simulation does not need them, so a
  // file may leave them out, but a present one must have the right type.
  if (auto it = root.find("batch_size"); it != root.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model profile: field \"batch_size\" must be a positive integer, got ", it->dump()));
    }
    profile.batch_size = it->get<int64_t>();
  }
  if (auto it = root.find("reference"); it != root.end()) {
    if (!it->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model profile: field \"reference\" must be a string, got ", it->type_name()));
    }
    profile.reference = it->get<std::string>();
  }

  auto layers = root.find("layers");
  if (layers == root.end()) {
    return absl::InvalidArgumentError("model profile: missing field \"layers\"");
  }
  if (!layers->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model profile: field \"layers\" must be an array, got ", layers->type_name()));
  }
  if (layers->empty()) {
    return absl::InvalidArgumentError("model profile: \"layers\" is empty");
  }

  size_t with_ready = 0;
  profile.layers.reserve(layers->size());
  for (size_t i = 0; i < layers->size(); ++i) {
    const Json& l = (*layers)[i];
    if (!l.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model profile: layers[", i, "] must be an object, got ", l.type_name()));
    }
    ModelLayer layer;
    auto name = l.find("name");
    if (name == l.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model profile: layers[", i, "]: missing field \"name\""));
    }
    if (!name->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("model profile: layers[", i,
                                                     "]: field \"name\" must be a string, got ",
                                                     name->type_name()));
    }
    layer.name = name->get<std::string>();
    const std::string where = absl::StrCat("model profile: ", LayerWhere(i, layer.name));

    absl::StatusOr<uint64_t> bytes = ReadBytes(l, "param_bytes", where);
    if (!bytes.ok()) return bytes.status();
    layer.param_bytes = *bytes;
    absl::StatusOr<TimeNs> fwd = ReadMicros(l, "fwd_us", where);
    if (!fwd.ok()) return fwd.status();
    layer.fwd_ns = *fwd;
    absl::StatusOr<TimeNs> bwd = ReadMicros(l, "bwd_us", where);
    if (!bwd.ok()) return bwd.status();
    layer.bwd_ns = *bwd;
    if (l.contains("ready_us")) {
      absl::StatusOr<TimeNs> ready = ReadMicros(l, "ready_us", where);
      if (!ready.ok()) return ready.status();
      layer.ready_ns = *ready;
      ++with_ready;
    }
    profile.layers.push_back(std::move(layer));
  }

  if (with_ready != 0 && with_ready != profile.layers.size()) {
    // Mixing given and derived ready times would put two timelines in one backward pass.
    for (size_t i = 0; i < layers->size(); ++i) {
      if (!(*layers)[i].contains("ready_us")) {
        return absl::InvalidArgumentError(
            absl::StrCat("model profile: ready_us is given for ", with_ready, " of ",
                         profile.layers.size(), " layers; give it for all or none (first missing: ",
                         LayerWhere(i, profile.layers[i].name), ")"));
      }
    }
  }
  // Each value is capped; their sums must be too, or a long profile could overflow TimeNs.
  long double total_us = 0;
  for (const ModelLayer& l : profile.layers) total_us += (l.fwd_ns + l.bwd_ns) / 1000.0L;
  if (total_us > kMaxMicros) {
    return absl::InvalidArgumentError(
        absl::StrCat("model profile: total fwd_us + bwd_us is implausibly large: ",
                     static_cast<double>(total_us)));
  }
  profile.explicit_ready_times = with_ready != 0;
  if (!profile.explicit_ready_times) {
    TimeNs cumulative = 0;
    for (size_t i = profile.layers.size(); i-- > 0;) {
      cumulative += profile.layers[i].bwd_ns;
      profile.layers[i].ready_ns = cumulative;
    }
  }
  return profile;
}

}  // namespace gradlane::sched
