{
  # Sources are listed by the shell so that a new file in any native/ folder is
  # built without touching this file. Tests (native/test) and fuzzers
  # (native/fuzz) have their own Makefiles and are not part of the addon.
  "targets": [
    {
      "target_name": "torpor",
      "sources": [
        "<!@(find native/common native/base native/addon native/vmm native/devices native/snapshot -name '*.cc' -not -name '*_test.cc' | sort)"
      ],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")",
        "native"
      ],
      "defines": [
        "NAPI_VERSION=8",
        "NODE_ADDON_API_DISABLE_DEPRECATED",
        "NODE_ADDON_API_ENABLE_MAYBE"
      ],
      # C++ exceptions are enabled inside the addon but never cross the N-API
      # boundary: every entry point catches and converts to a TorporError.
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti", "-std=gnu++17", "-std=c++17"],
      "cflags": ["-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"],
      "cflags_cc": ["-std=c++20", "-fexceptions", "-frtti", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
      "ldflags": ["-pthread"],
      "libraries": ["-lpthread"]
    }
  ]
}
