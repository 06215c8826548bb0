#pragma once

// A declared model's decoder shape, torch-free: what the OPT/Llama engine builds and what
// serve's flags (--max-model-len) edit.
#include <caf/expected.hpp>

#include "actors/messages.hpp"
#include "models/decoder_spec.hpp"

namespace computron::actors {

/// The model's shape: its own (a Hugging Face config.json's, as `arch` or OPT's `shape`)
/// or a catalogue entry, of the family its kind names. Errors: an unknown catalogue name,
/// a malformed shape, or a shape of another family than the kind.
caf::expected<models::decoder_spec> decoder_spec_of(const model_config& cfg);

}  // namespace computron::actors
