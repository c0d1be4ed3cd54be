#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/numpy_convert.h"
#include "bindings/registry.h"
#include "bindings/text.h"
#include "core/error.h"

namespace py = pybind11;

namespace chute::bindings {

py::dtype numpy_dtype(DType dtype) { return py::dtype(dtype_name(dtype)); }

py::array tensor_to_numpy(const Tensor& tensor) {
  std::vector<py::ssize_t> shape(tensor.shape.begin(), tensor.shape.end());
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = static_cast<py::ssize_t>(dtype_size(tensor.dtype));
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  auto* owner = new std::shared_ptr<Block>(tensor.block);
  py::capsule base(owner, [](void* p) { delete static_cast<std::shared_ptr<Block>*>(p); });
  return py::array(numpy_dtype(tensor.dtype), shape, strides, tensor.data(), base);
}

py::object column_to_python(const Column& column) {
  auto present = [&](size_t i) { return column.present.empty() || column.present[i] != 0; };
  switch (column.kind) {
    case ColumnKind::kStacked:
      return tensor_to_numpy(column.stacked);
    case ColumnKind::kList: {
      py::list out(column.items.size());
      for (size_t i = 0; i < column.items.size(); ++i) {
        out[i] = present(i) ? py::object(tensor_to_numpy(column.items[i])) : py::none();
      }
      return out;
    }
    case ColumnKind::kBytes: {
      py::list out(column.raw.size());
      for (size_t i = 0; i < column.raw.size(); ++i) {
        out[i] = present(i) ? py::object(py::bytes(column.raw[i])) : py::none();
      }
      return out;
    }
  }
  return py::none();
}

void register_batch(py::module_& m) {
  py::class_<Batch>(m, "Batch", "One batch from the engine, column by column.")
      .def_readonly("sequence", &Batch::sequence)
      .def_readonly("size", &Batch::size)
      .def_property_readonly("num_columns", [](const Batch& b) { return b.columns.size(); })
      .def("column", [](const Batch& b, size_t i) {
        CHUTE_CHECK(i < b.columns.size(), kUsage, "column " << i << " out of range");
        return column_to_python(b.columns[i]);
      })
      .def("keys", [](const Batch& b) { return name_list(b.keys); })
      .def("source_indices", [](const Batch& b) { return b.source_index; })
      .def("other_members", [](const Batch& b) {
        py::list rows(b.other_members.size());
        for (size_t i = 0; i < b.other_members.size(); ++i) {
          py::dict d;
          for (const auto& [ext, payload] : b.other_members[i]) d[name_text(ext)] = py::bytes(payload);
          rows[i] = d;
        }
        return rows;
      });
}

}  // namespace chute::bindings
