// In-memory arrays as row sources: ArraySource reads the rows of a numpy
// array (a memmap, tensor.numpy()) in place, keeping the array alive.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings/engine_face.h"
#include "bindings/numpy_convert.h"
#include "bindings/registry.h"
#include "compose/indexed_request.h"
#include "core/error.h"
#include "sources/memory_row_source.h"

namespace py = pybind11;

namespace chute::bindings {

namespace {

std::shared_ptr<MemoryRowSource> make_array_source(const std::string& name, py::array array) {
  CHUTE_CHECK(array.ndim() >= 1, kUsage, "array '" << name << "' must have at least one dimension");
  const py::dtype type = array.dtype();
  const std::string str = py::str(type.attr("str")).cast<std::string>();
  DType dtype = DType::kU8;
  bool swap = false;
  // A type DType has no name for (complex, records, datetimes, strings)
  // travels as bytes that numpy views again as the type, named as .npy
  // files name it.
  std::string descr;
  if (!dtype_from_numpy_descr(str, &dtype, &swap)) {
    CHUTE_CHECK(!type.attr("hasobject").cast<bool>() && array.itemsize() > 0, kUsage,
                "array '" << name << "' has dtype " << py::str(type).cast<std::string>()
                          << ", which has no fixed size in bytes");
    const py::object literal = py::module_::import("numpy.lib.format").attr("dtype_to_descr")(type);
    descr = py::repr(literal).cast<std::string>();
  }
  CHUTE_CHECK(!swap, kUsage, "array '" << name << "' is not in native byte order");
  // Rows must be C-contiguous; the stride between rows may be anything.
  std::vector<int64_t> row_shape;
  py::ssize_t expect = array.itemsize();
  for (py::ssize_t d = array.ndim(); d-- > 1;) {
    CHUTE_CHECK(array.shape(d) <= 1 || array.strides(d) == expect, kUsage,
                "array '" << name << "' rows are not C-contiguous");
    expect *= array.shape(d);
  }
  for (py::ssize_t d = 1; d < array.ndim(); ++d) row_shape.push_back(array.shape(d));
  if (!descr.empty()) row_shape.push_back(array.itemsize());
  MemoryRowsRequest request;
  request.name = name;
  request.data = static_cast<const uint8_t*>(array.data());
  request.num_rows = array.shape(0);
  request.row_stride = array.strides(0);
  request.dtype = dtype;
  request.row_shape = std::move(row_shape);
  request.owner = keep_python_alive(array);
  request.element_descr = std::move(descr);
  return compose_memory_rows(std::move(request));
}

}  // namespace

void register_array(py::module_& m) {
  py::class_<MemoryRowSource, RowSource, std::shared_ptr<MemoryRowSource>>(
      m, "ArraySource", "Rows of an array the source keeps alive (numpy, memmap, tensor.numpy()).")
      .def(py::init(&make_array_source), py::arg("name"), py::arg("array"));
}

const BindingsFile kArrayBindings{"_core", "array", {"indexed"}, register_array};

}  // namespace chute::bindings
