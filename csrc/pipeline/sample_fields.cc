#include "pipeline/sample_fields.h"

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

}  // namespace

std::string SampleFields::location(const EncodedSample& sample, const SampleMember* member) const {
  return decoding_.locate(sample, member);
}

Error SampleFields::in_context(const Error& error, const EncodedSample& sample,
                               const SampleMember* member) const {
  if (sample.in_place) {
    sample.in_place->refresh();
    if (sample.in_place->lost(sample)) return sample.in_place->lost_error(sample);
  }
  std::string where = location(sample, member);
  // A decoder called without a place of its own starts its message with ": ".
  if (error.message().compare(0, 2, ": ") != 0) where += ": ";
  return error.with_prefix(where);
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
        continue;
      }
      std::string wanted;
      for (size_t k = 0; k < f.extensions.size(); ++k) wanted += (k ? ";" : "") + f.extensions[k];
      std::ostringstream names;
      for (size_t m = 0; m < enc.members.size(); ++m) names << (m ? ", " : "") << enc.members[m].extension;
      CHUTE_CHECK(false, kData, location(enc, nullptr) << ": field '" << f.name << "' not found (wanted one of "
                                                       << wanted << "; sample has " << names.str() << ")");
    }
    if (f.decoder == nullptr) continue;  // raw bytes: nothing to probe
    const SampleMember& member = enc.members[static_cast<size_t>(p.member)];
    with_context(enc, &member, [&] {
      f.decoder->probe(enc.bytes() + member.data_begin, member.data_size, p);
    });
  }
}

std::optional<Error> SampleFields::incompatibility(const PlannedSample& first,
                                                   const PlannedSample& other) const {
  for (size_t i = 0; i < decoding_.fields.size(); ++i) {
    const FieldPlan& f = decoding_.fields[i];
    if (!f.stack || f.decoder == nullptr) continue;
    const ProbedField& a = first.fields[i];
    const ProbedField& b = other.fields[i];
    if (a.member < 0 || b.member < 0) continue;
    if (a.dtype == b.dtype && a.shape == b.shape) continue;
    const SampleMember& m = other.encoded.members[static_cast<size_t>(b.member)];
    std::ostringstream os;
    os << location(other.encoded, &m) << ": field '" << f.name << "' has " << dtype_name(b.dtype)
       << " shape " << shape_string(b.shape) << " but this batch holds " << dtype_name(a.dtype)
       << " shape " << shape_string(a.shape)
       << " (set an output size to resize images, or batch variable shapes as lists)";
    return Error(ErrorKind::kData, os.str(), __FILE__, __LINE__);
  }
  return std::nullopt;
}

}  // namespace chute
