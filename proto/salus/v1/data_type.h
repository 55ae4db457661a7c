// What the wire's dtypes mean, written once for the daemon and the C++ client.
#pragma once

#include <cstddef>

#include "salus/v1/salus.pb.h"

namespace salus::v1 {

// Bytes per element of a wire dtype; 0 for an unspecified or unknown one.
size_t DataTypeSize(DataType dtype);

}  // namespace salus::v1
