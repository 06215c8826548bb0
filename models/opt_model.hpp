#pragma once

/// The OPT names of the generic decoder stage (models/decoder_stage.hpp), kept for callers
/// that only know OPT.
#include "models/decoder_stage.hpp"
