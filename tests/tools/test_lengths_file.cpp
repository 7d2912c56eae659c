// Readers of lengths files and batches files: accepted syntax, and messages for bad lines.
#include <gtest/gtest.h>

#include <fstream>

#include "support/expect_error.h"
#include "thdcp/core/error.h"
#include "thdcp/plan/planner.h"

namespace thdcp {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/thdcp_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

using test::expect_error;

TEST(LengthsFile, ReadsLengthsCommentsAndBlankLines) {
  const std::string path = write_temp("lengths_ok.txt", "# header\n12\n\n  7  # trailing comment\r\n+3\n\t\n1024\n");
  const DocumentLengths d = read_lengths_file(path);
  EXPECT_EQ(d.source, path);
  EXPECT_EQ(d.lengths, (std::vector<int64_t>{12, 7, 3, 1024}));
  EXPECT_EQ(d.lines, (std::vector<int64_t>{2, 4, 5, 7}));
}

TEST(LengthsFile, RejectsBadLinesNamingFileLineAndText) {
  expect_error([] { read_lengths_file("/nonexistent/lengths.txt"); }, {"/nonexistent/lengths.txt", "cannot open"});
  const struct {
    const char* text;
    std::vector<std::string> parts;
  } cases[] = {
      {"5\n-3\n", {":2:", "'-3' is negative"}},
      {"5\n\n12x\n", {":3:", "'12x' is not a document length"}},
      {"0\n", {":1:", "'0' is a zero-length document"}},
      {"4 5\n", {":1:", "'4 5' holds more than one value", "batches file"}},
      {"99999999999\n", {":1:", "'99999999999'", "2^31-1"}},
      {"# only comments\n\n", {"no document lengths"}},
      {"1.5\n", {":1:", "'1.5' is not a document length"}},
  };
  int index = 0;
  for (const auto& c : cases) {
    const std::string path = write_temp("lengths_bad" + std::to_string(index++) + ".txt", c.text);
    std::vector<std::string> parts = c.parts;
    parts.push_back(path);
    expect_error([&] { read_lengths_file(path); }, parts);
  }
}

TEST(BatchesFile, ReadsSpacesCommasAndComments) {
  const std::string path = write_temp("batches_ok.txt", "# batches\n1 2 3\n\n4,5, 6\n7\t8 # comment\n 9 , 10 \r\n");
  const DocumentBatches b = read_batches_file(path);
  EXPECT_EQ(b.batches, (std::vector<std::vector<int64_t>>{{1, 2, 3}, {4, 5, 6}, {7, 8}, {9, 10}}));
  EXPECT_EQ(b.lines, (std::vector<int64_t>{2, 4, 5, 6}));
}

TEST(BatchesFile, RejectsBadFields) {
  const struct {
    const char* text;
    std::vector<std::string> parts;
  } cases[] = {
      {"1 2\n3,,4\n", {":2:", "empty field"}},
      {"1,\n", {":1:", "empty field"}},
      {", 1\n", {":1:", "empty field"}},
      {"1 a 2\n", {":1:", "'a' is not a document length"}},
      {"1 -2\n", {":1:", "'-2' is negative"}},
      {"3 0\n", {":1:", "zero-length"}},
      {"\n# nothing\n", {"no batches found"}},
  };
  int index = 0;
  for (const auto& c : cases) {
    const std::string path = write_temp("batches_bad" + std::to_string(index++) + ".txt", c.text);
    expect_error([&] { read_batches_file(path); }, c.parts);
  }
}

}  // namespace
}  // namespace thdcp
