// The GPU test binary (ctest label gpu): every CUDA kernel against its CPU twin. Needs a CUDA device.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
