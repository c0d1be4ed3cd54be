#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <unordered_map>

#include "bindings/numpy_convert.h"
#include "bindings/registry.h"
#include "bindings/text.h"
#include "core/error.h"

namespace py = pybind11;

namespace chute::bindings {

py::dtype numpy_dtype(DType dtype) { return py::dtype(dtype_name(dtype)); }

py::dtype numpy_dtype(const std::string& descr) {
  // As np.load reads a header's descr; a batch's columns repeat a handful
  // of them, so each is built once (the GIL guards the cache).
  static auto* cache = new std::unordered_map<std::string, py::object>();
  auto it = cache->find(descr);
  if (it == cache->end()) {
    const py::object literal = py::module_::import("ast").attr("literal_eval")(descr);
    const py::object dtype =
        py::module_::import("numpy.lib.format").attr("descr_to_dtype")(literal);
    it = cache->emplace(descr, dtype).first;
  }
  return py::reinterpret_borrow<py::dtype>(it->second);
}

py::array tensor_to_numpy(const Tensor& tensor) {
  // An element only numpy names is the last axis of the bytes.
  const bool named = !tensor.descr.empty();
  const size_t ndim = tensor.shape.size() - (named ? 1 : 0);
  std::vector<py::ssize_t> shape(tensor.shape.begin(), tensor.shape.begin() + ndim);
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = static_cast<py::ssize_t>(named ? tensor.shape.back()
                                                      : static_cast<int64_t>(dtype_size(tensor.dtype)));
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  auto* owner = new std::shared_ptr<Block>(tensor.block);
  py::capsule base(owner, [](void* p) { delete static_cast<std::shared_ptr<Block>*>(p); });
  const py::dtype dtype = named ? numpy_dtype(tensor.descr) : numpy_dtype(tensor.dtype);
  return py::array(dtype, shape, strides, tensor.data(), base);
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

const BindingsFile kBatchBindings{"_core", "batch", {}, register_batch};

}  // namespace chute::bindings
