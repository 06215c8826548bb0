#pragma once

// The crash report computron prints on a fatal signal (crash_report.cpp).
namespace computron::app {

/// On SIGSEGV, SIGBUS, SIGFPE and SIGILL, prints where the process died on stderr (on its
/// own stack, so a stack overflow still reports; scripts/gpu-check symbolizes the
/// computron+0xOFFSET addresses), then dies of the signal as before.
void install_crash_report();

}  // namespace computron::app
