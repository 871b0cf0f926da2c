// Freezes the DLPack 1.4 C ABI as declared in include/tensorwire/dlpack.hpp (x86_64 / LP64). A consumer compiled
// against the official dlpack.h reads our structs through these exact offsets, so any change here is an ABI break.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>

#include "tensorwire/dlpack.hpp"
#include "tensorwire/dtype.hpp"

namespace {

static_assert(sizeof(void*) == 8, "these offsets are the LP64 layout");

// ---- version ---------------------------------------------------------------------------------------------------
static_assert(DLPACK_MAJOR_VERSION == 1);
static_assert(DLPACK_MINOR_VERSION == 4);
// tensorwire's own names for what its headers use (defined whichever dlpack.h came first) agree with the spec's.
static_assert(TW_DLPACK_MAJOR_VERSION == DLPACK_MAJOR_VERSION && TW_DLPACK_MINOR_VERSION == DLPACK_MINOR_VERSION);
static_assert(TW_DL_BCOMPLEX == kDLBcomplex);
static_assert(sizeof(DLPackVersion) == 8);
static_assert(offsetof(DLPackVersion, major) == 0);
static_assert(offsetof(DLPackVersion, minor) == 4);
static_assert(std::is_same_v<decltype(DLPackVersion::major), uint32_t>);
static_assert(std::is_same_v<decltype(DLPackVersion::minor), uint32_t>);

// ---- device ----------------------------------------------------------------------------------------------------
static_assert(sizeof(DLDeviceType) == 4);
static_assert(sizeof(DLDevice) == 8);
static_assert(alignof(DLDevice) == 4);
static_assert(offsetof(DLDevice, device_type) == 0);
static_assert(offsetof(DLDevice, device_id) == 4);
static_assert(std::is_same_v<decltype(DLDevice::device_id), int32_t>);

static_assert(kDLCPU == 1);
static_assert(kDLCUDA == 2);
static_assert(kDLCUDAHost == 3);
static_assert(kDLOpenCL == 4);
static_assert(kDLVulkan == 7);
static_assert(kDLMetal == 8);
static_assert(kDLVPI == 9);
static_assert(kDLROCM == 10);
static_assert(kDLROCMHost == 11);
static_assert(kDLExtDev == 12);
static_assert(kDLCUDAManaged == 13);
static_assert(kDLOneAPI == 14);
static_assert(kDLWebGPU == 15);
static_assert(kDLHexagon == 16);
static_assert(kDLMAIA == 17);
static_assert(kDLTrn == 18);
static_assert(kDLTPU == 19);
static_assert(kDLTPUHost == 20);
static_assert(kDLAscend == 21);

// ---- dtype -----------------------------------------------------------------------------------------------------
static_assert(sizeof(DLDataType) == 4);
static_assert(alignof(DLDataType) == 2);
static_assert(offsetof(DLDataType, code) == 0);
static_assert(offsetof(DLDataType, bits) == 1);
static_assert(offsetof(DLDataType, lanes) == 2);
static_assert(std::is_same_v<decltype(DLDataType::code), uint8_t>);
static_assert(std::is_same_v<decltype(DLDataType::bits), uint8_t>);
static_assert(std::is_same_v<decltype(DLDataType::lanes), uint16_t>);

static_assert(kDLInt == 0);
static_assert(kDLUInt == 1);
static_assert(kDLFloat == 2);
static_assert(kDLOpaqueHandle == 3);
static_assert(kDLBfloat == 4);
static_assert(kDLComplex == 5);
static_assert(kDLBool == 6);
static_assert(kDLFloat8_e3m4 == 7);
static_assert(kDLFloat8_e4m3 == 8);
static_assert(kDLFloat8_e4m3b11fnuz == 9);
static_assert(kDLFloat8_e4m3fn == 10);
static_assert(kDLFloat8_e4m3fnuz == 11);
static_assert(kDLFloat8_e5m2 == 12);
static_assert(kDLFloat8_e5m2fnuz == 13);
static_assert(kDLFloat8_e8m0fnu == 14);
static_assert(kDLFloat6_e2m3fn == 15);
static_assert(kDLFloat6_e3m2fn == 16);
static_assert(kDLFloat4_e2m1fn == 17);
static_assert(kDLBcomplex == 18);

// ---- DLTensor --------------------------------------------------------------------------------------------------
static_assert(sizeof(DLTensor) == 48);
static_assert(alignof(DLTensor) == 8);
static_assert(offsetof(DLTensor, data) == 0);
static_assert(offsetof(DLTensor, device) == 8);
static_assert(offsetof(DLTensor, ndim) == 16);
static_assert(offsetof(DLTensor, dtype) == 20);
static_assert(offsetof(DLTensor, shape) == 24);
static_assert(offsetof(DLTensor, strides) == 32);
static_assert(offsetof(DLTensor, byte_offset) == 40);
static_assert(std::is_same_v<decltype(DLTensor::ndim), int32_t>);
static_assert(std::is_same_v<decltype(DLTensor::shape), int64_t*>);
static_assert(std::is_same_v<decltype(DLTensor::strides), int64_t*>);
static_assert(std::is_same_v<decltype(DLTensor::byte_offset), uint64_t>);

// ---- DLManagedTensor (legacy) ----------------------------------------------------------------------------------
static_assert(sizeof(DLManagedTensor) == 64);
static_assert(offsetof(DLManagedTensor, dl_tensor) == 0);
static_assert(offsetof(DLManagedTensor, manager_ctx) == 48);
static_assert(offsetof(DLManagedTensor, deleter) == 56);
static_assert(std::is_same_v<decltype(DLManagedTensor::deleter), void (*)(DLManagedTensor*)>);

// ---- DLManagedTensorVersioned ----------------------------------------------------------------------------------
static_assert(sizeof(DLManagedTensorVersioned) == 80);

// ---- the C exchange API (DLPack 1.2+) ----------------------------------------------------------------------------
static_assert(sizeof(DLPackExchangeAPIHeader) == 16);
static_assert(offsetof(DLPackExchangeAPIHeader, version) == 0);
static_assert(offsetof(DLPackExchangeAPIHeader, prev_api) == 8);
static_assert(sizeof(DLPackExchangeAPI) == 56);
static_assert(offsetof(DLPackExchangeAPI, header) == 0);
static_assert(offsetof(DLPackExchangeAPI, managed_tensor_allocator) == 16);
static_assert(offsetof(DLPackExchangeAPI, managed_tensor_from_py_object_no_sync) == 24);
static_assert(offsetof(DLPackExchangeAPI, managed_tensor_to_py_object_no_sync) == 32);
static_assert(offsetof(DLPackExchangeAPI, dltensor_from_py_object_no_sync) == 40);
static_assert(offsetof(DLPackExchangeAPI, current_work_stream) == 48);
static_assert(std::is_same_v<DLPackManagedTensorFromPyObjectNoSync, int (*)(void*, DLManagedTensorVersioned**)>);
static_assert(std::is_same_v<DLPackManagedTensorToPyObjectNoSync, int (*)(DLManagedTensorVersioned*, void**)>);
static_assert(std::is_same_v<DLPackDLTensorFromPyObjectNoSync, int (*)(void*, DLTensor*)>);
static_assert(std::is_same_v<DLPackCurrentWorkStream, int (*)(DLDeviceType, int32_t, void**)>);
static_assert(std::is_same_v<DLPackManagedTensorAllocator,
                             int (*)(DLTensor*, DLManagedTensorVersioned**, void*, void (*)(void*, const char*, const char*))>);
static_assert(offsetof(DLManagedTensorVersioned, version) == 0);
static_assert(offsetof(DLManagedTensorVersioned, manager_ctx) == 8);
static_assert(offsetof(DLManagedTensorVersioned, deleter) == 16);
static_assert(offsetof(DLManagedTensorVersioned, flags) == 24);
static_assert(offsetof(DLManagedTensorVersioned, dl_tensor) == 32);
static_assert(std::is_same_v<decltype(DLManagedTensorVersioned::flags), uint64_t>);
static_assert(std::is_same_v<decltype(DLManagedTensorVersioned::deleter), void (*)(DLManagedTensorVersioned*)>);

static_assert(DLPACK_FLAG_BITMASK_READ_ONLY == 1);
static_assert(DLPACK_FLAG_BITMASK_IS_COPIED == 2);
static_assert(DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED == 4);

// All structs cross a C boundary: they must be trivially copyable standard-layout types.
static_assert(std::is_standard_layout_v<DLTensor> && std::is_trivially_copyable_v<DLTensor>);
static_assert(std::is_standard_layout_v<DLManagedTensor> && std::is_trivially_copyable_v<DLManagedTensor>);
static_assert(std::is_standard_layout_v<DLManagedTensorVersioned> &&
              std::is_trivially_copyable_v<DLManagedTensorVersioned>);

// tw::DType mirrors DLDataType field for field.
static_assert(sizeof(tw::DType) == sizeof(DLDataType));

// Reads a little-endian integer of N bytes at `p`.
template <class T>
T load(const unsigned char* p) {
  T v{};
  for (size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>(v | static_cast<T>(static_cast<T>(p[i]) << (8 * i)));
  return v;
}

}  // namespace

// The static_asserts above freeze declarations; this checks the bytes a C consumer would actually read.
TEST(AbiLayout, VersionedStructBytesAreWhereTheSpecPutsThem) {
  int64_t shape[2] = {3, 4};
  int64_t strides[2] = {4, 1};
  alignas(8) unsigned char storage[sizeof(DLManagedTensorVersioned)];
  auto* m = new (storage) DLManagedTensorVersioned{};
  m->version = DLPackVersion{1, 3};
  m->flags = DLPACK_FLAG_BITMASK_READ_ONLY | DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
  m->dl_tensor.device = DLDevice{kDLCUDAManaged, 7};
  m->dl_tensor.ndim = 2;
  m->dl_tensor.dtype = tw::DType::bfloat16().to_dlpack();
  m->dl_tensor.shape = shape;
  m->dl_tensor.strides = strides;
  m->dl_tensor.byte_offset = 0x1122334455667788ull;

  EXPECT_EQ(load<uint32_t>(storage + 0), 1u);
  EXPECT_EQ(load<uint32_t>(storage + 4), 3u);
  EXPECT_EQ(load<uint64_t>(storage + 24), 5u);
  EXPECT_EQ(load<uint32_t>(storage + 32 + 8), static_cast<uint32_t>(kDLCUDAManaged));
  EXPECT_EQ(load<uint32_t>(storage + 32 + 12), 7u);
  EXPECT_EQ(load<uint32_t>(storage + 32 + 16), 2u);
  EXPECT_EQ(storage[32 + 20], static_cast<unsigned char>(kDLBfloat));
  EXPECT_EQ(storage[32 + 21], 16);
  EXPECT_EQ(load<uint16_t>(storage + 32 + 22), 1u);
  EXPECT_EQ(load<uint64_t>(storage + 32 + 24), reinterpret_cast<uintptr_t>(shape));
  EXPECT_EQ(load<uint64_t>(storage + 32 + 32), reinterpret_cast<uintptr_t>(strides));
  EXPECT_EQ(load<uint64_t>(storage + 32 + 40), 0x1122334455667788ull);
}

TEST(AbiLayout, DTypeToDlpackKeepsCodeBitsLanes) {
  tw::DType d{static_cast<uint8_t>(kDLFloat), 32, 4};
  DLDataType dl = d.to_dlpack();
  EXPECT_EQ(dl.code, kDLFloat);
  EXPECT_EQ(dl.bits, 32);
  EXPECT_EQ(dl.lanes, 4);
}
