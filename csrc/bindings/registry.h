// Bindings files register themselves: each defines its part of a module in
// one function and names it, at file scope, with a BindingsFile object (the
// parts it needs defined first, too, as their types appear in its
// signatures); the module's init calls define_registered_bindings, so a new
// bindings file edits no central list:
//
//   const BindingsFile kTarBindings{"_core", "tar", {"remote"}, register_tar};
//
// The registrations run while the extension is loaded, before its init, and
// each extension (_core, chute_testing) keeps its own list: the functions
// below are inline, and an extension's symbols are its own (hidden).
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"

namespace chute::bindings {

using DefineBindings = void (*)(pybind11::module_&);

struct RegisteredBindings {
  std::string module;  // the extension it belongs to: "_core" or "chute_testing"
  std::string name;    // how other parts name it in `after`
  std::vector<std::string> after;
  DefineBindings define;
};

inline std::vector<RegisteredBindings>& registered_bindings() {
  static std::vector<RegisteredBindings> all;  // built on first use: any file may register first
  return all;
}

class BindingsFile {
 public:
  BindingsFile(const char* module, const char* name, std::initializer_list<const char*> after,
               DefineBindings define) {
    registered_bindings().push_back(
        RegisteredBindings{module, name, std::vector<std::string>(after.begin(), after.end()),
                           define});
  }
};

// Defines on `m` every part registered for `module`, each after the parts
// it names; among the parts ready at once, in name order, so that every
// build defines them in the same order. A name that no part of `module`
// has, or parts that wait on each other, fail the import with the names.
inline void define_registered_bindings(pybind11::module_& m, const char* module) {
  std::vector<const RegisteredBindings*> pending;
  for (const auto& part : registered_bindings()) {
    if (part.module == module) pending.push_back(&part);
  }
  std::sort(pending.begin(), pending.end(),
            [](const auto* a, const auto* b) { return a->name < b->name; });
  for (const auto* part : pending) {
    for (const auto& needed : part->after) {
      const bool known = std::any_of(pending.begin(), pending.end(),
                                     [&](const auto* other) { return other->name == needed; });
      CHUTE_CHECK(known, kUsage,
                  "bindings '" << part->name << "' of " << module << " is to follow '" << needed
                               << "', which no bindings file of " << module << " registers");
    }
  }
  std::vector<std::string> defined;
  while (!pending.empty()) {
    auto ready = std::find_if(pending.begin(), pending.end(), [&](const auto* part) {
      return std::all_of(part->after.begin(), part->after.end(), [&](const std::string& needed) {
        return std::find(defined.begin(), defined.end(), needed) != defined.end();
      });
    });
    if (ready == pending.end()) {
      std::string waiting;
      for (const auto* part : pending) waiting += (waiting.empty() ? "'" : ", '") + part->name + "'";
      CHUTE_CHECK(false, kUsage, "bindings " << waiting << " of " << module
                                             << " wait on each other (their `after` lists)");
    }
    (*ready)->define(m);
    defined.push_back((*ready)->name);
    pending.erase(ready);
  }
}

}  // namespace chute::bindings
