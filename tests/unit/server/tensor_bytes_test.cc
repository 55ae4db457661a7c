// The sizes the daemon and the C++ client give wire tensors, and the checks on bad specs.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "salus/client.h"
#include "salus/v1/data_type.h"
#include "server/session_runtime.h"

namespace salus::server {
namespace {

v1::TensorSpec Spec(v1::DataType dtype, std::initializer_list<int64_t> shape) {
  v1::TensorSpec s;
  s.set_name("t");
  s.set_dtype(dtype);
  for (int64_t d : shape) s.add_shape(d);
  return s;
}

TEST(TensorBytesTest, EveryWireDtypeHasItsSizeOnBothSides) {
  const struct {
    v1::DataType wire;
    client::DType dtype;
    size_t size;
  } cases[] = {{v1::FLOAT32, client::DType::kFloat32, 4}, {v1::INT64, client::DType::kInt64, 8},
               {v1::INT32, client::DType::kInt32, 4},     {v1::FLOAT64, client::DType::kFloat64, 8},
               {v1::UINT8, client::DType::kUInt8, 1},     {v1::BOOL, client::DType::kBool, 1}};
  for (const auto& c : cases) {
    EXPECT_EQ(v1::DataTypeSize(c.wire), c.size) << v1::DataType_Name(c.wire);
    EXPECT_EQ(client::DTypeSize(c.dtype), c.size) << v1::DataType_Name(c.wire);
    auto bytes = TensorBytes(Spec(c.wire, {2, 3}));
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, 6 * c.size);
  }
  EXPECT_EQ(v1::DataTypeSize(v1::DATA_TYPE_UNSPECIFIED), 0u);
}

TEST(TensorBytesTest, BadSpecsAreInvalidArgumentNamingTheTensor) {
  for (const v1::TensorSpec& spec :
       {Spec(v1::DATA_TYPE_UNSPECIFIED, {1}), Spec(static_cast<v1::DataType>(99), {1}),
        Spec(v1::FLOAT32, {2, -1}), Spec(v1::FLOAT64, {int64_t{1} << 40, int64_t{1} << 40})}) {
    auto bytes = TensorBytes(spec);
    EXPECT_EQ(bytes.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bytes.status().message().find("'t'"), std::string::npos) << bytes.status();
  }
  EXPECT_TRUE(CheckFrame(Spec(v1::INT64, {3}), 24).ok());
  EXPECT_EQ(CheckFrame(Spec(v1::INT64, {3}), 12).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace salus::server
