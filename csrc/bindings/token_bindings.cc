// Token files and the packer whose fields the indexed engine gathers as rows
// (python/chute/datasets/tokens.py builds TokenDataset on them).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings/registry.h"
#include "compose/indexed_request.h"
#include "core/error.h"
#include "tokens/token_file.h"
#include "tokens/token_packer.h"

namespace py = pybind11;

namespace chute::bindings {

namespace {

TokenFormat parse_format(const std::string& name) {
  if (name == "raw") return TokenFormat::kRaw;
  if (name == "npy") return TokenFormat::kNpy;
  if (name == "megatron") return TokenFormat::kMegatron;
  CHUTE_CHECK(false, kUsage, "token file format '" << name << "' is not raw, npy or megatron");
}

DType parse_token_dtype(const std::string& name) {
  for (DType t : {DType::kU8, DType::kI8, DType::kU16, DType::kI16, DType::kU32, DType::kI32,
                  DType::kI64}) {
    if (name == dtype_name(t)) return t;
  }
  CHUTE_CHECK(false, kUsage, "token dtype '" << name << "' is not an integer type");
}

const char* format_name(TokenFormat f) {
  switch (f) {
    case TokenFormat::kRaw: return "raw";
    case TokenFormat::kNpy: return "npy";
    case TokenFormat::kMegatron: return "megatron";
  }
  return "";
}

std::shared_ptr<TokenPacker> make_packer(const std::vector<std::shared_ptr<const TokenFile>>& files,
                                         int64_t seq_len, const std::string& mode,
                                         int64_t eod_id, int64_t pad_id, int64_t vocab_size,
                                         const std::string& out_dtype, int64_t window_stride) {
  PackOptions o;
  o.seq_len = seq_len;
  o.window_stride = window_stride;
  CHUTE_CHECK(mode == "windows" || mode == "documents", kUsage,
              "pack must be 'windows' or 'documents', not '" << mode << "'");
  o.mode = mode == "windows" ? PackMode::kWindows : PackMode::kDocuments;
  o.eod_id = eod_id;
  o.pad_id = pad_id;
  o.vocab_size = vocab_size;
  o.out_dtype = parse_token_dtype(out_dtype);
  return std::make_shared<TokenPacker>(files, o);
}

}  // namespace

void register_tokens(py::module_& m) {
  py::class_<TokenFile, std::shared_ptr<TokenFile>>(
      m, "TokenFile",
      "A file of token ids, mapped and checked (raw .bin, .npy, Megatron .bin+.idx).")
      .def(py::init([](const std::string& path, const std::string& format, const std::string& dtype,
                       const std::string& index_path) {
             const TokenFormat f = parse_format(format);
             CHUTE_CHECK(f != TokenFormat::kRaw || !dtype.empty(), kUsage,
                         "'" << path << "': a raw token file has no header: give its dtype");
             // .npy and .idx files name their own dtype; kU16 is never read for them.
             const DType t = dtype.empty() ? DType::kU16 : parse_token_dtype(dtype);
             // Released here, not by a call guard, which would also cover
             // pybind11's registration of the new instance (GIL-guarded).
             py::gil_scoped_release release;
             auto file = TokenFile::open(path, f, t, index_path);
             return std::const_pointer_cast<TokenFile>(file);
           }),
           py::arg("path"), py::arg("format"), py::arg("dtype") = "", py::arg("index_path") = "",
           "Maps `path` (format 'raw', 'npy' or 'megatron'; `dtype` names a raw file's element "
           "type; `index_path` is a Megatron .bin's .idx). DataError names the file and byte "
           "offset of a bad layout.")
      .def_property_readonly("path", &TokenFile::path)
      .def_property_readonly("index_path", &TokenFile::index_path)
      .def_property_readonly("format", [](const TokenFile& f) { return format_name(f.format()); })
      .def_property_readonly("dtype", [](const TokenFile& f) { return dtype_name(f.dtype()); })
      .def_property_readonly("size", &TokenFile::size)
      .def_property_readonly("num_tokens", &TokenFile::num_tokens)
      .def_property_readonly("num_sequences",
                             [](const TokenFile& f) { return f.sequences().size(); })
      .def_property_readonly(
          "num_documents",
          [](const TokenFile& f) -> int64_t {
            const auto& d = f.document_starts();
            return d.empty() ? -1 : static_cast<int64_t>(d.size()) - 1;
          },
          "Megatron documents (-1 for files whose documents are found by their end token).")
      .def_property_readonly(
          "sequence_modes",
          [](const TokenFile& f) -> py::object {
            const std::vector<uint8_t>& modes = f.sequence_modes();
            if (modes.empty()) return py::none();
            py::array_t<uint8_t> out(static_cast<py::ssize_t>(modes.size()));
            std::copy(modes.begin(), modes.end(), out.mutable_data());
            return py::object(std::move(out));
          },
          "A Megatron multimodal .idx's mode of each sequence (uint8), None for other files.");

  py::class_<TokenPacker, std::shared_ptr<TokenPacker>>(
      m, "TokenPacker", "Sequences of seq_len tokens cut from token files (windows or documents).")
      .def(py::init([](const std::vector<std::shared_ptr<TokenFile>>& files, int64_t seq_len,
                       const std::string& mode, int64_t eod_id, int64_t pad_id,
                       int64_t vocab_size, const std::string& out_dtype, int64_t window_stride) {
             std::vector<std::shared_ptr<const TokenFile>> held(files.begin(), files.end());
             // As TokenFile's: the GIL comes back before pybind11 registers the packer.
             py::gil_scoped_release release;
             return make_packer(held, seq_len, mode, eod_id, pad_id, vocab_size, out_dtype,
                                window_stride);
           }),
           py::arg("files"), py::arg("seq_len"), py::arg("mode") = "windows",
           py::arg("eod_id") = -1, py::arg("pad_id") = 0, py::arg("vocab_size") = 0,
           py::arg("out_dtype") = "int64", py::arg("window_stride") = 0,
           "Plans the sequences (scanning for eod_id where documents end at it). Windows start "
           "every `window_stride` tokens (0: seq_len; 1: every start, for random offsets).")
      .def_property_readonly("num_sequences", &TokenPacker::num_sequences)
      .def_property_readonly("num_tokens", &TokenPacker::num_tokens)
      .def_property_readonly(
          "num_documents",
          [](const TokenPacker& p) {
            py::gil_scoped_release release;  // a first call packing windows scans the files
            return p.num_documents();
          },
          "Documents as Megatron counts them (empty ones too); windows "
                             "packing finds them at the first call (0 when not bounded).")
      .def_property_readonly("documents_known", &TokenPacker::documents_known,
                             "Whether the files bound the documents (every file's .idx, or "
                             "eod_id).")
      .def_property_readonly("pad_tokens", &TokenPacker::pad_tokens)
      .def_property_readonly("unused_tokens", &TokenPacker::unused_tokens)
      .def(
          "document_lengths",
          [](const TokenPacker& p) {
            std::vector<int64_t> lengths;
            {
              py::gil_scoped_release release;  // a first call packing windows scans the files
              lengths = p.document_lengths();
            }
            py::array_t<int64_t> out(static_cast<py::ssize_t>(lengths.size()));
            std::copy(lengths.begin(), lengths.end(), out.mutable_data());
            return out;
          },
          "Tokens of each document, in stream order (empty documents too).")
      .def(
          "source",
          [](const std::shared_ptr<TokenPacker>& p, const std::string& field) {
            return compose_token_field(p, field);
          },
          py::arg("field"),
          "The row source of one field: 'input_ids', 'labels', 'position_ids', or 'window' "
          "(windows packing: seq_len + 1 tokens, input_ids and labels in one row).");
}

const BindingsFile kTokensBindings{"_core", "tokens", {}, register_tokens};

}  // namespace chute::bindings
