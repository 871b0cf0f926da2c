#include "tensorwire/device.hpp"

#include <charconv>
#include <string>

#include "tensorwire/error.hpp"

namespace tw {
namespace {

struct NamedDevice {
  const char* name;
  DLDeviceType type;
};

constexpr NamedDevice kDevices[] = {
    {"cpu", kDLCPU},         {"cuda", kDLCUDA},       {"cuda_host", kDLCUDAHost}, {"opencl", kDLOpenCL},
    {"vulkan", kDLVulkan},   {"metal", kDLMetal},     {"vpi", kDLVPI},            {"rocm", kDLROCM},
    {"rocm_host", kDLROCMHost}, {"ext_dev", kDLExtDev}, {"cuda_managed", kDLCUDAManaged},
    {"oneapi", kDLOneAPI},   {"webgpu", kDLWebGPU},   {"hexagon", kDLHexagon},    {"maia", kDLMAIA},
    {"trn", kDLTrn},         {"tpu", kDLTPU},         {"tpu_host", kDLTPUHost},   {"ascend", kDLAscend},
};

}  // namespace

const char* Device::type_name() const noexcept {
  for (const auto& d : kDevices)
    if (d.type == type) return d.name;
  return "unknown";
}

Device Device::from_dlpack(DLDevice d) {
  const int t = static_cast<int>(d.device_type);
  const bool known = t == kDLCPU || t == kDLCUDA || t == kDLCUDAHost || (t >= kDLOpenCL && t <= kDLAscend && t != 5 && t != 6);
  if (!known)
    throw Error(ErrorCode::unsupported,
                "DLPack device type " + std::to_string(static_cast<int>(d.device_type)) + " is not a DLPack 1.4 device");
  if (d.device_id < 0)
    throw Error(ErrorCode::invalid_argument, "DLPack device id " + std::to_string(d.device_id) + " is negative");
  // The host is one device: a producer numbering its CPU "devices" (JAX with several host devices says kDLCPU:2)
  // still hands over memory of the one address space. Kept as cpu:2 it named a device that does not exist.
  if (d.device_type == kDLCPU) return Device::cpu();
  return Device{d.device_type, d.device_id};
}

Device Device::from_string(std::string_view s) {
  std::string_view name = s;
  int32_t id = 0;
  if (auto colon = s.find(':'); colon != std::string_view::npos) {
    name = s.substr(0, colon);
    std::string_view num = s.substr(colon + 1);
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), id);
    if (num.empty() || ec != std::errc() || p != num.data() + num.size() || id < 0)
      throw Error(ErrorCode::invalid_argument,
                  "device '" + std::string(s) + "': the part after ':' must be a non-negative device number");
  }
  if (name == "cpu" && id != 0)  // (to("cpu:1") copied and gave cpu: the host is one device)
    throw Error(ErrorCode::invalid_argument,
                "device '" + std::string(s) + "' does not exist: the host is one device, 'cpu' (cpu:0)");
  for (const auto& k : kDevices)
    if (name == k.name) return Device{k.type, id};
  std::string all;
  for (const auto& k : kDevices) all += std::string(all.empty() ? "" : ", ") + k.name;
  throw Error(ErrorCode::invalid_argument, "unknown device '" + std::string(s) + "'; expected one of " + all +
                                               ", optionally followed by ':<id>' (e.g. 'cuda:1')");
}

std::string Device::str() const {
  if (type == kDLCPU && id == 0) return "cpu";
  return std::string(type_name()) + ":" + std::to_string(id);
}

}  // namespace tw
