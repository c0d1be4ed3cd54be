// Wrapping engine memory as numpy arrays without a copy.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "batching/batch.h"

namespace chute::bindings {

// A numpy array viewing `tensor`; the array keeps the tensor's block alive.
pybind11::array tensor_to_numpy(const Tensor& tensor);

// Column as Python: stacked → one array, list → list of arrays, bytes → list
// of bytes; absent rows (dict-style samples) become None.
pybind11::object column_to_python(const Column& column);

pybind11::dtype numpy_dtype(DType dtype);
// The dtype of an .npy descr literal (NpyHeader::descr, Tensor::descr).
pybind11::dtype numpy_dtype(const std::string& descr);

}  // namespace chute::bindings
