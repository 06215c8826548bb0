#pragma once

/// The OPT names of the generic decoder shapes (models/decoder_spec.hpp), kept for callers
/// that only know OPT.
#include "models/decoder_spec.hpp"
