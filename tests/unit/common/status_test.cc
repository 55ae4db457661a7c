#include "salus/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace salus {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, ErrorCarriesCodeAndMessage) {
  Status s = InvalidArgumentError("bad size '12XB'");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "bad size '12XB'");
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: bad size '12XB'");
}

TEST(StatusTest, OkDropsMessage) {
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
}

TEST(StatusTest, CodeNamesRoundTrip) {
  for (int i = 0; i <= 16; ++i) {
    const auto code = static_cast<StatusCode>(i);
    StatusCode back{};
    ASSERT_TRUE(StatusCodeFromName(StatusCodeName(code), &back)) << i;
    EXPECT_EQ(back, code);
  }
  EXPECT_EQ(StatusCodeName(StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(99)), "UNKNOWN");
  StatusCode c{};
  EXPECT_FALSE(StatusCodeFromName("NOT_A_CODE", &c));
}

TEST(StatusTest, WithContextPrefixesMessage) {
  EXPECT_EQ(NotFoundError("x").WithContext("loading model").message(), "loading model: x");
  EXPECT_TRUE(OkStatus().WithContext("anything").ok());
}

TEST(StatusOrTest, HoldsValue) {
  StatusOr<int> v = 42;
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 42);
  EXPECT_TRUE(v.status().ok());
}

TEST(StatusOrTest, HoldsError) {
  StatusOr<int> v = ResourceExhaustedError("full");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(v.value_or(7), 7);
}

TEST(StatusOrTest, OkStatusBecomesInternal) {
  StatusOr<int> v = OkStatus();
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
}

TEST(StatusOrTest, MoveOnlyValue) {
  StatusOr<std::unique_ptr<int>> v = std::make_unique<int>(5);
  ASSERT_TRUE(v.ok());
  std::unique_ptr<int> p = std::move(v).value();
  EXPECT_EQ(*p, 5);
}

Status FailsIfNegative(int x) {
  if (x < 0) return OutOfRangeError("negative");
  return OkStatus();
}

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd");
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  SALUS_RETURN_IF_ERROR(FailsIfNegative(x));
  SALUS_ASSIGN_OR_RETURN(int h, Half(x));
  SALUS_ASSIGN_OR_RETURN(h, Half(h));
  return h;
}

TEST(StatusMacrosTest, PropagateFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(-4).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(Quarter(6).status().code(), StatusCode::kInvalidArgument);  // 6/2 = 3 is odd
  EXPECT_EQ(Quarter(5).status().message(), "odd");
}

}  // namespace
}  // namespace salus
