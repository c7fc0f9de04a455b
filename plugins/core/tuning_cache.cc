#include "tuning_cache.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace epifuse {

std::string tuning_cache_path() {
  if (const char* p = std::getenv("EPIFUSE_TUNING_CACHE")) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/epifuse/tuning.tsv";
}

bool tuning_enabled() {
  const char* v = std::getenv("EPIFUSE_TUNE");
  return v && std::string(v) != "0" && std::string(v) != "";
}

#ifndef EPIFUSE_KERNELS_ID
#define EPIFUSE_KERNELS_ID "unknown"  // a build outside plugins/core/CMakeLists.txt
#endif

const std::string& kernels_build() {
  static const std::string build = std::string("build ") + EPIFUSE_KERNELS_ID;
  return build;
}

TuningCache& TuningCache::instance() {
  static TuningCache cache;
  return cache;
}

std::string TuningCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  load();
  auto it = entries_.find(key);
  if (it == entries_.end() && file_size() != loaded_size_) {  // another process (a measuring one) added lines
    read_file();
    it = entries_.find(key);
  }
  return it == entries_.end() ? std::string() : it->second;
}

void TuningCache::store(const std::string& key, const std::string& kernel) {
  std::lock_guard<std::mutex> lock(mutex_);
  load();
  entries_[key] = kernel;
  if (!tuning_enabled()) return;
  const std::filesystem::path path = loaded_path_;
  std::error_code ignored;
  std::filesystem::create_directories(path.parent_path(), ignored);
  std::ofstream(path, std::ios::app) << key << '\t' << kernel << '\n';  // one write: appends interleave by line
}

void TuningCache::load() {
  const std::string path = tuning_cache_path();
  if (loaded_ && path == loaded_path_) return;
  loaded_ = true;
  loaded_path_ = path;
  entries_.clear();
  read_file();
}

uintmax_t TuningCache::file_size() const {
  std::error_code missing;
  const uintmax_t size = std::filesystem::file_size(loaded_path_, missing);
  return missing ? 0 : size;
}

void TuningCache::read_file() {
  loaded_size_ = file_size();
  std::ifstream in(loaded_path_);
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.rfind('\t');
    if (tab != std::string::npos) entries_[line.substr(0, tab)] = line.substr(tab + 1);
  }
}

}  // namespace epifuse
