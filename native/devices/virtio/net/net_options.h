// What a machine's network device is made of (MachineConfig::net).
#pragma once

#include <string>

namespace torpor {

struct NetOptions {
  std::string mac;             // "52:54:00:xx:xx:xx"
  std::string backend_socket;  // passt's Unix socket; empty: no backend yet (link down)
};

}  // namespace torpor
