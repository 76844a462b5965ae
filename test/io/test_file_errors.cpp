// Errors of the file system: system_call's errno (core/error.hpp), and
// checkpoint destinations a save could not replace (chattr +i, +a), refused
// before any training.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "support/temp_dir.hpp"
#include "support/errors.hpp"
#include "xfmr/core/error.hpp"
#include "xfmr/io/checkpoint.hpp"
#include "xfmr/train/run.hpp"

BOOST_AUTO_TEST_SUITE(test_file_errors)

using xfmr::test::TempDir;

using namespace xfmr;
namespace fs = std::filesystem;

namespace {

// A directory's chattr flags, set for the test's life and cleared after
// (an immutable directory cannot be removed). `set` is false where the file
// system or the user may not set them (tmpfs, no CAP_LINUX_IMMUTABLE).
struct DirectoryFlags {
  fs::path path;
  bool set = false;
  DirectoryFlags(fs::path p, int flags) : path(std::move(p)) { set = apply(flags); }
  ~DirectoryFlags() {
    if (set) apply(0);
  }
  bool apply(int flags) const {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = ::ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
    ::close(fd);
    return ok;
  }
};

// Whether f throws an xfmr::Error whose message holds `part`.
bool fails_with(const std::function<void()>& f, const std::string& part) {
  const std::string message = test::error_of(f);
  if (message.find(part) == std::string::npos) {
    BOOST_TEST_MESSAGE("message: '" << message << "', expected it to hold '" << part << "'");
    return false;
  }
  return true;
}

void make_checkpoint_files(const fs::path& dir) {
  fs::create_directories(dir);
  std::ofstream(dir / kModelFile) << "x";
  std::ofstream(dir / kTrainerStateFile) << "{}";
}

}  // namespace

BOOST_AUTO_TEST_CASE(system_call_names_the_errno_of_the_call) {
  BOOST_TEST(system_call([] { return 3; }, "never shown") == 3);
  // The parts are built before the call; a part whose making changed errno
  // (a std::string's allocation may) cannot reach the message.
  BOOST_TEST(fails_with([] { system_call([] { errno = EACCES; return -1; }, "open ", std::string(64, 'x'), " here"); },
               std::string("open ") + std::string(64, 'x') + " here: " + std::strerror(EACCES)));
  BOOST_TEST(fails_with([] { system_call([]() -> char* { errno = ENOENT; return nullptr; }, "mkdtemp"); },
               std::string("mkdtemp: ") + std::strerror(ENOENT)));
}

BOOST_AUTO_TEST_CASE(an_unwritable_directory_says_why) {
  TempDir t;
  DirectoryFlags fixed(t.path, FS_IMMUTABLE_FL);
  if (!fixed.set) {
    BOOST_TEST_MESSAGE("chattr +i is not available here (file system or capability): case skipped");
    return;
  }
  // access(W_OK) on an immutable directory fails with EPERM, even for root.
  BOOST_TEST(fails_with([&] { check_writable_directory("--metrics-json", t.path / "m.json", false); },
               "--metrics-json " + (t.path / "m.json").string() + ": cannot write in " + t.path.string() + ": " +
                   std::strerror(EPERM)));
}

BOOST_AUTO_TEST_CASE(a_checkpoint_that_cannot_be_swapped_is_refused_before_training) {
  TempDir t;
  const fs::path ck = t.path / "ck";
  make_checkpoint_files(ck);
  check_checkpoint_destination(ck);  // a plain checkpoint: replaceable
  {
    DirectoryFlags fixed(ck, FS_IMMUTABLE_FL);
    if (!fixed.set) {
      BOOST_TEST_MESSAGE("chattr +i is not available here (file system or capability): case skipped");
      return;
    }
    BOOST_TEST(fails_with([&] { check_checkpoint_destination(ck); }, "the directory is immutable (chattr +i)"));
  }
  {
    DirectoryFlags fixed(ck, FS_APPEND_FL);
    BOOST_REQUIRE(fixed.set);
    BOOST_TEST(fails_with([&] { check_checkpoint_destination(ck); }, "the directory is append-only (chattr +a)"));
  }
  {
    // An append-only parent lets a save create its new directory, and then
    // refuses the rename: found now too, for a new --out as for an old one.
    DirectoryFlags fixed(t.path, FS_APPEND_FL);
    BOOST_REQUIRE(fixed.set);
    BOOST_TEST(fails_with([&] { check_checkpoint_destination(t.path / "new"); },
                 "its parent " + t.path.string() + " is append-only (chattr +a)"));
  }
  check_checkpoint_destination(ck);  // flags cleared: replaceable again
}

BOOST_AUTO_TEST_SUITE_END()
