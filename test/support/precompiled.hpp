// precompiled.hpp: the headers most suites parse, precompiled once for every
// test target (test/CMakeLists.txt, target_precompile_headers). Boost.Test
// stays out: its header defines the module's main() when BOOST_TEST_MODULE
// is set, which differs per executable. A suite still includes what it uses;
// a build with -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON checks that it does.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "xfmr/backend/cpu.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/models/classifier.hpp"
#include "xfmr/models/decoder.hpp"
#include "xfmr/models/seq2seq.hpp"
#include "xfmr/text/text.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/trainer.hpp"
