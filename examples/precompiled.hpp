// precompiled.hpp: the headers every program parses (Boost.Program_options,
// nlohmann/json, Eigen and the backends through common.hpp, the models and
// the trainer), precompiled once for the programs (examples/CMakeLists.txt).
// A program still includes what it uses.
#pragma once

#include "common.hpp"
#include "xfmr/infer/generate.hpp"
#include "xfmr/infer/weight_copies.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/models/language_model.hpp"
#include "xfmr/presets.hpp"
#include "xfmr/text/text.hpp"
#include "xfmr/layers/losses.hpp"
#include "xfmr/train/optimizers.hpp"
#include "xfmr/train/trainer.hpp"
