// Where a tensor's storage lives. Backends (engine/backend.h) are registered per DeviceType.
#pragma once

#include <cstdint>
#include <string>

namespace engine {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static constexpr Device cpu() { return Device{DeviceType::CPU, 0}; }
  static constexpr Device cuda(int i = 0) { return Device{DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;  // "cpu", "cuda:0"
};

const char* device_type_name(DeviceType t);

// "cpu", "cuda" (= cuda:0) or "cuda:N" -> Device; anything else throws an engine::Error that
// quotes the text and lists the accepted forms. Says nothing about whether the device exists.
Device parse_device(const std::string& text);

}  // namespace engine
