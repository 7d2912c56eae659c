// Outputs all or nothing (OutputSet): staged on the target's file system, committed whole or
// rolled back whole, removed on a signal; and the output path checks made before a run.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "atomic_file.h"
#include "support/expect_error.h"
#include "thdcp/core/error.h"

namespace thdcp::tools {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

std::string temp_dir() {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("thdcp_atomic_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void put(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string get(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every file and directory under `root` (hidden ones too), with the files' contents.
std::map<std::string, std::string> tree(const fs::path& root) {
  std::map<std::string, std::string> entries;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string name = fs::relative(entry.path(), root).string();
    entries[name] = entry.is_directory() ? std::string("<dir>") : get(entry.path());
  }
  return entries;
}

// The rename of the commit, failing at call number g_fail_at (1-based; 0: never).
int g_calls = 0;
int g_fail_at = 0;
int failing_rename(const char* from, const char* to) {
  if (++g_calls == g_fail_at) {
    errno = EIO;
    return -1;
  }
  return std::rename(from, to);
}

// Three outputs: an existing directory that gets one file replaced and one added, a new
// directory, and an existing file.
void stage_three(OutputSet& out, const fs::path& root) {
  out.stage_dir((root / "existing").string(), [](const std::string& tmp) {
    put(fs::path(tmp) / "a.npy", "new a");
    put(fs::path(tmp) / "b.npy", "new b");
  });
  out.stage_dir((root / "fresh").string(), [](const std::string& tmp) { put(fs::path(tmp) / "c.npy", "new c"); });
  out.stage_file((root / "run.json").string(), "new json");
}

TEST(OutputSet, ARenameThatFailsAnywhereLeavesEveryTargetAsItWas) {
  const fs::path root = temp_dir();
  fs::create_directory(root / "existing");
  put(root / "existing" / "a.npy", "old a");
  put(root / "existing" / "other.txt", "not ours");
  put(root / "run.json", "old json");
  const auto before = tree(root);
  // Two files set aside (a.npy, run.json), then four renames into place: six in all.
  for (int fail_at = 1; fail_at <= 6; ++fail_at) {
    SCOPED_TRACE("the rename that fails: " + std::to_string(fail_at));
    g_calls = 0;
    g_fail_at = fail_at;
    set_commit_rename_for_tests(failing_rename);
    {
      OutputSet out;
      stage_three(out, root);
      expect_error([&] { out.commit(); }, {"no output was written, every target is as it was"});
    }
    set_commit_rename_for_tests(nullptr);
    EXPECT_EQ(tree(root), before);
  }
  g_calls = 0;
  g_fail_at = 0;
  set_commit_rename_for_tests(failing_rename);
  {
    OutputSet out;
    stage_three(out, root);
    out.commit();
  }
  set_commit_rename_for_tests(nullptr);
  EXPECT_EQ(g_calls, 6);
  const std::map<std::string, std::string> after = {
      {"existing", "<dir>"},     {"existing/a.npy", "new a"}, {"existing/b.npy", "new b"},
      {"existing/other.txt", "not ours"}, {"fresh", "<dir>"},  {"fresh/c.npy", "new c"},
      {"run.json", "new json"}};
  EXPECT_EQ(tree(root), after);
}

TEST(OutputSet, ATargetChangedDuringTheRunCommitsNothing) {
  const fs::path root = temp_dir();
  fs::create_directory(root / "existing");
  {
    OutputSet out;
    stage_three(out, root);
    fs::create_directory(root / "run.json");  // the file's place, taken meanwhile
    expect_error([&] { out.commit(); }, {"run.json'", "changed during the run", "nothing was written"});
  }
  EXPECT_EQ(tree(root), (std::map<std::string, std::string>{{"existing", "<dir>"}, {"run.json", "<dir>"}}));
  {
    OutputSet out;
    out.stage_dir((root / "fresh").string(), [](const std::string& tmp) { put(fs::path(tmp) / "c.npy", "c"); });
    fs::create_directory(root / "fresh");  // created by someone else meanwhile
    expect_error([&] { out.commit(); }, {"fresh'", "appeared during the run", "nothing was written"});
  }
  EXPECT_TRUE(fs::is_empty(root / "fresh"));
}

TEST(OutputSet, StagesInsideAnExistingDirectoryAndBesideANewOne) {
  const fs::path root = temp_dir();
  fs::create_directory(root / "existing");
  std::string staged_existing, staged_new;
  OutputSet out;
  out.stage_dir((root / "existing").string() + "/", [&](const std::string& tmp) {
    staged_existing = tmp;
    put(fs::path(tmp) / "a.npy", "a");
  });
  out.stage_dir((root / "new").string() + "//", [&](const std::string& tmp) {
    staged_new = tmp;
    put(fs::path(tmp) / "b.npy", "b");
  });
  // On the file system of the directory that receives the files: inside it when it exists
  // (it may be a mount point or a link elsewhere), beside it when it is created.
  EXPECT_EQ(fs::path(staged_existing).parent_path(), root / "existing");
  EXPECT_EQ(fs::path(staged_new).parent_path(), root);
  out.commit();
  EXPECT_EQ(get(root / "existing" / "a.npy"), "a");
  EXPECT_EQ(get(root / "new" / "b.npy"), "b");
  EXPECT_FALSE(fs::exists(staged_existing));
  EXPECT_FALSE(fs::exists(staged_new));
}

TEST(OutputSet, SavesThroughALinkToAnotherFileSystem) {
  struct stat shm {}, here {};
  const fs::path root = temp_dir();
  if (stat("/dev/shm", &shm) != 0 || access("/dev/shm", W_OK) != 0 || stat(root.c_str(), &here) != 0 ||
      shm.st_dev == here.st_dev) {
    GTEST_SKIP() << "needs a writable /dev/shm on another file system than " << root;
  }
  const fs::path target = fs::path("/dev/shm") / ("thdcp_atomic_" + std::to_string(getpid()));
  fs::remove_all(target);
  fs::create_directory(target);
  fs::create_directory_symlink(target, root / "link");
  put(target / "run.json", "old");
  fs::create_symlink(target / "run.json", root / "run.json");
  {
    OutputSet out;
    out.stage_dir((root / "link").string(), [](const std::string& tmp) { put(fs::path(tmp) / "a.npy", "a"); });
    out.stage_dir((root / "link" / "new").string(), [](const std::string& tmp) { put(fs::path(tmp) / "b.npy", "b"); });
    out.stage_file((root / "run.json").string(), "new");
    out.commit();
  }
  EXPECT_EQ(get(target / "a.npy"), "a");
  EXPECT_EQ(get(target / "new" / "b.npy"), "b");
  EXPECT_TRUE(fs::is_symlink(root / "run.json"));  // the link is kept, its file replaced
  EXPECT_EQ(get(target / "run.json"), "new");
  EXPECT_EQ(tree(target).size(), 4u);  // a.npy, new/, new/b.npy, run.json: no temporaries
  fs::remove_all(target);
}

TEST(OutputSetDeathTest, ASignalWhileStagedRemovesEverythingAndEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const fs::path root = temp_dir();
  fs::create_directory(root / "existing");
  put(root / "existing" / "a.npy", "old a");
  const auto before = tree(root);
  for (int signal : {SIGINT, SIGTERM}) {
    EXPECT_EXIT(
        {
          OutputSet out;
          stage_three(out, root);
          std::raise(signal);  // noted only: the process goes on to the commit, which refuses
          out.commit();
          std::fprintf(stderr, "committed despite the signal\n");
        },
        ::testing::KilledBySignal(signal), "");
    EXPECT_EQ(tree(root), before);
  }
}

TEST(OutputSet, AnIgnoredSignalStaysIgnored) {
  struct sigaction ignore {}, previous {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ASSERT_EQ(sigaction(SIGTERM, &ignore, &previous), 0);
  {
    SignalGuard guard;
    std::raise(SIGTERM);
    throw_if_interrupted();  // nothing noted
  }
  struct sigaction now {};
  sigaction(SIGTERM, &previous, &now);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
}

TEST(OutputPaths, ATrailingSlashNamesTheDirectoryAndItsRealParent) {
  const fs::path root = temp_dir();
  check_output_dir("save", (root / "new").string() + "/", {"a.npy"});
  expect_error([&] { check_output_dir("save", (root / "missing" / "new").string() + "/", {"a.npy"}); },
               {"--save '", "/new/': its parent '", "/missing' does not exist"});
  expect_error([&] { check_output_file("json", (root / "run.json").string() + "/"); },
               {"ends in '/', which names a directory: give a file name"});
}

TEST(OutputPaths, ALinkToNothingIsRefused) {
  const fs::path root = temp_dir();
  fs::create_symlink(root / "nowhere", root / "link");
  expect_error([&] { check_output_dir("save", (root / "link").string(), {"a.npy"}); },
               {"link': is a symbolic link to '", "nowhere', which does not exist"});
  expect_error([&] { check_output_file("json", (root / "link").string()); },
               {"link': is a symbolic link to '", "nowhere', which does not exist"});
}

TEST(OutputPaths, OutputsOverlapThroughALink) {
  const fs::path root = temp_dir();
  fs::create_directory(root / "saved");
  fs::create_directory_symlink(root / "saved", root / "link");
  expect_error([&] { check_distinct_outputs({{"save", (root / "saved").string()}, {"json", (root / "link" / "r.json").string()}}); },
               {"--save '", "and --json '", "overlap"});
  check_distinct_outputs({{"save", (root / "saved").string()}, {"json", (root / "r.json").string()}});
}

}  // namespace
}  // namespace thdcp::tools
