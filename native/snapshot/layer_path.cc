#include "snapshot/layer_path.h"

#include "base/state_io.h"

namespace torpor {

namespace {

// ".." as a whole component: "a/../b", "../a", "a/..". A name like "x..y" is fine.
bool has_dotdot_component(const std::string& p) {
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    if (p.compare(start, end - start, "..") == 0 && end - start == 2) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

void check_layer_path(const std::string& p) {
  bool ok = !p.empty() && p.size() <= kMaxLayerPath && p.find('\0') == std::string::npos && !has_dotdot_component(p);
  if (ok && p.front() == '/') ok = p.size() > 1;
  if (!ok) StateReader::fail("memory layer path '" + p + "' is neither a plain relative path nor a plain absolute one");
}

std::string resolve_layer_path(const std::string& dir, const std::string& p) {
  check_layer_path(p);
  return p.front() == '/' ? p : dir + "/" + p;
}

}  // namespace torpor
