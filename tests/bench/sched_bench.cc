#include <benchmark/benchmark.h>
BENCHMARK_MAIN();  // placeholder: being written
