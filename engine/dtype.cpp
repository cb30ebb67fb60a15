// DType properties and the device names.
#include "engine/dtype.h"
#include "engine/device.h"
#include "engine/error.h"

namespace engine {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  ENGINE_FAIL("[dtype] unknown dtype code ", static_cast<int>(t));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "?";
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}
bool is_integral(DType t) { return !is_floating(t); }

DType promote_floating(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::f64 || b == DType::f64) return DType::f64;
  return DType::f32;  // f32 with a half type, or bf16 with f16
}

const char* device_type_name(DeviceType t) { return t == DeviceType::CPU ? "cpu" : "cuda"; }

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 8) {
    int index = 0;
    for (size_t i = 5; i < text.size(); ++i) {
      if (text[i] < '0' || text[i] > '9') {
        index = -1;
        break;
      }
      index = index * 10 + (text[i] - '0');
    }
    if (index >= 0) return Device::cuda(index);
  }
  ENGINE_FAIL("[device] '", text, "' is not a device (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const {
  if (type == DeviceType::CPU) return "cpu";
  return std::string("cuda:") + std::to_string(index);
}

}  // namespace engine
