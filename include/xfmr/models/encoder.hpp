// encoder.hpp: Encoder<Cfg, Backend>, a bidirectional transformer encoder:
// the non-causal Transformer trunk (see transformer.hpp), with a key-padding
// mask for variable-length batches.
#pragma once

#include "xfmr/models/transformer.hpp"

namespace xfmr {

template <BlockConfig Cfg, class Backend>
using Encoder = Transformer<Cfg, Backend, false>;

}  // namespace xfmr
