// What the Python drop-in layer needs beyond the engine's own bindings.
//
// Names from tar headers as Python strings that never fail to convert. Tar
// member names are bytes; webdataset (Python's tarfile) decodes them as UTF-8
// with "surrogateescape", so a name that is not valid UTF-8 still gives a key
// (its stray bytes as U+DC80..U+DCFF) instead of a UnicodeDecodeError. Keys
// and extensions are decoded that way here; messages, which are read by
// people, show stray bytes as \xNN.
//
// Whole files mapped for numpy (ArrayDataset's .npy paths) through MappedFile,
// so that a file cut while mapped reads as zeros past its new end instead of
// killing the process with SIGBUS, and the cut is seen by check_size().
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "batching/batch.h"
#include "bindings/errors.h"
#include "bindings/owned_stream_engine.h"
#include "bindings/registry.h"
#include "core/error.h"
#include "engine/stream_engine.h"
#include "io/mapped_region.h"
#include "io/unique_fd.h"

namespace py = pybind11;

namespace chute::bindings {
namespace {

py::str decode_utf8(const std::string& s, const char* errors) {
  PyObject* out = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), errors);
  if (out == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(out);
}

py::str name_str(const std::string& s) { return decode_utf8(s, "surrogateescape"); }

}  // namespace

void register_dropin(py::module_& m) {
  m.def(
      "_batch_keys",
      [](const Batch& batch) {
        py::list out(batch.keys.size());
        for (size_t i = 0; i < batch.keys.size(); ++i) out[i] = name_str(batch.keys[i]);
        return out;
      },
      "Batch.keys() with tar names decoded as webdataset decodes them (UTF-8, surrogateescape).");
  m.def(
      "_batch_other_members",
      [](const Batch& batch) {
        py::list rows(batch.other_members.size());
        for (size_t i = 0; i < batch.other_members.size(); ++i) {
          py::dict d;
          for (const auto& [ext, payload] : batch.other_members[i]) d[name_str(ext)] = py::bytes(payload);
          rows[i] = d;
        }
        return rows;
      },
      "Batch.other_members() with extensions decoded as webdataset decodes them.");
  m.def(
      "_take_skipped",
      [](OwnedStreamEngine& owned) {
        const std::vector<SkippedSample> skipped =
            owned.here() ? owned.get().take_skipped() : std::vector<SkippedSample>{};
        py::list out(skipped.size());
        for (size_t i = 0; i < skipped.size(); ++i) out[i] = python_skipped(skipped[i]);
        return out;
      },
      "The exceptions of the samples the engine skipped since the last call, oldest first, "
      "with their scope and place as attributes (see chute.common.errors).");

  py::class_<MappedFile, std::shared_ptr<MappedFile>>(
      m, "_MappedFile", py::buffer_protocol(),
      "A whole file mapped read-only; pages past a new end read as zeros (see check_size).")
      .def_buffer([](MappedFile& f) {
        return py::buffer_info(const_cast<uint8_t*>(f.data()), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(f.size())}, {1}, /*readonly=*/true);
      })
      .def_property_readonly("size", &MappedFile::size)
      .def_property_readonly("valid_size", &MappedFile::valid_size)
      .def("check_size", &MappedFile::check_size,
           "Looks at the file's size now; True when it is shorter than when mapped.");
  m.def(
      "_map_file",
      [](const std::string& path) -> std::shared_ptr<MappedFile> {
        uint64_t size = 0;
        const UniqueFd fd = open_for_mapping(path, &size);
        return MappedFile::map(fd.get(), size);
      },
      py::arg("path"),
      "The file mapped whole, or None when it is empty or cannot be mapped (too many at once).");
}

const BindingsFile kDropinBindings{"_core", "dropin", {"batch", "stream"}, register_dropin};

}  // namespace chute::bindings
