#include "batching/sample_fields.h"

#include <algorithm>
#include <sstream>

namespace chute {
namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) os << ",";
  os << ")";
  return os.str();
}

// The row's type and shape as numpy would state them: an element only
// numpy names (descr) is its last axis of bytes here.
std::string type_string(const ProbedField& p) {
  return p.descr.empty() ? std::string(dtype_name(p.dtype)) : "dtype " + p.descr;
}

std::vector<int64_t> element_shape(const ProbedField& p) {
  if (p.descr.empty() || p.shape.empty()) return p.shape;
  return std::vector<int64_t>(p.shape.begin(), p.shape.end() - 1);
}

}  // namespace

SampleLocation SampleFields::location(const EncodedSample& sample,
                                      const SampleMember* member) const {
  return decoding_.locate(sample, member);
}

Error SampleFields::in_context(const Error& error, const EncodedSample& sample,
                               const SampleMember* member) const {
  if (sample.in_place) {
    sample.in_place->refresh();
    if (sample.in_place->lost(sample)) return sample.in_place->lost_error(sample);
  }
  // A decoder called without a place of its own starts its message with its
  // own words (At in core/error.h): the place goes in front, and beside it
  // as data, with the scope a member that does not decode has.
  const SampleLocation at = location(sample, member);
  return error.with_prefix(at.text + ": ").scoped(ErrorScope::kMember, at.place);
}

void SampleFields::probe(PlannedSample& sample) const {
  const EncodedSample& enc = sample.encoded;
  sample.fields.resize(decoding_.fields.size());
  for (size_t i = 0; i < decoding_.fields.size(); ++i) {
    const FieldPlan& f = decoding_.fields[i];
    ProbedField& p = sample.fields[i];
    p.member = -1;
    for (const std::string& ext : f.extensions) {
      for (size_t m = 0; m < enc.members.size(); ++m) {
        if (enc.members[m].extension == ext) {
          p.member = static_cast<int>(m);
          break;
        }
      }
      if (p.member >= 0) break;
    }
    if (p.member < 0) {
      if (f.optional) {
        p.dtype = DType::kU8;  // nothing left over from a sample probed before
        p.shape.clear();
        p.descr.clear();
        continue;
      }
      const SampleLocation at = location(enc, nullptr);
      for (const SampleMember& null : enc.nulls) {
        if (std::find(f.extensions.begin(), f.extensions.end(), null.extension) !=
            f.extensions.end()) {
          throw Error(ErrorKind::kData, at.text + ": column '" + null.name + "' is null",
                      __FILE__, __LINE__, ErrorScope::kField, at.place);
        }
      }
      std::string wanted;
      for (size_t k = 0; k < f.extensions.size(); ++k) wanted += (k ? ";" : "") + f.extensions[k];
      std::ostringstream os;
      os << at.text << ": field '" << f.name << "' not found (wanted one of " << wanted
         << "; sample has ";
      for (size_t m = 0; m < enc.members.size(); ++m) {
        os << (m ? ", " : "") << enc.members[m].extension;
      }
      os << ")";
      throw Error(ErrorKind::kData, os.str(), __FILE__, __LINE__, ErrorScope::kField, at.place);
    }
    if (f.decoder == nullptr) continue;  // raw bytes: nothing to probe
    const SampleMember& member = enc.members[static_cast<size_t>(p.member)];
    with_context(enc, &member, [&] {
      f.decoder->probe(enc.bytes() + member.data_begin, member.data_size, p);
    });
  }
}

size_t SampleFields::decoded_bytes(const PlannedSample& sample) const {
  size_t bytes = 0, claimed = 0;
  for (size_t i = 0; i < decoding_.fields.size() && i < sample.fields.size(); ++i) {
    const ProbedField& p = sample.fields[i];
    if (p.member < 0) continue;
    const size_t member_bytes = sample.encoded.members[static_cast<size_t>(p.member)].data_size;
    claimed += member_bytes;
    if (decoding_.fields[i].decoder == nullptr) {
      bytes += member_bytes;
      continue;
    }
    size_t n = dtype_size(p.dtype);
    for (int64_t d : p.shape) n *= static_cast<size_t>(d);
    bytes += n;
  }
  // Members no field claims are copied out too when the plan keeps them.
  if (decoding_.keep_other_members) bytes += sample.encoded.payload_bytes - std::min(claimed, sample.encoded.payload_bytes);
  return bytes;
}

std::optional<Error> SampleFields::incompatibility(const PlannedSample& first,
                                                   const PlannedSample& other) const {
  for (size_t i = 0; i < decoding_.fields.size(); ++i) {
    const FieldPlan& f = decoding_.fields[i];
    if (!f.stack || f.decoder == nullptr) continue;
    const ProbedField& a = first.fields[i];
    const ProbedField& b = other.fields[i];
    if (a.member < 0 || b.member < 0) continue;
    if (a.dtype == b.dtype && a.shape == b.shape && a.descr == b.descr) continue;
    const SampleMember& m = other.encoded.members[static_cast<size_t>(b.member)];
    const SampleLocation at = location(other.encoded, &m);
    std::ostringstream os;
    os << at.text << ": field '" << f.name << "' has " << type_string(b)
       << " shape " << shape_string(element_shape(b)) << " but this batch holds "
       << type_string(a) << " shape " << shape_string(element_shape(a))
       << " (set an output size to resize images, or batch variable shapes as lists)";
    return Error(ErrorKind::kData, os.str(), __FILE__, __LINE__, ErrorScope::kBatch, at.place);
  }
  return std::nullopt;
}

}  // namespace chute
