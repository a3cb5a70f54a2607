// How ddl's C++ shims (shim.cpp, compiled/package.cpp) return libtorch's exceptions to Rust:
// a function returns nullptr, or an error message the caller frees with `ddl_free_error`.
#pragma once

#include <cstdlib>
#include <cstring>
#include <exception>

namespace ddl {

inline char* message(const char* what) {
  return strdup(what ? what : "unknown libtorch error");
}

// Runs `f`; nullptr, or the message of what it threw.
template <typename F>
char* guarded(F f) {
  try {
    f();
    return nullptr;
  } catch (const std::exception& e) {
    return message(e.what());
  } catch (...) {
    return message(nullptr);
  }
}

}  // namespace ddl
