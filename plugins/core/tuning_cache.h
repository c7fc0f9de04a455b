// Kernel choices timed on this machine, kept across processes, for every adapter: one
// "device<TAB>problem<TAB>kernel" line per entry in $EPIFUSE_TUNING_CACHE (default
// ~/.cache/epifuse/tuning.tsv), later lines winning. Every process reads it; only a process run with
// EPIFUSE_TUNE=1 writes it, so a library that merely runs models leaves no files behind.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace epifuse {

std::string tuning_cache_path();

// EPIFUSE_TUNE set and neither "" nor "0".
bool tuning_enabled();

// "build <hash of the kernels' sources>", in every key: a kept choice holds only for the kernels it timed,
// and a kernel made faster in a later build must be timed again, not lose to its old self.
const std::string& kernels_build();

class TuningCache {
 public:
  static TuningCache& instance();

  // The kernel kept for `key`, "" when none; a miss reads the file again where it has grown since.
  std::string find(const std::string& key);

  // Keeps `kernel` for `key` in this process, and in the file where tuning is enabled (an unwritable
  // file only costs a new timing in the next process).
  void store(const std::string& key, const std::string& kernel);

 private:
  // Reads the file when its path is not the one read last (tests and tools point the variable elsewhere).
  void load();
  // Adds the file's entries to those of this process, later lines winning.
  void read_file();
  uintmax_t file_size() const;  // 0 when there is no file

  std::mutex mutex_;
  bool loaded_ = false;
  std::string loaded_path_;
  uintmax_t loaded_size_ = 0;  // the file's size when last read
  std::map<std::string, std::string> entries_;
};

}  // namespace epifuse
