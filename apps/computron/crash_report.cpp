// The crash report: on a fatal signal, where the process died (the faulting address, the
// instruction, return addresses found on the stack, a backtrace) on stderr before it dies.
#include "apps/computron/crash_report.hpp"

#include <dlfcn.h>
#include <execinfo.h>
#include <ucontext.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <vector>

namespace computron::app {

namespace {

/// A crash report on stderr before the process dies: where, not just "Segmentation
/// fault", so a crash on a machine without a debugger still says where it happened. It
/// runs on its own stack (a stack overflow still reports) and also names the faulting
/// address, the instruction pointer and the return addresses found on the stack: when
/// the crash jumped to a bad address, backtrace() stops at the signal frame and those
/// words are the only trace of the caller.
void report_crash(int sig, siginfo_t* info, void* context) {
  char line[256];
  auto say = [&](const char* text) { (void)!::write(2, text, std::strlen(text)); };
  auto name = [&](const char* what, const void* addr) {
    Dl_info di{};
    if (::dladdr(addr, &di) != 0 && di.dli_fname != nullptr) {
      auto off = static_cast<const char*>(addr) - static_cast<const char*>(di.dli_fbase);
      std::snprintf(line, sizeof line, "  %s %p %s+0x%tx (%s)\n", what, addr, di.dli_fname, off,
                    di.dli_sname != nullptr ? di.dli_sname : "?");
    } else {
      std::snprintf(line, sizeof line, "  %s %p\n", what, addr);
    }
    say(line);
  };
  std::snprintf(line, sizeof line, "computron: fatal signal %d (%s), address %p\n", sig,
                strsignal(sig), info != nullptr ? info->si_addr : nullptr);
  say(line);
#if defined(__x86_64__) && defined(__linux__)
  if (context != nullptr) {
    auto* uc = static_cast<ucontext_t*>(context);
    auto rip = reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]);
    auto* rsp = reinterpret_cast<void**>(uc->uc_mcontext.gregs[REG_RSP]);
    name("instruction", rip);
    // Words on the stack that point into loaded code are candidate return addresses.
    for (int i = 0; i < 64 && rsp != nullptr; ++i) {
      Dl_info di{};
      if (::dladdr(rsp[i], &di) != 0 && di.dli_fname != nullptr) name("stack word", rsp[i]);
    }
  }
#else
  (void)context;
#endif
  void* frames[64];
  int n = ::backtrace(frames, 64);
  say("backtrace:\n");
  ::backtrace_symbols_fd(frames, n, 2);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

void install_crash_report() {
  static std::vector<char> alt(1 << 16);
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  ::sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = report_crash;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) ::sigaction(sig, &sa, nullptr);
}

}  // namespace computron::app
