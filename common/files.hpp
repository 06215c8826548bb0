#pragma once

#include <string>

namespace computron {

/// Removes a file or a folder with everything in it (symbolic links are removed, never
/// followed); a path that does not exist is no error. Returns false, with the reason in
/// `why`, when something could not be removed.
///
/// Why not std::filesystem::remove_all: the torch 2.x wheels' libtorch.so exports copies
/// of libstdc++'s std::filesystem functions, an executable that links it binds to them,
/// and that remove_all calls through a null pointer (SIGSEGV on the H100 host with torch
/// 2.11). This one uses only libc (nftw).
bool remove_tree(const std::string& path, std::string* why = nullptr);

}  // namespace computron
