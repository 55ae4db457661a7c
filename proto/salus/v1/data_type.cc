#include "salus/v1/data_type.h"

namespace salus::v1 {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case FLOAT32:
    case INT32:
      return 4;
    case INT64:
    case FLOAT64:
      return 8;
    case UINT8:
    case BOOL:
      return 1;
    default:
      return 0;
  }
}

}  // namespace salus::v1
