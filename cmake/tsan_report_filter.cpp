// Compiled into every executable of the ThreadSanitizer build (computron_options.cmake):
// drops the one kind of report that is provably inside CAF 0.17 and that no entry of
// cmake/tsan.supp can match without also hiding our own races.
//
// Debian's libcaf_core and libcaf_io are not built with -fsanitize=thread, so TSan does
// not see their synchronization. A message element CAF deserializes (a std::string made
// by uniform_type_info_map::make_value) and later reads on another of its threads shows
// as a race whose two access stacks hold only libstdc++ and the interceptor: TSan's
// stacks list instrumented frames only, and none of CAF's or ours is there (seen once in
// about six runs of cluster_tests under `scripts/tsan --servers`). A suppression entry
// matches frame names, and the only names on those stacks are libstdc++'s string
// functions, which our own code calls too.
//
// The test here is structural instead: a data race is dropped only when no frame of any
// access stack lies in this executable, which holds all of our (instrumented) code, and
// the memory is a heap block that CAF's libraries allocated. If our code made either
// access, TSan's stack has our frame and the report stands; scripts/tsan checks that with
// tsan_race_probe, a race of ours through the same libstdc++ calls on a string CAF allocated.
//
// The hook is TSan's weak __tsan::OnReport (libtsan exports it for this); it runs under
// TSan's report lock, so it reads the report through the public __tsan_get_report_*
// calls, compares addresses against ranges taken at start-up, and calls nothing that
// locks. Excluded from instrumentation (no_sanitize_thread): it runs inside the runtime.

#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
extern char __executable_start;
extern char etext;
int __tsan_get_report_data(void* report, const char** description, int* count, int* stack_count,
                           int* mop_count, int* loc_count, int* mutex_count, int* thread_count,
                           int* unique_tid_count, void** sleep_trace, std::uintptr_t trace_size);
int __tsan_get_report_mop(void* report, std::uintptr_t idx, int* tid, void** addr, int* size,
                          int* write, int* atomic, void** trace, std::uintptr_t trace_size);
int __tsan_get_report_loc(void* report, std::uintptr_t idx, const char** type, void** addr,
                          std::uintptr_t* start, std::uintptr_t* size, int* tid, int* fd,
                          int* suppressable, void** trace, std::uintptr_t trace_size);
}

namespace {

struct range {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
};

// The executable segments of libcaf_core and libcaf_io (a few each), filled before main.
constexpr int max_caf_ranges = 16;
range caf_ranges[max_caf_ranges];
int caf_range_count = 0;
// Written under TSan's report lock only; read at exit. The first dropped report's frames
// are kept so that the exit line shows what was dropped (symbolized then, outside TSan).
unsigned long dropped_reports = 0;
constexpr int kept_frames = 12;
void* first_frames[kept_frames] = {};
int first_frame_count = 0;

__attribute__((no_sanitize_thread)) void keep_frame(void* pc) {
  if (pc != nullptr && first_frame_count < kept_frames) first_frames[first_frame_count++] = pc;
}

__attribute__((no_sanitize_thread)) int note_caf(dl_phdr_info* info, size_t, void*) {
  if (info->dlpi_name == nullptr || std::strstr(info->dlpi_name, "libcaf_") == nullptr) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    if (caf_range_count == max_caf_ranges) return 1;
    auto begin = static_cast<std::uintptr_t>(info->dlpi_addr + ph.p_vaddr);
    caf_ranges[caf_range_count++] = {begin, begin + ph.p_memsz};
  }
  return 0;
}

__attribute__((no_sanitize_thread)) bool in_caf(void* pc) {
  auto a = reinterpret_cast<std::uintptr_t>(pc);
  for (int i = 0; i < caf_range_count; ++i)
    if (a >= caf_ranges[i].begin && a < caf_ranges[i].end) return true;
  return false;
}

__attribute__((no_sanitize_thread)) bool in_this_executable(void* pc) {
  auto a = reinterpret_cast<std::uintptr_t>(pc);
  return a >= reinterpret_cast<std::uintptr_t>(&__executable_start) &&
         a < reinterpret_cast<std::uintptr_t>(&etext);
}

__attribute__((no_sanitize_thread)) void say_dropped() {
  if (dropped_reports == 0) return;
  std::fprintf(stderr,
               "tsan filter: %lu data race report(s) dropped: both accesses inside "
               "uninstrumented libraries, on memory CAF allocated (cmake/tsan_report_filter.cpp); "
               "the first one's access and allocation frames:\n",
               dropped_reports);
  for (int i = 0; i < first_frame_count; ++i) {
    Dl_info info{};
    if (dladdr(first_frames[i], &info) != 0 && info.dli_fname != nullptr)
      std::fprintf(stderr, "  %s+%#lx %s\n", info.dli_fname,
                   static_cast<unsigned long>(reinterpret_cast<std::uintptr_t>(first_frames[i]) -
                                              reinterpret_cast<std::uintptr_t>(info.dli_fbase)),
                   info.dli_sname != nullptr ? info.dli_sname : "");
    else
      std::fprintf(stderr, "  %p\n", first_frames[i]);
  }
}

__attribute__((constructor, no_sanitize_thread)) void find_caf() {
  dl_iterate_phdr(note_caf, nullptr);
  std::atexit(say_dropped);
}

constexpr std::uintptr_t trace_size = 64;

__attribute__((no_sanitize_thread)) bool inside_caf(void* report, bool keep) {
  if (keep) first_frame_count = 0;
  const char* description = nullptr;
  int count = 0, stacks = 0, mops = 0, locs = 0, mutexes = 0, threads = 0, tids = 0;
  void* sleep[trace_size] = {};
  if (!__tsan_get_report_data(report, &description, &count, &stacks, &mops, &locs, &mutexes,
                              &threads, &tids, sleep, trace_size))
    return false;
  if (description == nullptr || std::strcmp(description, "data-race") != 0 || mops == 0)
    return false;
  for (int m = 0; m < mops; ++m) {
    int tid = 0, size = 0, write = 0, atomic = 0;
    void* addr = nullptr;
    void* trace[trace_size] = {};
    if (!__tsan_get_report_mop(report, m, &tid, &addr, &size, &write, &atomic, trace, trace_size))
      return false;
    for (auto* pc : trace)
      if (pc != nullptr && in_this_executable(pc)) return false;
    if (keep)
      for (int i = 0; i < 4; ++i) keep_frame(trace[i]);
  }
  for (int l = 0; l < locs; ++l) {
    const char* type = nullptr;
    void* addr = nullptr;
    std::uintptr_t start = 0, size = 0;
    int tid = 0, fd = 0, suppressable = 0;
    void* trace[trace_size] = {};
    if (!__tsan_get_report_loc(report, l, &type, &addr, &start, &size, &tid, &fd, &suppressable,
                               trace, trace_size))
      continue;
    if (type == nullptr || std::strcmp(type, "heap") != 0) continue;
    for (auto* pc : trace)
      if (pc != nullptr && in_caf(pc)) {
        if (keep)
          for (int i = 0; i < 4; ++i) keep_frame(trace[i]);
        return true;
      }
  }
  return false;
}

}  // namespace

namespace __tsan {
struct ReportDesc;
bool OnReport(const ReportDesc* rep, bool suppressed);

__attribute__((no_sanitize_thread)) bool OnReport(const ReportDesc* rep, bool suppressed) {
  if (suppressed) return true;
  if (!inside_caf(const_cast<ReportDesc*>(rep), dropped_reports == 0)) return false;
  ++dropped_reports;
  return true;
}
}  // namespace __tsan
