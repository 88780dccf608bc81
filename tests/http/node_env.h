// The npm packages of tests/http/package.json, installed once per test run into the build folder. Tests that
// compare against a JavaScript reference or drive a real client call this; a failing npm install fails the test.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace paged::test {

/// Copies tests/http/{package.json,*.mjs} to PAGED_BINARY_DIR/http-node, runs `npm install` there and returns the
/// folder (scripts run from it resolve node_modules). Throws std::runtime_error when npm fails.
inline std::filesystem::path install_node_packages() {
  namespace fs = std::filesystem;
  static const fs::path dir = [] {
    const fs::path src = fs::path(PAGED_SOURCE_DIR) / "tests" / "http";
    const fs::path dst = fs::path(PAGED_BINARY_DIR) / "http-node";
    fs::create_directories(dst);
    for (const auto& entry : fs::directory_iterator(src)) {
      const auto ext = entry.path().extension();
      if (entry.path().filename() == "package.json" || ext == ".mjs") {
        fs::copy_file(entry.path(), dst / entry.path().filename(), fs::copy_options::overwrite_existing);
      }
    }
    const std::string cmd = "cd '" + dst.string() + "' && npm install --no-audit --no-fund --loglevel=error > npm-install.log 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      throw std::runtime_error("npm install failed in " + dst.string() + " (see npm-install.log there)");
    }
    return dst;
  }();
  return dir;
}

}  // namespace paged::test
